//! A minimal reproduction of the rumqttc 0.25.1 behaviour behind
//! `broker_restarts_lose_no_high_event` failing about one run in 30.
//!
//! `EventLoop::poll` reads packets in bunches (`Network::readb`). When the
//! socket fails part-way through a bunch, the publishes already read stay
//! in `state.events`, `poll` returns the error, and after the reconnect
//! they come out *after the new CONNACK*, looking like publishes of the new
//! connection. Acked there, their packet ids name other messages on the new
//! session: the broker drops a message geogate has not read yet, and if
//! the connection dies again before it is read, it is lost.
//!
//! geogate's workaround (`source::mqtt::poll`): drain `state.events` at the
//! failure and treat what is there as the dead connection's. This test
//! pins the dependency's behaviour, so an upgrade that fixes it fails here
//! and says the workaround can go.

use rumqttc::{AsyncClient, Event, MqttOptions, Packet};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A QoS 1 PUBLISH (short enough for a one-byte remaining length).
fn publish(pkid: u16, topic: &str, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(topic.len() as u16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&pkid.to_be_bytes());
    body.extend_from_slice(payload);
    let mut packet = vec![0x32, body.len() as u8];
    packet.extend(body);
    packet
}

/// Takes the client's CONNECT and answers CONNACK (new session).
async fn accept(listener: &TcpListener) -> TcpStream {
    let (mut stream, _) = listener.accept().await.expect("accept");
    let mut connect = [0u8; 256];
    let n = stream.read(&mut connect).await.expect("read CONNECT");
    assert_eq!(connect[0] >> 4, 1, "CONNECT first ({n} bytes)");
    stream.write_all(&[0x20, 2, 0, 0]).await.expect("CONNACK");
    stream
}

#[tokio::test]
async fn publishes_read_before_a_failed_read_come_out_after_the_next_connack() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let broker = tokio::spawn(async move {
        // Connection 1: two publishes and the close in one write, so the
        // client reads both and the end of the stream in one bunch.
        let mut first = accept(&listener).await;
        let mut bunch = publish(7, "t", b"old-7");
        bunch.extend(publish(8, "t", b"old-8"));
        first.write_all(&bunch).await.expect("publishes");
        drop(first);
        // Connection 2: a new session that sends nothing.
        let _second = accept(&listener).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
    });

    let mut options = MqttOptions::new("repro", "127.0.0.1", port);
    options.set_manual_acks(true).set_clean_session(true);
    let (_client, mut eventloop) = AsyncClient::new(options, 10);
    let mut connacks = 0;
    let mut after_second_connack = Vec::new();
    let run = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => connacks += 1,
                Ok(Event::Incoming(Packet::Publish(p))) if connacks == 2 => {
                    after_second_connack.push(p.pkid);
                    if after_second_connack.len() == 2 {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => {}
            }
        }
    };
    // Bounded: if rumqttc stops doing this, nothing comes after the second
    // CONNACK and the assertion below says so.
    let _ = tokio::time::timeout(Duration::from_secs(3), run).await;
    broker.abort();
    assert_eq!(connacks, 2, "the client reconnected");
    assert!(
        !after_second_connack.is_empty(),
        "rumqttc no longer hands out a dead connection's publishes after the next CONNACK: the workaround in source::mqtt::poll can go"
    );
    assert!(after_second_connack.iter().all(|&id| id == 7 || id == 8));
}
