//! The fleet both partition spikes publish: vehicles over MQTT (QoS 1,
//! rumqttc), even ones on native topics and odd ones on OwnTracks topics,
//! from 8 clients, each vehicle always from the same client, its fixes one
//! after another. Included by each spike (`#[path]`).

use std::time::{Duration, Instant};

pub type Error = Box<dyn std::error::Error + Send + Sync>;

pub fn topic(v: u32) -> String {
    if v % 2 == 0 {
        format!("fleet/v{v}/telemetry")
    } else {
        format!("owntracks/fleet{}/v{v}", v % 3)
    }
}

/// Publishes every fix and waits for every PUBACK: fixes per second.
pub async fn publish(
    port: u16,
    credentials: Option<(&'static str, &'static str)>,
    vehicles: u32,
    fixes: u32,
) -> Result<f64, Error> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..8u32 {
        tasks.push(tokio::spawn(async move {
            let mut options =
                rumqttc::MqttOptions::new(format!("spike-pub-{c}"), "127.0.0.1", port);
            options.set_keep_alive(Duration::from_secs(30));
            options.set_inflight(100);
            if let Some((user, password)) = credentials {
                options.set_credentials(user, password);
            }
            let (client, mut events) = rumqttc::AsyncClient::new(options, 1000);
            let mine: Vec<u32> = (0..vehicles).filter(|v| v % 8 == c).collect();
            let total = mine.len() as u64 * u64::from(fixes);
            let sender = tokio::spawn(async move {
                for k in 0..fixes {
                    for &v in &mine {
                        let body = format!(r#"{{"vehicle":"v{v}","k":{k}}}"#);
                        client
                            .publish(topic(v), rumqttc::QoS::AtLeastOnce, false, body)
                            .await
                            .expect("queued");
                    }
                }
                client
            });
            let mut acked = 0u64;
            while acked < total {
                match events.poll().await {
                    Ok(rumqttc::Event::Incoming(rumqttc::Packet::PubAck(_))) => acked += 1,
                    Ok(_) => {}
                    Err(e) => panic!("mqtt: {e}"),
                }
            }
            let _client = sender.await.expect("sender");
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(f64::from(vehicles * fixes) / started.elapsed().as_secs_f64())
}

/// The vehicle and fix number in a payload.
pub fn fix_of(payload: &[u8]) -> Option<(String, u64)> {
    let v: serde_json::Value = serde_json::from_slice(payload).ok()?;
    Some((v["vehicle"].as_str()?.to_owned(), v["k"].as_u64()?))
}

/// Checks each vehicle's fixes as a partition hands them over: counts
/// fixes out of publish order, and vehicles seen in more than one
/// partition.
#[derive(Default)]
pub struct OrderCheck {
    pub partition_of: std::collections::HashMap<String, u32>,
    last: std::collections::HashMap<String, u64>,
    pub out_of_order: u64,
    pub split: u64,
}

impl OrderCheck {
    pub fn see(&mut self, partition: u32, payload: &[u8]) -> Result<(), Error> {
        let (vehicle, k) = fix_of(payload).ok_or("undecodable payload")?;
        if *self
            .partition_of
            .entry(vehicle.clone())
            .or_insert(partition)
            != partition
        {
            self.split += 1;
        }
        if let Some(&before) = self.last.get(&vehicle)
            && k <= before
        {
            self.out_of_order += 1;
        }
        self.last.insert(vehicle, k);
        Ok(())
    }
}
