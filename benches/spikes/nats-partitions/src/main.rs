//! The spike behind decision 0025: can NATS be the ordered, partitioned
//! input and the fenced per-partition commit log of a scaled-out geogate?
//!
//! Run by `run.sh`, which starts a nats-server with JetStream, MQTT and the
//! partition mapping. Measures, against that real server:
//! 1. devices publishing over MQTT (QoS 1, rumqttc, both topic shapes):
//!    does each vehicle land in one partition, in publish order?
//! 2. reading a partition with a JetStream pull consumer: fixes/s;
//! 3. a commit per batch to `commit.<p>` with an expected last subject
//!    sequence: commits/s and latency, and whether a deposed owner's commit
//!    (a stale expected sequence) is refused;
//! 4. a lease taken over by compare-and-set: the old owner's renewal refused.

use async_nats::jetstream::{self, consumer::pull, context::PublishErrorKind, stream};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

#[path = "../../common/fleet.rs"]
mod fleet;
use fleet::{Error, OrderCheck};

struct Args {
    nats: String,
    mqtt_port: u16,
    partitions: u32,
    vehicles: u32,
    fixes: u32,
}

fn args() -> Args {
    let a: Vec<String> = std::env::args().collect();
    let num = |i: usize, default: u32| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(default);
    Args {
        nats: a.get(1).cloned().unwrap_or_else(|| "127.0.0.1:4222".into()),
        mqtt_port: num(2, 1883) as u16,
        partitions: num(3, 8),
        vehicles: num(4, 200),
        fixes: num(5, 100),
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = args();
    let client = async_nats::connect(&args.nats).await?;
    let js = jetstream::new(client);
    // One stream for every partition, each read through a subject filter;
    // or (SPIKE_LAYOUT=streams) a stream per partition, read whole.
    let per_partition = std::env::var("SPIKE_LAYOUT").is_ok_and(|l| l == "streams");
    let layout: Vec<(String, String)> = if per_partition {
        (0..args.partitions)
            .map(|p| (format!("IN_{p}"), format!("in.{p}.>")))
            .collect()
    } else {
        vec![("IN".into(), "in.>".into())]
    };
    for (name, _) in &layout {
        let _ = js.delete_stream(name).await;
    }
    let _ = js.delete_stream("COMMITS").await;
    for (name, subject) in &layout {
        js.create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject.clone()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    }

    // 1. Publish over MQTT.
    let published_per_s = fleet::publish(args.mqtt_port, None, args.vehicles, args.fixes).await?;
    let want = u64::from(args.vehicles * args.fixes);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut stored = 0;
        for (name, _) in &layout {
            stored += js.get_stream(name).await?.info().await?.state.messages;
        }
        if stored >= want {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the streams hold {stored} of {want}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("published over MQTT (QoS 1, 8 clients): {want} fixes at {published_per_s:.0}/s");

    // 2. Read each partition; check order and that a vehicle stays in one.
    let started = Instant::now();
    let mut check = OrderCheck::default();
    let (mut read, mut sizes) = (0u64, Vec::new());
    for p in 0..args.partitions {
        let (input, filter) = if per_partition {
            (format!("IN_{p}"), String::new())
        } else {
            ("IN".to_owned(), format!("in.{p}.>"))
        };
        let consumer = js
            .get_stream(&input)
            .await?
            .create_consumer(pull::Config {
                filter_subject: filter,
                ack_policy: jetstream::consumer::AckPolicy::None,
                ..Default::default()
            })
            .await?;
        let mut n = 0u64;
        loop {
            let mut batch = consumer
                .fetch()
                .max_messages(1000)
                .expires(Duration::from_secs(1))
                .messages()
                .await?;
            let mut got = 0;
            while let Some(message) = batch.next().await {
                let message = message?;
                got += 1;
                check.see(p, &message.payload)?;
            }
            n += got;
            if std::env::var_os("SPIKE_TRACE").is_some() {
                eprintln!("partition {p}: fetched {got} by {:?}", started.elapsed());
            }
            if got == 0 || consumer.clone().info().await?.num_pending == 0 {
                break;
            }
        }
        read += n;
        sizes.push(n);
    }
    let read_s = started.elapsed().as_secs_f64();
    println!(
        "read {read} of {want} from {} partitions ({}; sizes {sizes:?}) at {:.0}/s, one pull consumer at a time; out of order {}, vehicles in more than one partition {}",
        args.partitions,
        if per_partition {
            "a stream each"
        } else {
            "one stream, a subject filter each"
        },
        read as f64 / read_s,
        check.out_of_order,
        check.split
    );

    // 3. The commit log: one subject per partition, each commit expecting
    // the last one the owner wrote.
    let commits = js
        .create_stream(stream::Config {
            name: "COMMITS".into(),
            subjects: vec!["commit.>".into()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await?;
    drop(commits);
    let body = bytes::Bytes::from(vec![b'x'; 2048]);
    let mut latencies = Vec::new();
    let mut last_seq = 0u64;
    let rounds = 2000;
    let started = Instant::now();
    for _ in 0..rounds {
        let t = Instant::now();
        let ack = js
            .send_publish(
                "commit.0",
                jetstream::message::PublishMessage::build()
                    .payload(body.clone())
                    .expected_last_subject_sequence(last_seq),
            )
            .await?
            .await?;
        latencies.push(t.elapsed());
        last_seq = ack.sequence;
    }
    let commits_per_s = f64::from(rounds) / started.elapsed().as_secs_f64();
    latencies.sort();
    let pct = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
    println!(
        "commits of 2 KiB, one at a time, each expecting the last: {commits_per_s:.0}/s, latency p50 {:.0} µs p99 {:.0} µs",
        pct(0.5),
        pct(0.99)
    );
    // The deposed owner still believes an older commit is the last.
    let stale = js
        .send_publish(
            "commit.0",
            jetstream::message::PublishMessage::build()
                .payload(body.clone())
                .expected_last_subject_sequence(last_seq - 1),
        )
        .await?
        .await;
    match stale {
        Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
            println!("a commit expecting a stale last sequence: refused ({e})")
        }
        other => return Err(format!("a stale commit was not refused: {other:?}").into()),
    }

    // 4. A lease per partition as the last message on `lease.<p>`, taken
    // and renewed by compare-and-set on its subject sequence (what a KV
    // bucket is underneath; async-nats 0.49's KV API fails on a 2.9 server,
    // whose account info it cannot read).
    let take = |expected: u64, who: &'static str| {
        let js = js.clone();
        async move {
            js.send_publish(
                "commit.lease.0",
                jetstream::message::PublishMessage::build()
                    .payload(who.into())
                    .expected_last_subject_sequence(expected),
            )
            .await?
            .await
            .map(|ack| ack.sequence)
            .map_err(Error::from)
        }
    };
    let first = take(0, "owner-a").await?;
    let renewed = take(first, "owner-a").await?;
    let taken = take(renewed, "owner-b").await?;
    let stale = take(renewed, "owner-a").await;
    println!(
        "lease: taken at {first}, renewed at {renewed}, taken over at {taken}; the old owner's renewal refused: {}",
        stale.is_err()
    );
    let vehicles_in: Vec<usize> = (0..args.partitions)
        .map(|p| check.partition_of.values().filter(|&&q| q == p).count())
        .collect();
    let even = |even: bool| -> Vec<usize> {
        (0..args.partitions)
            .map(|p| {
                check
                    .partition_of
                    .iter()
                    .filter(|(v, q)| {
                        **q == p && v[1..].parse::<u32>().is_ok_and(|n| (n % 2 == 0) == even)
                    })
                    .count()
            })
            .collect()
    };
    println!(
        "vehicles per partition: {vehicles_in:?} (native topics {:?}, OwnTracks {:?})",
        even(true),
        even(false)
    );
    Ok(())
}
