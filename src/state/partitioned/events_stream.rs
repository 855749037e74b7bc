//! Where a partition's transitions go: the stream `GEOGATE_EVENTS`,
//! subject `events.<p>`, one message per commit that produced any, its
//! body the commit's NDJSON lines in seq order.
//!
//! Each message is published expecting the subject's last sequence as its
//! writer knows it, and names its commit (`Geogate-Commit`). So the stream
//! holds each commit's transitions once, in commit order: a new owner
//! reads which commit the stream holds last and publishes the rest, and a
//! deposed owner's late publish is refused. Consumers read one ordered,
//! deduplicated stream per partition, with no duplicate window to rely on.

use super::PartitionError;
use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use std::time::Duration;

pub const STREAM: &str = "GEOGATE_EVENTS";
pub const COMMIT_HEADER: &str = "Geogate-Commit";
pub const PARTITION_HEADER: &str = "Geogate-Partition";

pub fn subject(partition: u32) -> String {
    format!("events.{partition}")
}

pub struct EventsStream {
    js: jetstream::Context,
    partition: u32,
    /// The subject's last message, as this owner knows it (0: none).
    last: u64,
    /// The last commit whose transitions the stream holds (0: none).
    published: u64,
}

impl EventsStream {
    /// Makes the stream if it is new, keeping each message `max_age` (zero:
    /// for ever), and reads where the partition's events stand in it.
    pub async fn open(
        js: &jetstream::Context,
        partition: u32,
        max_age: Duration,
    ) -> Result<Self, PartitionError> {
        // Made, or its retention brought to the configured one.
        js.create_or_update_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["events.*".into()],
            storage: stream::StorageType::File,
            max_age,
            ..Default::default()
        })
        .await
        .map_err(|e| PartitionError::engine(partition, STREAM, e))?;
        let mut events = Self {
            js: js.clone(),
            partition,
            last: 0,
            published: 0,
        };
        events.read_last().await?;
        Ok(events)
    }

    /// The last commit whose transitions the stream holds.
    pub fn published(&self) -> u64 {
        self.published
    }

    /// The stream position of the partition's last message (0: none).
    pub fn last_position(&self) -> u64 {
        self.last
    }

    async fn read_last(&mut self) -> Result<(), PartitionError> {
        let partition = self.partition;
        let engine = |e: String| PartitionError::engine(partition, STREAM, e);
        let stream = self
            .js
            .get_stream_no_info(STREAM)
            .await
            .map_err(|e| engine(e.to_string()))?;
        match stream
            .get_last_raw_message_by_subject(&subject(partition))
            .await
        {
            Ok(last) => {
                self.last = last.sequence;
                self.published = last
                    .headers
                    .get(COMMIT_HEADER)
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(0);
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
            Err(e) => return Err(engine(e.to_string())),
        }
        Ok(())
    }

    /// Publishes commit `commit`'s lines, unless the stream holds them
    /// already. [`PartitionError::Deposed`] if another owner published
    /// after what this one knows.
    pub async fn publish(&mut self, commit: u64, lines: Bytes) -> Result<(), PartitionError> {
        if commit <= self.published {
            return Ok(());
        }
        let partition = self.partition;
        let engine = |e: String| PartitionError::engine(partition, STREAM, e);
        let mut headers = HeaderMap::new();
        headers.insert(COMMIT_HEADER, commit.to_string().as_str());
        headers.insert(PARTITION_HEADER, partition.to_string().as_str());
        let publish = PublishMessage::build()
            .payload(lines)
            .headers(headers)
            .message_id(format!("{partition}.{commit}").as_str())
            .expected_last_subject_sequence(self.last);
        let ack = self
            .js
            .send_publish(subject(partition), publish)
            .await
            .map_err(|e| engine(e.to_string()))?
            .await;
        match ack {
            Ok(ack) => {
                self.last = ack.sequence;
                self.published = commit;
                Ok(())
            }
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                // A publish whose ack was lost is there; anything else last
                // was published by another owner.
                self.read_last().await?;
                if self.published >= commit {
                    return Ok(());
                }
                Err(PartitionError::Deposed {
                    partition,
                    expected: self.last,
                })
            }
            Err(e) => Err(engine(e.to_string())),
        }
    }
}
