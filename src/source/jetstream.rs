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
    reader: consumer::Consumer<consumer::pull::Config>,
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
        let stream = file_stream(js, stream_name(partition), format!("in.{partition}.>"))
            .await
            .map_err(error)?;
        let reader = reader_after(&stream, after).await.map_err(error)?;
        Ok(Self { partition, reader })
    }

    /// Up to `max` fixes in partition order, waiting at most `wait` for
    /// the first. A message whose subject is not a mapped topic (put there
    /// by hand) comes with the subject as its topic, for the decoder to
    /// refuse with a reason.
    pub async fn next_batch(
        &mut self,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<InputFix>, InputError> {
        let error = |e: String| InputError {
            partition: self.partition,
            stream: stream_name(self.partition),
            detail: e,
        };
        let mut batch = self
            .reader
            .fetch()
            .max_messages(max)
            .expires(wait)
            .messages()
            .await
            .map_err(|e| error(e.to_string()))?;
        let mut fixes = Vec::new();
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| error(e.to_string()))?;
            let seq = message
                .info()
                .map_err(|e| error(e.to_string()))?
                .stream_sequence;
            let subject = message.message.subject.as_str();
            fixes.push(InputFix {
                seq,
                topic: mqtt_topic(subject).unwrap_or_else(|| subject.to_owned()),
                payload: message.message.payload.clone(),
            });
        }
        Ok(fixes)
    }
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
