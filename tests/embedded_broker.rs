//! The embedded broker carries QoS 1 messages end to end on loopback.

mod support;

use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_broker_round_trips_qos1() {
    let port = support::free_port();
    let broker = geogate::broker::start(port).expect("broker starts");
    assert!(broker.addr.ip().is_loopback());

    let mut options = MqttOptions::new("roundtrip", "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(options, 100);
    client.subscribe("fleet/#", QoS::AtLeastOnce).await.unwrap();
    let received = tokio::time::timeout(Duration::from_secs(20), async {
        let mut published = false;
        loop {
            match events.poll().await.expect("poll") {
                Event::Incoming(Packet::SubAck(_)) if !published => {
                    for i in 0..10 {
                        client
                            .publish(
                                format!("fleet/v{i}/telemetry"),
                                QoS::AtLeastOnce,
                                false,
                                format!("{i}"),
                            )
                            .await
                            .unwrap();
                    }
                    published = true;
                }
                Event::Incoming(Packet::Publish(p)) => return p,
                _ => {}
            }
        }
    })
    .await
    .expect("a message within 20 s");
    assert_eq!(received.topic, "fleet/v0/telemetry");
    assert_eq!(&received.payload[..], b"0");
    assert_eq!(received.qos, QoS::AtLeastOnce);
}
