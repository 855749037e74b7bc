//! The RabbitMQ side of decision 0025: devices publish over MQTT (QoS 1)
//! to the MQTT plugin; `amq.topic` feeds a consistent-hash exchange that
//! spreads vehicles over one quorum queue per partition, each with a single
//! active consumer. Measures whether each vehicle stays in one queue in
//! publish order, the read rate, and what a second consumer sees.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicQosOptions, ExchangeBindOptions,
    ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use std::time::{Duration, Instant};

#[path = "../../common/fleet.rs"]
mod fleet;
use fleet::{Error, OrderCheck};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize, d: u32| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (amqp, mqtt, partitions, vehicles, fixes) = (
        num(1, 5672),
        num(2, 1883) as u16,
        num(3, 8),
        num(4, 200),
        num(5, 100),
    );
    let conn = Connection::connect(
        &format!("amqp://guest:guest@127.0.0.1:{amqp}/%2f"),
        ConnectionProperties::default(),
    )
    .await?;
    let channel = conn.create_channel().await?;
    channel
        .exchange_declare(
            "geo",
            ExchangeKind::Custom("x-consistent-hash".into()),
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .exchange_bind(
            "geo",
            "amq.topic",
            "#",
            ExchangeBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    for p in 0..partitions {
        let q = format!("part.{p}");
        let _ = channel
            .queue_delete(&q, QueueDeleteOptions::default())
            .await;
        let channel = conn.create_channel().await?;
        channel
            .queue_declare(
                &q,
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args.clone(),
            )
            .await?;
        channel
            .queue_bind(
                &q,
                "geo",
                "1",
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
    }

    let published = fleet::publish(mqtt, Some(("guest", "guest")), vehicles, fixes).await?;
    let want = u64::from(vehicles * fixes);
    println!("published over MQTT (QoS 1, 8 clients): {want} fixes at {published:.0}/s");

    let started = Instant::now();
    let mut check = OrderCheck::default();
    let (mut read, mut sizes) = (0u64, Vec::new());
    for p in 0..partitions {
        let q = format!("part.{p}");
        let channel = conn.create_channel().await?;
        let count = channel
            .queue_declare(
                &q,
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?
            .message_count();
        channel.basic_qos(1000, BasicQosOptions::default()).await?;
        let mut consumer = channel
            .basic_consume(
                &q,
                "reader",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        // A second consumer on the queue: with a single active consumer
        // it gets nothing while the first is there.
        let second_channel = conn.create_channel().await?;
        let mut second = second_channel
            .basic_consume(
                &q,
                "standby",
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let mut n = 0u64;
        while n < u64::from(count) {
            let Some(delivery) = consumer.next().await else {
                break;
            };
            let delivery = delivery?;
            n += 1;
            check.see(p, &delivery.data)?;
            if n % 500 == 0 || n == u64::from(count) {
                delivery
                    .acker
                    .ack(BasicAckOptions { multiple: true })
                    .await?;
            }
        }
        let standby_got = tokio::time::timeout(Duration::from_millis(50), second.next())
            .await
            .is_ok();
        if standby_got {
            println!(
                "partition {p}: the standby consumer got a message while the first was active"
            );
        }
        read += n;
        sizes.push(n);
        drop(second);
        second_channel.close(200, "done").await?;
        channel.close(200, "done").await?;
    }
    println!(
        "read {read} of {want} from {partitions} quorum queues (sizes {sizes:?}) at {:.0}/s, one consumer at a time, prefetch 1000; out of order {}, vehicles in more than one queue {}",
        read as f64 / started.elapsed().as_secs_f64(),
        check.out_of_order,
        check.split
    );
    Ok(())
}
