//! A lease per partition (decision 0025): the last message on `lease.<p>`
//! in the stream `GEOGATE_LEASES`, naming the instance that holds it.
//!
//! Taking and renewing are compare-and-set on the subject's sequence, so of
//! two instances that saw the same lease, one gets it. Whether a lease has
//! run out is judged by whoever wants the partition, on its own monotonic
//! clock ([`ExpiryWatch`]): a lease it has seen unchanged for a whole term
//! is free to take. No clocks on different machines are compared.
//!
//! A lease only says who should own a partition; the commit log is what
//! fences a holder that lost it without noticing (paused past its term).

use super::PartitionError;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use std::collections::HashMap;
use std::time::{Duration, Instant};

pub const STREAM: &str = "GEOGATE_LEASES";

fn subject(partition: u32) -> String {
    format!("lease.{partition}")
}

/// A partition's lease as last written: its holder and its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub partition: u32,
    pub holder: String,
    pub seq: u64,
}

#[derive(Clone)]
pub struct Leases {
    js: jetstream::Context,
}

impl Leases {
    /// Makes the leases' stream if it is new (one message kept per
    /// partition: only the last lease matters).
    pub async fn open(js: &jetstream::Context) -> Result<Self, PartitionError> {
        js.get_or_create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["lease.*".into()],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| PartitionError::engine(0, STREAM, e))?;
        Ok(Self { js: js.clone() })
    }

    /// The partition's lease as last written; `None` if it never had one.
    pub async fn current(&self, partition: u32) -> Result<Option<Lease>, PartitionError> {
        let engine = |e| PartitionError::engine(partition, STREAM, e);
        let stream = self
            .js
            .get_stream_no_info(STREAM)
            .await
            .map_err(|e| engine(e.to_string()))?;
        match stream
            .get_last_raw_message_by_subject(&subject(partition))
            .await
        {
            Ok(message) => Ok(Some(Lease {
                partition,
                holder: String::from_utf8_lossy(&message.payload).into_owned(),
                seq: message.sequence,
            })),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(engine(e.to_string())),
        }
    }

    /// The leases of partitions `0..partitions` as last written (those
    /// never taken are absent). One direct read each: cheaper for the
    /// engine than a consumer made each time, which a tick would need.
    pub async fn all(&self, partitions: u32) -> Result<HashMap<u32, Lease>, PartitionError> {
        let mut leases = HashMap::new();
        for p in 0..partitions {
            if let Some(lease) = self.current(p).await? {
                leases.insert(p, lease);
            }
        }
        Ok(leases)
    }

    /// Takes the partition for `holder`, replacing `seen` (the lease as
    /// the caller last read it; `None` for a partition that never had
    /// one). [`PartitionError::LeaseLost`] if anyone wrote it since.
    pub async fn take(
        &self,
        partition: u32,
        holder: &str,
        seen: Option<&Lease>,
    ) -> Result<Lease, PartitionError> {
        self.write(partition, holder, seen.map_or(0, |l| l.seq))
            .await
    }

    /// Renews a lease this instance holds; [`PartitionError::LeaseLost`]
    /// if another instance took it meanwhile.
    pub async fn renew(&self, held: &Lease) -> Result<Lease, PartitionError> {
        self.write(held.partition, &held.holder, held.seq).await
    }

    async fn write(
        &self,
        partition: u32,
        holder: &str,
        expected: u64,
    ) -> Result<Lease, PartitionError> {
        let engine = |e: String| PartitionError::engine(partition, STREAM, e);
        let publish = PublishMessage::build()
            .payload(Bytes::from(holder.to_owned()))
            .expected_last_subject_sequence(expected);
        let ack = self
            .js
            .send_publish(subject(partition), publish)
            .await
            .map_err(|e| engine(e.to_string()))?
            .await;
        match ack {
            Ok(ack) => Ok(Lease {
                partition,
                holder: holder.to_owned(),
                seq: ack.sequence,
            }),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                // A write whose ack was lost left this holder's own lease
                // last: it holds the partition.
                match self.current(partition).await? {
                    Some(current) if current.holder == holder => Ok(current),
                    _ => Err(PartitionError::LeaseLost { partition }),
                }
            }
            Err(e) => Err(engine(e.to_string())),
        }
    }
}

/// What a contender has seen of each partition's lease, and since when.
pub struct ExpiryWatch {
    term: Duration,
    seen: HashMap<u32, (u64, Instant)>,
}

impl ExpiryWatch {
    pub fn new(term: Duration) -> Self {
        Self {
            term,
            seen: HashMap::new(),
        }
    }

    /// Whether `lease` has stood unchanged for a whole term by `now`, as
    /// far as this watch has seen: the term counts from the first time it
    /// saw this lease's sequence, so a renewal starts it again.
    pub fn expired(&mut self, lease: &Lease, now: Instant) -> bool {
        let (seq, since) = self.seen.entry(lease.partition).or_insert((lease.seq, now));
        if *seq != lease.seq {
            (*seq, *since) = (lease.seq, now);
        }
        now.duration_since(*since) >= self.term
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(partition: u32, seq: u64) -> Lease {
        Lease {
            partition,
            holder: "a".into(),
            seq,
        }
    }

    #[test]
    fn a_lease_runs_out_a_term_after_it_was_first_seen_unchanged() {
        let term = Duration::from_secs(3);
        let mut watch = ExpiryWatch::new(term);
        let t0 = Instant::now();
        assert!(!watch.expired(&lease(1, 5), t0));
        assert!(!watch.expired(&lease(1, 5), t0 + Duration::from_secs(2)));
        // Renewed: the term starts again.
        assert!(!watch.expired(&lease(1, 6), t0 + Duration::from_secs(2)));
        assert!(!watch.expired(&lease(1, 6), t0 + Duration::from_secs(4)));
        assert!(watch.expired(&lease(1, 6), t0 + Duration::from_secs(5)));
        // Each partition on its own.
        assert!(!watch.expired(&lease(2, 6), t0 + Duration::from_secs(5)));
    }
}
