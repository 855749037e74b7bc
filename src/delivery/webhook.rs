//! Committed transitions to an HTTP endpoint, at least once: each request
//! POSTs a batch, in seq order, as a JSON array of the events file's lines
//! (each with its stable `id` and `seq`), signed so that the receiver can
//! refuse forgeries and replays ([`signature`]).
//!
//! One request is in flight at a time, so transitions arrive in seq order,
//! and so in order per vehicle, across retries too. What the receiver says
//! decides what happens to the batch:
//!
//! | response | then |
//! |---|---|
//! | 2xx | delivered: the cursor moves past the batch |
//! | 410 Gone | the receiver is gone for good: the batch goes to the dead letter as `webhook_gone` |
//! | 400, 422 | the receiver will never take this body: dead letter, `webhook_rejected` |
//! | 413 | the batch is halved and sent again; one transition refused so is `webhook_rejected` |
//! | anything else (a 3xx too: redirects are not followed), a timeout, no connection | sent again after a jittered exponential backoff (100 ms to 10 s; a `Retry-After` in seconds is honoured up to 60 s) |
//!
//! A transition still not delivered past `max_age_s` goes to the dead letter
//! as `webhook_expired` ([`super::output_queue`]): never dropped silently.

use super::metrics::{OUTPUT_RETRIES_TOTAL, output_labels};
use super::outbox::OutboxEntry;
use super::output_queue::{DeadLetterQueue, OutputFeed, OutputLimits, OutputQueue, Room};
use crate::backoff::Backoff;
use crate::clock::receive_now_ms;
use crate::shutdown::Drain;
use crate::sink::metrics::SINK_HEALTHY;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

pub mod signature;

/// The longest `Retry-After` honoured: a receiver cannot park delivery.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Where and how transitions are posted.
#[derive(Clone)]
pub struct WebhookTarget {
    pub url: reqwest::Url,
    pub secret: Arc<[u8]>,
    /// Transitions per request at most.
    pub batch: usize,
    pub timeout: Duration,
}

/// What one attempt came to.
enum Outcome {
    Delivered,
    /// Refused for good: dead-letter the batch with this reason.
    Refused {
        why: &'static str,
        status: u16,
    },
    /// 413: send fewer at once.
    TooLarge,
    /// Send it again, after the backoff or the receiver's `Retry-After`.
    Again {
        why: String,
        retry_after: Option<Duration>,
    },
}

pub struct Webhook {
    http: reqwest::Client,
    target: WebhookTarget,
    queue: OutputQueue,
    drain: Drain,
    healthy: metrics::Gauge,
    retries: metrics::Counter,
    backoff: Backoff,
    /// Transitions per request now: halved by a 413, back to the target's
    /// after a success.
    batch: usize,
    /// Dropped when the webhook stops: the committer waits for that.
    _done: std::sync::mpsc::Sender<()>,
}

impl Webhook {
    /// Starts posting what comes through the returned feed, until it is
    /// dropped and what is queued is delivered (or the drain deadline
    /// passes). `cursor`: the last seq delivered before this start.
    pub fn spawn(
        target: WebhookTarget,
        limits: OutputLimits,
        partition: Option<u32>,
        cursor: Arc<AtomicU64>,
        drain: Drain,
        done: std::sync::mpsc::Sender<()>,
        dead_letter: Option<DeadLetterQueue>,
    ) -> Result<(JoinHandle<()>, OutputFeed), reqwest::Error> {
        // One TLS provider for the process (rumqttc's), which reqwest's
        // client builder asks for; a second install is a no-op.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(target.timeout)
            .connect_timeout(target.timeout)
            // A redirected POST becomes a GET without the body, whose 2xx
            // would count as delivered: a redirect is sent again instead.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("geogate/", env!("CARGO_PKG_VERSION")))
            .build()?;
        let room = Room::new(limits.max_pending);
        let (feed, rx) = OutputFeed::new(room.clone());
        let healthy = metrics::gauge!(SINK_HEALTHY, &output_labels("sink", "webhook", partition));
        healthy.set(1.0);
        let webhook = Self {
            http,
            batch: target.batch.max(1),
            target,
            queue: OutputQueue::new(
                "webhook",
                partition,
                cursor,
                room,
                limits.max_age,
                dead_letter,
            ),
            drain,
            healthy,
            retries: metrics::counter!(
                OUTPUT_RETRIES_TOTAL,
                &output_labels("output", "webhook", partition)
            ),
            backoff: Backoff::new(),
            _done: done,
        };
        Ok((tokio::spawn(webhook.run(rx)), feed))
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Vec<OutboxEntry>>) {
        let mut open = true;
        loop {
            if self.queue.is_empty() {
                if !open {
                    return;
                }
                match rx.recv().await {
                    Some(entries) => self.queue.push(entries),
                    None => open = false,
                }
                continue;
            }
            while let Ok(entries) = rx.try_recv() {
                self.queue.push(entries);
            }
            if self.drain.passed() {
                tracing::warn!(
                    "webhook: {} transition(s) undelivered at the drain deadline; sent again after the restart",
                    self.queue.len()
                );
                return;
            }
            let now = receive_now_ms();
            if self.queue.has_expired(now) {
                self.queue.unsend_all();
                if self
                    .queue
                    .expire(now, "the receiver did not accept it")
                    .await
                    .is_none()
                {
                    // The dead letter is gone (shutdown): try again later;
                    // they stay in the outbox meanwhile.
                    let wait = self.backoff.step();
                    self.pause(wait).await;
                }
                continue;
            }
            self.send_one_batch().await;
        }
    }

    /// Posts the next batch and acts on the answer.
    async fn send_one_batch(&mut self) {
        let n = self.batch.min(self.queue.len());
        let body = batch_body(self.queue.unsent(n));
        self.queue.mark_sent(n);
        match self.post(body).await {
            Outcome::Delivered => {
                crate::crash_point::reached("webhook.before_cursor");
                self.queue.confirm_in_flight();
                self.healthy.set(1.0);
                self.backoff.reset();
                self.batch = self.target.batch.max(1);
            }
            Outcome::TooLarge if n > 1 => {
                self.queue.unsend_all();
                self.batch = (n / 2).max(1);
            }
            Outcome::TooLarge => self.refuse("rejected", 413).await,
            Outcome::Refused { why, status } => self.refuse(why, status).await,
            Outcome::Again { why, retry_after } => {
                self.queue.unsend_all();
                self.healthy.set(0.0);
                self.retries.increment(n as u64);
                let wait =
                    retry_after.map_or_else(|| self.backoff.step(), |w| w.min(MAX_RETRY_AFTER));
                tracing::warn!(
                    "webhook {}: {why}; {n} transition(s) sent again in {wait:?}",
                    self.target.url
                );
                self.pause(wait).await;
            }
        }
    }

    /// Waits `wait`, or until the drain deadline.
    async fn pause(&mut self, wait: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = self.drain.wait() => {}
        }
    }

    async fn refuse(&mut self, why: &'static str, status: u16) {
        let n = self.queue.in_flight();
        let detail = format!(
            "the webhook receiver {} answered {status}: it will not take this request again",
            self.target.url
        );
        tracing::error!(
            "webhook {}: answered {status}; {n} transition(s) to the dead letter (webhook_{why})",
            self.target.url
        );
        if !self.queue.reject_in_flight(why, detail).await {
            // The dead letter cannot take them now: kept, and tried later.
            self.queue.unsend_all();
            let wait = self.backoff.step();
            self.pause(wait).await;
        }
    }

    async fn post(&self, body: Vec<u8>) -> Outcome {
        let timestamp = signature::unix_seconds();
        let signed = signature::sign(&self.target.secret, timestamp, &body);
        let sent = self
            .http
            .post(self.target.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(signature::TIMESTAMP_HEADER, timestamp.to_string())
            .header(signature::SIGNATURE_HEADER, signed)
            .body(body)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                return Outcome::Again {
                    why: describe(&e),
                    retry_after: None,
                };
            }
        };
        let status = response.status();
        match status.as_u16() {
            200..=299 => Outcome::Delivered,
            410 => Outcome::Refused {
                why: "gone",
                status: 410,
            },
            400 | 422 => Outcome::Refused {
                why: "rejected",
                status: status.as_u16(),
            },
            413 => Outcome::TooLarge,
            _ => Outcome::Again {
                why: format!("answered {status}"),
                retry_after: response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs),
            },
        }
    }
}

/// An error as an operator reads it: what failed, with its causes.
fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The request body: the entries' lines as one JSON array.
fn batch_body<'a>(entries: impl Iterator<Item = &'a OutboxEntry>) -> Vec<u8> {
    let mut body = vec![b'['];
    for (i, e) in entries.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&e.line);
    }
    body.push(b']');
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_a_json_array_of_the_lines() {
        let entry = |seq: u64| OutboxEntry {
            seq,
            vehicle: "v".into(),
            line: format!(r#"{{"id":"x{seq}","seq":{seq}}}"#).into_bytes(),
            committed_ms: 0,
        };
        let entries = [entry(1), entry(2)];
        let body = batch_body(entries.iter());
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(parsed[1]["seq"], 2);
        assert_eq!(parsed.as_array().map(Vec::len), Some(2));
        assert_eq!(batch_body([].iter()), b"[]");
    }
}
