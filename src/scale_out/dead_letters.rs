//! The instance's dead letter, shared by every partition it owns: one task
//! owns the sink, and each owner hands it the records of a batch.
//!
//! A refusal before the state (an undecodable payload, a wrong device
//! clock) is written before the batch is committed, so a crash never loses
//! one (it may write it twice, when a new owner reads the batch again). A
//! late fix is known only once its batch is evaluated, and is written once
//! the batch is committed; its count is committed with the batch, so the
//! count is exact even when a crash between the two loses its record.

use crate::sink::dead_letter::{DeadLetter, DeadLetterSink};
use crate::sink::metrics::DEAD_LETTER_WRITTEN_TOTAL;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// One record, owning its text.
#[derive(Debug, Clone)]
pub struct Record {
    pub received_ms: i64,
    pub topic: String,
    pub reason: &'static str,
    pub detail: String,
    pub payload: bytes::Bytes,
    pub partition: u32,
}

struct Request {
    records: Vec<Record>,
    written: Option<oneshot::Sender<()>>,
}

#[derive(Clone)]
pub struct DeadLetters(mpsc::UnboundedSender<Request>);

impl DeadLetters {
    /// Starts the task owning `sink`; it ends once every handle is gone.
    pub fn start(sink: DeadLetterSink) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self(tx), tokio::spawn(run(sink, rx)))
    }

    /// Writes `records` and waits until they are in the file.
    pub async fn write(&self, records: Vec<Record>) {
        if records.is_empty() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        let request = Request {
            records,
            written: Some(tx),
        };
        if self.0.send(request).is_ok() {
            let _ = rx.await;
        }
    }

    /// Hands `records` over without waiting.
    pub fn send(&self, records: Vec<Record>) {
        if !records.is_empty() {
            let _ = self.0.send(Request {
                records,
                written: None,
            });
        }
    }
}

async fn run(mut sink: DeadLetterSink, mut requests: mpsc::UnboundedReceiver<Request>) {
    while let Some(request) = requests.recv().await {
        let mut waiting = vec![request];
        while let Ok(more) = requests.try_recv() {
            waiting.push(more);
        }
        for r in waiting.iter().flat_map(|w| &w.records) {
            let mut record = DeadLetter::new(
                r.received_ms,
                &r.topic,
                r.reason,
                r.detail.as_str(),
                &r.payload,
            );
            record.shard = Some(r.partition as usize);
            sink.queue(&record);
            metrics::counter!(DEAD_LETTER_WRITTEN_TOTAL, "reason" => r.reason).increment(1);
        }
        // A failed write stays queued in the sink: tried again until it
        // is in the file, as the pipeline's dead letter does.
        let mut pause = Duration::from_millis(50);
        while let Err(e) = tokio::task::block_in_place(|| sink.flush()) {
            tracing::error!("dead letter {}: {e}; trying again", sink.path().display());
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
        for w in waiting {
            if let Some(written) = w.written {
                let _ = written.send(());
            }
        }
    }
    if let Err(e) = sink.sync() {
        tracing::error!("dead letter sync: {e}");
    }
}
