//! A partition's commit log (decision 0025) against a real nats-server:
//! a deposed owner cannot commit, concurrent takeovers leave one owner,
//! and the log outlives the server; a partition's lease goes to one
//! instance at a time; devices publishing over MQTT land in one partition
//! each, in order.

mod support;

use async_nats::jetstream;
use bytes::Bytes;
use geogate::source::jetstream::PartitionInput;
use geogate::state::partitioned::PartitionError;
use geogate::state::partitioned::commit_log::{CommitLog, read_after};
use geogate::state::partitioned::lease::{ExpiryWatch, Leases};
use support::nats::Nats;

async fn connect(nats: &Nats) -> jetstream::Context {
    jetstream::new(async_nats::connect(nats.url()).await.expect("connect"))
}

fn bodies(commits: &[geogate::state::partitioned::commit_log::Commit]) -> Vec<&[u8]> {
    commits.iter().map(|c| c.body.as_ref()).collect()
}

/// An owner paused past its lease and resumed after another took the
/// partition over: its next commit is refused, and the log holds only what
/// each owner committed while it owned the partition, in order.
#[test]
fn a_deposed_owner_cannot_commit_after_a_takeover() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        let mut a = CommitLog::take_over(&js, 3, 0, Bytes::from_static(b"a takes over"))
            .await
            .unwrap();
        a.append(Bytes::from_static(b"a1")).await.unwrap();
        a.append(Bytes::from_static(b"a2")).await.unwrap();
        // b read the log up to a2 and applied it.
        let applied = read_after(&js, 3, 0).await.unwrap().last().unwrap().seq;
        // A contender that read it before a2 is refused.
        assert!(matches!(
            CommitLog::take_over(&js, 3, applied - 1, Bytes::from_static(b"late")).await,
            Err(PartitionError::Deposed { .. })
        ));
        let mut b = CommitLog::take_over(&js, 3, applied, Bytes::from_static(b"b takes over"))
            .await
            .unwrap();
        let refused = a.append(Bytes::from_static(b"a3")).await;
        assert!(
            matches!(refused, Err(PartitionError::Deposed { partition: 3, .. })),
            "{refused:?}"
        );
        b.append(Bytes::from_static(b"b1")).await.unwrap();
        let log = read_after(&js, 3, 0).await.unwrap();
        assert_eq!(
            bodies(&log),
            [&b"a takes over"[..], b"a1", b"a2", b"b takes over", b"b1"]
        );
        assert!(log.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(log.last().map(|c| c.seq), Some(b.last()));
        assert_eq!(
            bodies(&read_after(&js, 3, log[2].seq).await.unwrap()).len(),
            2
        );
        assert!(
            read_after(&js, 4, 0).await.unwrap().is_empty(),
            "another partition's log"
        );
    });
}

/// Owners that read the log up to the same commit taking the partition
/// over at the same time: exactly one gets it, and only it can commit.
#[test]
fn of_owners_taking_over_at_once_exactly_one_can_commit() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        for round in 0..10u32 {
            // Each read the log up to the same commit.
            let applied = read_after(&js, 0, 0)
                .await
                .unwrap()
                .last()
                .map_or(0, |c| c.seq);
            let contenders: Vec<_> = (0..5)
                .map(|i| {
                    let js = js.clone();
                    tokio::spawn(async move {
                        let takeover = Bytes::from(format!("{round}: {i} takes over"));
                        CommitLog::take_over(&js, 0, applied, takeover).await
                    })
                })
                .collect();
            let mut owners = Vec::new();
            for contender in contenders {
                match contender.await.unwrap() {
                    Ok(log) => owners.push(log),
                    Err(PartitionError::Deposed { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(owners.len(), 1, "round {round}: one took over");
            let mut committed = 0;
            for owner in &mut owners {
                match owner.append(Bytes::from(format!("{round}: commit"))).await {
                    Ok(_) => committed += 1,
                    Err(PartitionError::Deposed { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(committed, 1, "round {round}: {} took over", owners.len());
        }
    });
}

/// The server SIGKILLed and started again: every commit it acknowledged is
/// in the log, and the owner commits on after it once it reconnects.
#[test]
fn the_log_outlives_a_killed_server() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        let mut owner = CommitLog::take_over(&js, 1, 0, Bytes::from_static(b"takes over"))
            .await
            .unwrap();
        for i in 0..100 {
            owner.append(Bytes::from(format!("c{i}"))).await.unwrap();
        }
        nats.stop();
        nats.start_again();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let after = loop {
            match owner.append(Bytes::from_static(b"after the restart")).await {
                Ok(seq) => break seq,
                Err(PartitionError::Engine { .. }) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("{e}"),
            }
        };
        let log = read_after(&js, 1, 0).await.unwrap();
        assert_eq!(log.len(), 102);
        assert_eq!(log[100].body, Bytes::from_static(b"c99"));
        assert_eq!(log[101].seq, after);
    });
}

/// A lease taken, renewed, then taken by a contender that has seen it
/// unchanged for a whole term: the old holder's next renewal is refused,
/// and a contender that acts on a lease it read before a renewal loses.
#[test]
fn a_lease_goes_to_a_contender_only_after_a_whole_term_unrenewed() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        let leases = Leases::open(&js).await.unwrap();
        assert_eq!(leases.current(5).await.unwrap(), None);
        let a = leases.take(5, "a", None).await.unwrap();
        let term = std::time::Duration::from_secs(10);
        let mut watch = ExpiryWatch::new(term);
        let t0 = std::time::Instant::now();
        assert!(!watch.expired(&leases.current(5).await.unwrap().unwrap(), t0));
        let renewed = leases.renew(&a).await.unwrap();
        // b read the lease before the renewal: its take loses.
        assert!(matches!(
            leases.take(5, "b", Some(&a)).await,
            Err(PartitionError::LeaseLost { partition: 5 })
        ));
        let seen = leases.current(5).await.unwrap().unwrap();
        assert_eq!(seen, renewed);
        assert!(
            !watch.expired(&seen, t0 + term),
            "renewed: the term starts again"
        );
        let later = t0 + term * 2;
        assert!(watch.expired(&seen, later));
        let b = leases.take(5, "b", Some(&seen)).await.unwrap();
        assert_eq!(leases.current(5).await.unwrap().unwrap().holder, "b");
        assert!(matches!(
            leases.renew(&renewed).await,
            Err(PartitionError::LeaseLost { partition: 5 })
        ));
        assert!(leases.renew(&b).await.is_ok());
        assert_eq!(leases.current(6).await.unwrap(), None, "another partition");
    });
}

/// Instances taking a free partition at the same time: exactly one gets it.
#[test]
fn of_instances_taking_a_free_lease_at_once_exactly_one_gets_it() {
    let Some(nats) = Nats::start() else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        let leases = std::sync::Arc::new(Leases::open(&js).await.unwrap());
        for partition in 0..10u32 {
            let takers: Vec<_> = (0..5)
                .map(|i| {
                    let leases = leases.clone();
                    tokio::spawn(
                        async move { leases.take(partition, &format!("i{i}"), None).await },
                    )
                })
                .collect();
            let mut holders = Vec::new();
            for taker in takers {
                match taker.await.unwrap() {
                    Ok(lease) => holders.push(lease.holder),
                    Err(PartitionError::LeaseLost { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(holders.len(), 1, "partition {partition}: {holders:?}");
            let current = leases.current(partition).await.unwrap().unwrap();
            assert_eq!(current.holder, holders[0]);
        }
    });
}

/// Devices publishing over MQTT (QoS 1, native and OwnTracks topics) to the
/// server's listener: each vehicle lands in one
/// partition, in publish order, with its topic as published; a partition
/// read again from a position gives exactly what followed it.
#[test]
fn devices_over_mqtt_land_in_one_partition_each_in_publish_order() {
    const PARTITIONS: u32 = 4;
    let Some(nats) = Nats::start_partitioned(PARTITIONS) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let js = connect(&nats).await;
        let mut inputs = Vec::new();
        for p in 0..PARTITIONS {
            inputs.push(PartitionInput::open(&js, p, 0).await.unwrap());
        }
        let topic = |v: u32| match v % 3 {
            0 => format!("fleet/v{v}/telemetry"),
            1 => format!("owntracks/fleet/v{v}"),
            _ => format!("fleet/truck-{v}/telemetry"),
        };
        let mut messages = Vec::new();
        for k in 0..30u32 {
            for v in 0..24u32 {
                messages.push((topic(v), format!(r#"{{"v":{v},"k":{k}}}"#).into_bytes()));
            }
        }
        let mqtt = nats.mqtt_port.unwrap();
        support::geogate::publish_all(mqtt, &messages, None).await;

        let mut seen: std::collections::HashMap<String, (u32, u64)> = Default::default();
        let mut read = Vec::new();
        for (p, input) in inputs.iter_mut().enumerate() {
            let mut fixes = Vec::new();
            loop {
                let batch = input
                    .next_batch(500, std::time::Duration::from_millis(300))
                    .await
                    .unwrap();
                if batch.fixes.is_empty() {
                    break;
                }
                fixes.extend(batch.fixes);
            }
            for fix in &fixes {
                let value: serde_json::Value = serde_json::from_slice(&fix.payload).unwrap();
                let (v, k) = (
                    value["v"].as_u64().unwrap() as u32,
                    value["k"].as_u64().unwrap(),
                );
                assert_eq!(fix.topic, topic(v), "the topic as published");
                let (partition, last) = seen.entry(fix.topic.clone()).or_insert((p as u32, k));
                assert_eq!(*partition, p as u32, "{} in two partitions", fix.topic);
                assert!(k >= *last, "{}: fix {k} after {last}", fix.topic);
                *last = k;
            }
            read.push(fixes);
        }
        assert_eq!(read.iter().map(Vec::len).sum::<usize>(), messages.len());
        assert_eq!(seen.len(), 24);
        assert!(
            read.iter().filter(|fixes| !fixes.is_empty()).count() > 1,
            "vehicles spread over partitions"
        );
        let fixes = read.iter().find(|f| f.len() > 20).unwrap();
        let p = read.iter().position(|f| f.len() > 20).unwrap() as u32;
        let mut again = PartitionInput::open(&js, p, fixes[9].seq).await.unwrap();
        let rest = again
            .next_batch(10_000, std::time::Duration::from_millis(300))
            .await
            .unwrap();
        assert_eq!(rest.fixes, fixes[10..]);
        assert_eq!(rest.behind, 0);
    });
}
