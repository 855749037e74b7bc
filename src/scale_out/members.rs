//! Which instances are live, and which of them should own each partition.
//!
//! Each instance writes a heartbeat to `member.<instance>` in the stream
//! `GEOGATE_MEMBERS` (one message kept per subject) every few seconds, with
//! the fingerprint of the fence set it runs; it writes `leaving` when it
//! stops. Another instance counts it live while its heartbeat keeps
//! changing, judged on its own monotonic clock, like a lease.
//!
//! Each partition's owner is chosen by rendezvous hashing over the live
//! instances: every instance computes the same owners from the same
//! members, and a join or leave moves only the partitions it must.

use async_nats::jetstream::{self, stream};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

const STREAM: &str = "GEOGATE_MEMBERS";

fn subject(instance: &str) -> String {
    format!("member.{instance}")
}

/// What a heartbeat says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub instance: String,
    /// The fingerprint of the fence set the instance runs.
    pub fences: String,
    pub leaving: bool,
}

pub struct Members {
    js: jetstream::Context,
    term: Duration,
    /// Each instance's heartbeat sequence as last seen, and since when.
    seen: HashMap<String, (u64, Instant)>,
}

impl Members {
    pub async fn open(js: &jetstream::Context, term: Duration) -> Result<Self, String> {
        js.get_or_create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["member.*".into()],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())?;
        Ok(Self {
            js: js.clone(),
            term,
            seen: HashMap::new(),
        })
    }

    pub async fn beat(&self, heartbeat: &Heartbeat) -> Result<(), String> {
        let body = serde_json::to_vec(heartbeat).map_err(|e| e.to_string())?;
        self.js
            .publish(subject(&heartbeat.instance), body.into())
            .await
            .map_err(|e| e.to_string())?
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The live instances' heartbeats, by name: those whose heartbeat
    /// changed within a term, as this instance has seen them, and not
    /// leaving. `me` is always among them.
    pub async fn live(&mut self, me: &Heartbeat) -> Result<BTreeMap<String, Heartbeat>, String> {
        let stream = self
            .js
            .get_stream(STREAM)
            .await
            .map_err(|e| e.to_string())?;
        let subjects: Vec<String> = {
            use futures_util::TryStreamExt;
            let info = stream
                .info_with_subjects("member.*")
                .await
                .map_err(|e| e.to_string())?;
            info.try_collect::<HashMap<String, usize>>()
                .await
                .map_err(|e| e.to_string())?
                .into_keys()
                .collect()
        };
        let now = Instant::now();
        let mut live = BTreeMap::new();
        for subject in subjects {
            let Ok(message) = stream.get_last_raw_message_by_subject(&subject).await else {
                continue;
            };
            let Ok(beat) = serde_json::from_slice::<Heartbeat>(&message.payload) else {
                continue;
            };
            let (seq, since) = self
                .seen
                .entry(beat.instance.clone())
                .or_insert((message.sequence, now));
            if *seq != message.sequence {
                (*seq, *since) = (message.sequence, now);
            }
            if !beat.leaving && now.duration_since(*since) < self.term {
                live.insert(beat.instance.clone(), beat);
            }
        }
        live.insert(me.instance.clone(), me.clone());
        Ok(live)
    }
}

/// The instance that should own `partition`: the highest rendezvous score
/// among `instances` (none if there are none).
pub fn owner_of<'a>(
    partition: u32,
    instances: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    instances
        .into_iter()
        .max_by_key(|i| (score(i, partition), *i))
}

/// xxh3 of the instance and the partition: specified (the same on every
/// build and machine) and well mixed, so instances share partitions evenly.
fn score(instance: &str, partition: u32) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    h.update(instance.as_bytes());
    h.update(&[0]);
    h.update(&partition.to_le_bytes());
    h.digest()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_moves_only_the_partitions_the_newcomer_takes() {
        let three = ["a", "b", "c"];
        let four = ["a", "b", "c", "d"];
        let mut moved = 0;
        let mut per = HashMap::new();
        for p in 0..512 {
            let before = owner_of(p, three).unwrap();
            let after = owner_of(p, four).unwrap();
            *per.entry(before).or_insert(0) += 1;
            if before != after {
                assert_eq!(after, "d", "partition {p} moved between old members");
                moved += 1;
            }
        }
        // About a quarter moves, and the three shared the rest fairly.
        assert!((90..170).contains(&moved), "{moved} of 512 moved");
        assert!(per.values().all(|&n| (130..215).contains(&n)), "{per:?}");
        // A leave moves only the leaver's.
        for p in 0..512 {
            let with = owner_of(p, four).unwrap();
            let without = owner_of(p, ["a", "c", "d"]).unwrap();
            assert!(with == without || with == "b");
        }
        assert_eq!(owner_of(3, []), None);
    }
}
