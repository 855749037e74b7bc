//! Keeps one instance's reserve topped up from the shared bucket, and is
//! the only place that talks to Redis for the allowance: it connects (and
//! reconnects), notices outages, and counts them.

use super::{GlobalAllowance, SharedBucket};
use crate::allowance::metrics::{
    GLOBAL_ALLOWANCE_CONNECTED, GLOBAL_ALLOWANCE_ERRORS_TOTAL, GLOBAL_ALLOWANCE_FAIL_MODE_SECONDS,
    GLOBAL_ALLOWANCE_RESERVE_TOKENS, GLOBAL_ALLOWANCE_ROUND_TRIP_SECONDS,
    GLOBAL_ALLOWANCE_TAKEN_TOKENS_TOTAL,
};
use crate::backoff::Backoff;
use crate::redis_link::{RedisLink, RedisSecurity};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where the refiller finds Redis.
#[derive(Debug, Clone)]
pub struct RedisTarget {
    pub urls: Vec<String>,
    pub cluster: bool,
    /// For each connect and each reply.
    pub timeout: Duration,
    pub security: RedisSecurity,
}

/// The longest a refiller waits for a bucket that said it is empty before
/// asking again: a hint from a busy bucket goes stale quickly.
const MAX_HINT_WAIT: Duration = Duration::from_millis(250);

/// How often an idle refiller checks that Redis still answers.
const HEALTH_CHECK: Duration = Duration::from_secs(1);

/// Runs until aborted (at shutdown; the reserve still held is forfeited,
/// which only ever admits less).
pub async fn refill(allowance: Arc<GlobalAllowance>, bucket: SharedBucket, target: RedisTarget) {
    let mode = allowance.fail_mode().as_str();
    let connected = metrics::gauge!(GLOBAL_ALLOWANCE_CONNECTED);
    let errors = metrics::counter!(GLOBAL_ALLOWANCE_ERRORS_TOTAL);
    let fail_seconds = metrics::gauge!(GLOBAL_ALLOWANCE_FAIL_MODE_SECONDS, "mode" => mode);
    let taken = metrics::counter!(GLOBAL_ALLOWANCE_TAKEN_TOKENS_TOTAL);
    let reserve = metrics::gauge!(GLOBAL_ALLOWANCE_RESERVE_TOKENS);
    let round_trip = metrics::histogram!(GLOBAL_ALLOWANCE_ROUND_TRIP_SECONDS);
    let mut link: Option<RedisLink> = None;
    let mut backoff = Backoff::new();
    // While Redis is unreachable: when the time in fail mode was last counted.
    let mut failing_since: Option<Instant> = None;
    loop {
        reserve.set(allowance.held() as f64);
        // Below one cost there is nothing to take: a PING keeps the
        // connection state (and the outage metrics) current instead.
        let asked = allowance.shortfall();
        let result = async {
            if link.is_none() {
                link = Some(
                    RedisLink::connect(
                        &target.urls,
                        target.cluster,
                        target.timeout,
                        &target.security,
                    )
                    .await
                    .map_err(|e| e.to_string())?,
                );
            }
            let Some(conn) = link.as_mut() else {
                return Err("no connection".to_owned());
            };
            let started = Instant::now();
            let grant = if asked < bucket.cost.into() {
                let ping = redis::cmd("PING");
                tokio::time::timeout(target.timeout, ping.query_async::<String>(conn))
                    .await
                    .map_err(|_| format!("no reply within {:?}", target.timeout))?
                    .map_err(|e| e.to_string())?;
                None
            } else {
                let take = bucket.take(conn, asked);
                let grant = tokio::time::timeout(target.timeout, take)
                    .await
                    .map_err(|_| format!("no reply within {:?}", target.timeout))?
                    .map_err(|e| e.to_string())?;
                round_trip.record(started.elapsed().as_secs_f64());
                Some(grant)
            };
            Ok(grant)
        }
        .await;
        match result {
            Ok(grant) => {
                if let Some(since) = failing_since.take() {
                    fail_seconds.increment(since.elapsed().as_secs_f64());
                    tracing::info!("global allowance: Redis answers again");
                }
                connected.set(1.0);
                allowance.set_reachable(true);
                backoff.reset();
                if let Some(grant) = grant {
                    allowance.add(grant.tokens);
                    allowance.set_retry_after_us(grant.retry_after_us);
                    taken.increment(grant.tokens);
                    reserve.set(allowance.held() as f64);
                    if grant.tokens < asked {
                        // The bucket is short: asking again before it can
                        // have earned the rest would only load Redis.
                        let earn =
                            Duration::from_secs_f64((asked - grant.tokens) as f64 / bucket.rate);
                        let wait = Duration::from_micros(grant.retry_after_us).max(earn);
                        tokio::time::sleep(wait.min(MAX_HINT_WAIT)).await;
                        continue;
                    }
                }
            }
            Err(e) => {
                errors.increment(1);
                connected.set(0.0);
                allowance.set_reachable(false);
                let now = Instant::now();
                match failing_since.replace(now) {
                    Some(since) => fail_seconds.increment((now - since).as_secs_f64()),
                    None => tracing::warn!(
                        "global allowance: Redis {} unreachable ({e}); fail_mode = {mode}",
                        target.urls.join(",")
                    ),
                }
                // A connection that failed mid-call is dropped and made
                // anew, so a restarted server is found again.
                link = None;
                tokio::time::sleep(backoff.step()).await;
                continue;
            }
        }
        // Until spending brings the reserve down to half; an idle instance
        // still checks Redis every HEALTH_CHECK, so the metrics show an
        // outage when it starts, not when the reserve next runs low.
        let _ = tokio::time::timeout(HEALTH_CHECK, allowance.wake.notified()).await;
    }
}
