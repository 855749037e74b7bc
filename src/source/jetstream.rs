//! A partition's input in NATS JetStream (decision 0025): devices publish
//! over MQTT to the server, whose mapping puts each vehicle's topic in
//! `in.<p>.…` by a hash of its vehicle tokens; partition `p` is the stream
//! `GEOGATE_IN_<p>`, read here in order from a position its owner
//! committed.
//!
//! Read without acks: the position is the stream sequence, and the owner
//! keeps it in its commits, so a new owner resumes where the last commit
//! says, whatever the engine thinks was delivered.

use crate::jetstream_link::{file_stream, reader_after};
use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures_util::StreamExt;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
#[error("partition {partition}: input stream {stream}: {detail}")]
pub struct InputError {
    pub partition: u32,
    pub stream: String,
    pub detail: String,
}

pub fn stream_name(partition: u32) -> String {
    format!("GEOGATE_IN_{partition}")
}

/// One fix as the partition holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFix {
    /// Its position in the partition.
    pub seq: u64,
    /// The MQTT topic the device published to.
    pub topic: String,
    pub payload: Bytes,
    /// When the engine stored it (unix ms): the partition's receive clock.
    /// It is the same for every owner that reads the fix, so the rules
    /// that run on the receive clock (the reorder window, the device clock
    /// check, idle expiry) decide the same after an owner change.
    pub stored_ms: i64,
}

/// One read of a partition: its fixes, and how many messages the
/// partition held after the last of them when it was read (its lag).
#[derive(Debug, Default)]
pub struct InputBatch {
    pub fixes: Vec<InputFix>,
    pub behind: u64,
}

/// The MQTT topic a device published to, from the subject the server's
/// mapping gave it: `in.<p>.` taken off, NATS's `.` back to `/`, and the
/// `//` NATS writes for a `.` in an MQTT topic back to `.`.
pub fn mqtt_topic(subject: &str) -> Option<String> {
    let rest = subject.strip_prefix("in.")?;
    let (partition, topic) = rest.split_once('.')?;
    partition.parse::<u32>().ok()?;
    Some(
        topic
            .split("//")
            .map(|part| part.replace('.', "/"))
            .collect::<Vec<_>>()
            .join("."),
    )
}

pub struct PartitionInput {
    partition: u32,
    stream: jetstream::stream::Stream,
    reader: Option<consumer::Consumer<consumer::pull::Config>>,
    /// The last position read: a reader the engine dropped (an
    /// ephemeral consumer is deleted after a few idle seconds, or with a
    /// restarted server) is made again after it.
    position: u64,
}

impl PartitionInput {
    /// Opens partition `partition` after position `after` (0: from its
    /// start), making its stream if it is new.
    pub async fn open(
        js: &jetstream::Context,
        partition: u32,
        after: u64,
    ) -> Result<Self, InputError> {
        let error = |e: String| InputError {
            partition,
            stream: stream_name(partition),
            detail: e,
        };
        let stream = file_stream(js, stream_name(partition), subjects(partition))
            .await
            .map_err(error)?;
        let state = &stream.cached_info().state;
        let first = state.first_sequence;
        if first > after + 1 && state.last_sequence > after {
            return Err(error(format!(
                "the stream starts at position {first}, after the committed position {after}: messages {}..{} are gone (a limit or a purge removed them), so they were never evaluated",
                after + 1,
                first - 1
            )));
        }
        Ok(Self {
            partition,
            stream,
            reader: None,
            position: after,
        })
    }

    fn error(&self, detail: String) -> InputError {
        InputError {
            partition: self.partition,
            stream: stream_name(self.partition),
            detail,
        }
    }

    /// Up to `max` fixes in partition order, waiting at most `wait` for
    /// the first. A message whose subject is not a mapped topic (put there
    /// by hand) comes with the subject as its topic, for the decoder to
    /// refuse with a reason. After an error the next call reads again from
    /// the last position it returned.
    pub async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<InputBatch, InputError> {
        let before = self.position;
        let read = self.read(max, wait).await;
        if read.is_err() {
            // What this read took is dropped with it: read it again.
            self.position = before;
            self.reader = None;
        }
        read
    }

    async fn read(&mut self, max: usize, wait: Duration) -> Result<InputBatch, InputError> {
        let reader = match &self.reader {
            Some(reader) => reader,
            None => {
                let reader = reader_after(&self.stream, self.position)
                    .await
                    .map_err(|e| self.error(e))?;
                self.reader.insert(reader)
            }
        };
        let mut messages = reader
            .fetch()
            .max_messages(max)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| self.error(e.to_string()))?;
        let mut batch = InputBatch::default();
        while let Some(message) = messages.next().await {
            let message = message.map_err(|e| self.error(e.to_string()))?;
            let info = message.info().map_err(|e| self.error(e.to_string()))?;
            if info.stream_sequence <= self.position {
                continue;
            }
            if info.stream_sequence != self.position + 1 {
                return Err(self.error(format!(
                    "position {} follows {}: messages in between are gone (a limit or a purge removed them), so they were never evaluated",
                    info.stream_sequence, self.position
                )));
            }
            self.position = info.stream_sequence;
            batch.behind = info.pending;
            let subject = message.message.subject.as_str();
            batch.fixes.push(InputFix {
                seq: info.stream_sequence,
                topic: mqtt_topic(subject).unwrap_or_else(|| subject.to_owned()),
                payload: message.message.payload.clone(),
                stored_ms: (info.published.unix_timestamp_nanos() / 1_000_000) as i64,
            });
        }
        Ok(batch)
    }

    /// Whether every message the partition holds has been read: an empty
    /// read alone does not say so (a loaded engine, a reader being made
    /// again).
    pub async fn caught_up(&mut self) -> Result<bool, InputError> {
        match self.stream.info().await {
            Ok(info) => Ok(info.state.last_sequence <= self.position),
            Err(e) => Err(self.error(e.to_string())),
        }
    }

    /// The last position read.
    pub fn position(&self) -> u64 {
        self.position
    }
}

/// The subjects partition `partition`'s stream holds.
pub fn subjects(partition: u32) -> String {
    format!("in.{partition}.>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mqtt_topic_comes_back_from_a_mapped_subject() {
        assert_eq!(
            mqtt_topic("in.3.fleet.v1.telemetry").as_deref(),
            Some("fleet/v1/telemetry")
        );
        assert_eq!(
            mqtt_topic("in.12.owntracks.ann.phone").as_deref(),
            Some("owntracks/ann/phone")
        );
        assert_eq!(
            mqtt_topic("in.0.fleet.truck//7.telemetry").as_deref(),
            Some("fleet/truck.7/telemetry")
        );
        assert_eq!(mqtt_topic("fleet.v1.telemetry"), None);
        assert_eq!(mqtt_topic("in.x.fleet"), None);
    }
}
