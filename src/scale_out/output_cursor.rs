//! Where an output stands in a partition's transitions, kept in the
//! engine: the last message on `outputs.<output>.<p>` in the stream
//! `GEOGATE_OUTPUTS`. Whichever instance owns the partition next reads it
//! there, so delivery goes on where it stood, on any machine.
//!
//! A cursor only moves forward: it is written compare-and-set on the
//! subject's sequence, and a write that finds a later cursor keeps that
//! one. Two owners of one partition (a paused one that has not yet noticed
//! it was deposed) can therefore never move it back; what both delivered
//! is delivered, and at worst delivered twice, with the same ids.

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind};
use async_nats::jetstream::{self, message::PublishMessage};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub const STREAM: &str = "GEOGATE_OUTPUTS";

/// Tries of a write that keep meeting another writer's, at most.
const WRITE_TRIES: usize = 5;

/// An output's place in one partition's transitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    /// The last transition (the partition's seq) the output has delivered
    /// or dead-lettered.
    pub seq: u64,
    /// The events stream's position to read again from: the message that
    /// holds the transition after `seq` is there or later.
    pub read_from: u64,
}

#[derive(Debug, thiserror::Error)]
#[error("{STREAM} {subject}: {detail}")]
pub struct CursorError {
    pub subject: String,
    pub detail: String,
}

pub struct OutputCursor {
    js: jetstream::Context,
    subject: String,
    /// The cursor as last read or written, and its message's sequence.
    stored: Option<(Cursor, u64)>,
}

impl OutputCursor {
    /// Makes the cursors' stream if it is new (one message kept per
    /// subject), and reads `output`'s cursor for `partition`.
    pub async fn open(
        js: &jetstream::Context,
        output: &str,
        partition: u32,
    ) -> Result<Self, CursorError> {
        let mut cursor = Self {
            js: js.clone(),
            subject: format!("outputs.{output}.{partition}"),
            stored: None,
        };
        js.get_or_create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["outputs.*.*".into()],
            max_messages_per_subject: 1,
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .map_err(|e| cursor.error(e.to_string()))?;
        cursor.read().await?;
        Ok(cursor)
    }

    /// The cursor as stored; `None` if this output never had one here.
    pub fn stored(&self) -> Option<Cursor> {
        self.stored.map(|(c, _)| c)
    }

    fn error(&self, detail: String) -> CursorError {
        CursorError {
            subject: self.subject.clone(),
            detail,
        }
    }

    async fn read(&mut self) -> Result<(), CursorError> {
        let stream = self
            .js
            .get_stream_no_info(STREAM)
            .await
            .map_err(|e| self.error(e.to_string()))?;
        self.stored = match stream.get_last_raw_message_by_subject(&self.subject).await {
            Ok(message) => {
                let cursor = serde_json::from_slice(&message.payload).map_err(|e| {
                    self.error(format!("unreadable cursor (written by hand?): {e}"))
                })?;
                Some((cursor, message.sequence))
            }
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => None,
            Err(e) => return Err(self.error(e.to_string())),
        };
        Ok(())
    }

    /// Stores `to`, unless the stored cursor is there already or past it.
    pub async fn advance(&mut self, to: Cursor) -> Result<(), CursorError> {
        self.write(to, true).await
    }

    /// Stores `to` whatever is stored: where a new output starts, or one
    /// whose partition's events were made again (seqs started over).
    pub async fn reset(&mut self, to: Cursor) -> Result<(), CursorError> {
        self.write(to, false).await
    }

    async fn write(&mut self, to: Cursor, forward_only: bool) -> Result<(), CursorError> {
        for _ in 0..WRITE_TRIES {
            if forward_only && self.stored.is_some_and(|(c, _)| c.seq >= to.seq) {
                return Ok(());
            }
            let expected = self.stored.map_or(0, |(_, seq)| seq);
            let body = serde_json::to_vec(&to).map_err(|e| self.error(e.to_string()))?;
            let publish = PublishMessage::build()
                .payload(Bytes::from(body))
                .expected_last_subject_sequence(expected);
            let ack = self
                .js
                .send_publish(self.subject.clone(), publish)
                .await
                .map_err(|e| self.error(e.to_string()))?
                .await;
            match ack {
                Ok(ack) => {
                    self.stored = Some((to, ack.sequence));
                    return Ok(());
                }
                // Another owner wrote meanwhile: moving forward, the later
                // of the two is kept.
                Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => self.read().await?,
                Err(e) => return Err(self.error(e.to_string())),
            }
        }
        Err(self.error(format!(
            "another writer's cursor came in between {WRITE_TRIES} times in a row"
        )))
    }
}
