//! The Prometheus exporter and metric descriptions. Metric names follow
//! Prometheus conventions (`_total` counters, base units) and carry only
//! bounded labels: shard, priority, reason, gate, kind.

use crate::problems::Problems;
use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::PrometheusBuilder;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
#[error("metrics exporter on {addr}: {message}")]
pub struct MetricsError {
    addr: SocketAddr,
    message: String,
}

/// `[metrics]`: the exporter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Prometheus exporter address; loopback unless you mean otherwise.
    pub listen: String,
    pub enabled: bool,
    /// Opt-in: label transitions by fence id. One series per fence, so
    /// only for fence sets small enough for Prometheus to hold.
    pub per_fence_labels: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9464".into(),
            enabled: true,
            per_fence_labels: false,
        }
    }
}

impl MetricsConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.enabled && self.listen.parse::<SocketAddr>().is_err() {
            problems.add(
                "metrics.listen",
                format!("{:?} is not an address like 127.0.0.1:9464", self.listen),
            );
        }
    }
}

/// One in this many is recorded in the two histograms that every message
/// would otherwise feed: `geogate_evaluation_duration_seconds` (each
/// worker's evaluations) and `geogate_end_to_end_latency_seconds` (each
/// shard's finished messages). Why not every one: a recording costs a
/// clock read, atomic operations and a memory fence in the exporter, then
/// its share of the next scrape's drain; `perf` put the evaluation's timing
/// at about 3% of the in-process pipeline, more than the evaluation itself
/// (2.5%), and callgrind the end-to-end one at about 190 instructions per
/// message, against about 3,000 for every stage after decoding together.
/// Quantiles need a fair sample, and a fixed stride is one. Seven, not
/// eight: batches and bursts are multiples of 8, so every eighth would keep
/// landing on the same places in each batch, such as its first, cold
/// evaluation.
pub const SAMPLE_EVERY: u64 = 7;

/// Latency buckets from 10 µs to 10 s, roughly ×2.5 apart.
const LATENCY_BUCKETS: [f64; 16] = [
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
    10.0,
];

/// Installs the global recorder and serves `/metrics` on `addr`.
pub fn install(addr: SocketAddr) -> Result<(), MetricsError> {
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets(&LATENCY_BUCKETS)
        .and_then(|b| b.install())
        .map_err(|e| MetricsError {
            addr,
            message: e.to_string(),
        })?;
    describe();
    Ok(())
}

/// Creates every fixed-label series at zero, so that dashboards and alerts
/// see a series (and a rate of 0) before the first event of a kind: a panel
/// that shows "no data" until something goes wrong hides the wrong thing.
pub fn register_zero_series(shards: usize, gate: &'static str) {
    use crate::codec::Reason;
    for name in [
        "geogate_events_received_total",
        "geogate_mqtt_reconnects_total",
        "geogate_mqtt_left_for_redelivery_total",
        "geogate_fixes_out_of_order_total",
        "geogate_dead_letter_records_deleted_total",
        "geogate_membership_overflow_total",
    ] {
        metrics::counter!(name).increment(0);
    }
    for reason in Reason::ALL {
        metrics::counter!("geogate_events_invalid_total", "reason" => reason.as_str()).increment(0);
        metrics::counter!("geogate_dead_letter_written_total", "reason" => reason.as_str())
            .increment(0);
    }
    metrics::counter!("geogate_dead_letter_written_total", "reason" => "shed").increment(0);
    for kind in ["enter", "exit"] {
        metrics::counter!("geogate_fence_transitions_total", "kind" => kind).increment(0);
    }
    for shard in 0..shards {
        let label = shard.to_string();
        metrics::counter!("geogate_events_shed_total", "shard" => label.clone(), "gate" => gate)
            .increment(0);
        metrics::counter!("geogate_events_evaluated_total", "shard" => label.clone()).increment(0);
        metrics::counter!("geogate_backpressure_waits_total", "shard" => label.clone())
            .increment(0);
        for p in ["low", "high"] {
            metrics::counter!("geogate_events_admitted_total", "shard" => label.clone(), "priority" => p).increment(0);
        }
        metrics::gauge!("geogate_gate_level", "shard" => label.clone()).increment(0.0);
        metrics::gauge!("geogate_queue_depth", "shard" => label).increment(0.0);
    }
    for outcome in ["acked", "withheld_old_connection", "withheld_superseded"] {
        metrics::counter!("geogate_mqtt_acks_total", "outcome" => outcome).increment(0);
    }
    for by in ["window", "state"] {
        metrics::counter!("geogate_duplicates_ignored_total", "by" => by).increment(0);
    }
    for sink in ["dead_letter", "events", "state"] {
        metrics::counter!("geogate_sink_write_failures_total", "sink" => sink).increment(0);
        // Healthy until a write fails: a sink nobody has written to yet is
        // not broken.
        metrics::gauge!("geogate_sink_healthy", "sink" => sink).set(1.0);
    }
    metrics::gauge!("geogate_mqtt_connected").increment(0.0);
    metrics::gauge!("geogate_mqtt_subscribed").increment(0.0);
    metrics::gauge!("geogate_events_in_queue").increment(0.0);
    metrics::gauge!("geogate_mqtt_unacked").increment(0.0);
}

fn describe() {
    describe_counter!(
        "geogate_events_received_total",
        Unit::Count,
        "Messages the router has taken from the source (the received term of the accounting line)."
    );
    describe_counter!(
        "geogate_events_invalid_total",
        Unit::Count,
        "Messages refused by the codec, by reason."
    );
    describe_counter!(
        "geogate_events_admitted_total",
        Unit::Count,
        "Events enqueued to a shard, by shard and priority."
    );
    describe_counter!(
        "geogate_events_shed_total",
        Unit::Count,
        "Low-priority events refused by a shard's gate above the watermark."
    );
    describe_counter!(
        "geogate_dead_letter_written_total",
        Unit::Count,
        "Dead-letter records written, by reason."
    );
    describe_gauge!(
        "geogate_queue_depth",
        Unit::Count,
        "Events in a shard's queue at the last admission."
    );
    describe_gauge!(
        "geogate_queue_capacity",
        Unit::Count,
        "Capacity of a shard's queue."
    );
    describe_gauge!(
        "geogate_gate_level",
        Unit::Count,
        "Gate level at the last gated decision: tokens, fill or backlog."
    );
    describe_counter!(
        "geogate_events_evaluated_total",
        Unit::Count,
        "Fixes evaluated against the fences, by shard."
    );
    describe_histogram!(
        "geogate_evaluation_duration_seconds",
        Unit::Seconds,
        format!(
            "Time to evaluate one fix, sampled: every {SAMPLE_EVERY}th evaluation of each worker is timed (memory and embedded state), so the count is about 1/{SAMPLE_EVERY} of the fixes evaluated. Where a worker looks up a batch's fences together (a fence set past the cache), each sample carries an equal share of that lookup."
        )
    );
    describe_histogram!(
        "geogate_end_to_end_latency_seconds",
        Unit::Seconds,
        format!(
            "Receive to finished (evaluated and committed, its transitions written), sampled: one finished message in {SAMPLE_EVERY} of each shard, so the count is about 1/{SAMPLE_EVERY} of the messages finished."
        )
    );
    describe_counter!(
        "geogate_fence_transitions_total",
        Unit::Count,
        "Enter and exit transitions emitted."
    );
    describe_gauge!(
        "geogate_mqtt_connected",
        Unit::Count,
        "1 while the intake connection is up."
    );
    describe_counter!(
        "geogate_mqtt_reconnects_total",
        Unit::Count,
        "Intake connection errors followed by a reconnect."
    );
    describe_gauge!(
        "geogate_mqtt_unacked",
        Unit::Count,
        "QoS 1 messages received and not yet acked."
    );
    describe_gauge!(
        "geogate_queue_watermark",
        Unit::Count,
        "Configured watermark as a fraction of queue capacity (for dashboards)."
    );
    describe_counter!(
        "geogate_gate_admitted_total",
        Unit::Count,
        "Low-priority events the gate admitted above the watermark; bounded by b + r·t per shard."
    );
    describe_counter!(
        "geogate_backpressure_waits_total",
        Unit::Count,
        "High-priority events that found their shard queue full and waited (never shed)."
    );
    describe_counter!(
        "geogate_fixes_out_of_order_total",
        Unit::Count,
        "Fixes older than the vehicle's last applied fix: changed nothing (the out_of_order term of the accounting line)."
    );
    describe_gauge!(
        "geogate_mqtt_subscribed",
        Unit::Count,
        "1 once a SUBACK has confirmed every filter on the current connection."
    );
    describe_counter!(
        "geogate_mqtt_acks_total",
        Unit::Count,
        "Finished QoS 1 messages by outcome: acked on their own connection, or withheld (their connection is gone, or a later copy with the same packet id carries the ack)."
    );
    describe_counter!(
        "geogate_membership_overflow_total",
        Unit::Count,
        "Enters not recorded because the vehicle already held fences.max_memberships fences."
    );
    describe_counter!(
        "geogate_dead_letter_records_deleted_total",
        Unit::Count,
        "Dead-letter records deleted because their file was rotated past dead_letter.rotate_keep."
    );
    describe_gauge!(
        "geogate_sink_healthy",
        Unit::Count,
        "0 while a sink's writes fail (its messages stay unacked and are retried), 1 otherwise."
    );
    describe_counter!(
        "geogate_sink_write_failures_total",
        Unit::Count,
        "Failed write attempts per sink (dead_letter, events, state: a failed commit)."
    );
    describe_counter!(
        "geogate_duplicates_ignored_total",
        Unit::Count,
        "Redelivered fixes recognised and not applied again: by the codec's dedup window, or by the vehicle state (after a restart). Counted under invalid, reason duplicate."
    );
    describe_histogram!(
        "geogate_state_commit_duration_seconds",
        Unit::Seconds,
        "One state transaction: the vehicle records and outbox entries of every batch waiting for it (backend = redis: one batch's script calls, all partitions)."
    );
    describe_histogram!(
        "geogate_state_commit_batches",
        Unit::Count,
        "Worker batches per state transaction (group commit)."
    );
    describe_counter!(
        "geogate_global_allowance_taken_tokens_total",
        Unit::Count,
        "Tokens this instance took from the shared Redis bucket into its local reserve."
    );
    describe_counter!(
        "geogate_global_allowance_spent_tokens_total",
        Unit::Count,
        "Tokens spent from the local reserve on low-priority events above the watermark."
    );
    describe_counter!(
        "geogate_global_allowance_fail_open_admitted_total",
        Unit::Count,
        "Low-priority events admitted without payment while Redis was unreachable (fail_mode = open)."
    );
    describe_gauge!(
        "geogate_global_allowance_reserve_tokens",
        Unit::Count,
        "Tokens held in this instance's local reserve (at most gate.global.reserve)."
    );
    describe_gauge!(
        "geogate_global_allowance_connected",
        Unit::Count,
        "1 while Redis answers the allowance's calls, 0 during an outage."
    );
    describe_counter!(
        "geogate_global_allowance_errors_total",
        Unit::Count,
        "Failed or timed-out calls to Redis for the allowance."
    );
    describe_gauge!(
        "geogate_global_allowance_fail_mode_seconds",
        Unit::Seconds,
        "Seconds spent with Redis unreachable since start, labelled by fail_mode."
    );
    describe_histogram!(
        "geogate_global_allowance_round_trip_seconds",
        Unit::Seconds,
        "One refill from the shared bucket: the script call's round trip."
    );
    describe_counter!(
        "geogate_state_redis_errors_total",
        Unit::Count,
        "Failed calls to the shared state in Redis (backend = redis): the batch stays unacked and is retried."
    );
    describe_gauge!(
        "geogate_state_redis_connected",
        Unit::Count,
        "1 while the shared state's Redis answers (backend = redis), 0 during an outage."
    );
    describe_gauge!(
        "geogate_state_redis_unavailable_seconds",
        Unit::Seconds,
        "Seconds the shared state's Redis has not answered since start (backend = redis)."
    );
    describe_counter!(
        "geogate_outbox_delivered_total",
        Unit::Count,
        "Transitions this instance took from the shared outbox streams and wrote to its events file."
    );
    describe_counter!(
        "geogate_outbox_claimed_total",
        Unit::Count,
        "Outbox entries taken over from an instance silent for longer than state.claim_idle_s."
    );
    describe_gauge!(
        "geogate_outbox_pending_entries",
        Unit::Count,
        "Outbox entries the consumer group has handed out and not had acked, over all partitions (the same from every instance)."
    );
    describe_gauge!(
        "geogate_outbox_lag_entries",
        Unit::Count,
        "Outbox entries not yet handed out to any instance, over all partitions (Redis 7 or later)."
    );
    describe_gauge!(
        "geogate_fence_sets_live",
        Unit::Count,
        "Distinct fence sets (fence file and rule settings) among the live instances sharing state; above 1 while a rollout is half done."
    );
    describe_gauge!(
        "geogate_state_store_bytes",
        Unit::Bytes,
        "Bytes the state store occupies (file and write-ahead log); 0 for the memory backend."
    );
    describe_gauge!(
        "geogate_events_in_queue",
        Unit::Count,
        "Taken and not finished: the in_queue term of the accounting line."
    );
    describe_counter!(
        "geogate_fence_transitions_by_fence_total",
        Unit::Count,
        "Transitions per fence; only with metrics.per_fence_labels = true."
    );
    describe_counter!(
        "geogate_mqtt_left_for_redelivery_total",
        Unit::Count,
        "Messages left unacked during shutdown for the broker to redeliver."
    );
}
