//! The Prometheus exporter. Each component names and describes its own
//! metrics in its `metrics` module; this one installs the exporter, has
//! every component describe its metrics, and creates the fixed-label
//! series at zero. Names follow Prometheus conventions (`_total` counters,
//! base units) and carry only bounded labels: shard, priority, reason,
//! gate, kind.

use crate::pipeline::metrics::{
    BACKPRESSURE_WAITS_TOTAL, DUPLICATES_IGNORED_TOTAL, EVENTS_ADMITTED_TOTAL,
    EVENTS_EVALUATED_TOTAL, EVENTS_IN_QUEUE, EVENTS_INVALID_TOTAL, EVENTS_RECEIVED_TOTAL,
    EVENTS_SHED_TOTAL, FIXES_HELD_TOTAL, FIXES_LATE_TOTAL, FIXES_RELEASED_TOTAL, GATE_LEVEL,
    MESSAGES_IGNORED_TOTAL, QUEUE_DEPTH,
};
use crate::problems::Problems;
use crate::sink::metrics::{
    DEAD_LETTER_RECORDS_DELETED_TOTAL, DEAD_LETTER_WRITTEN_TOTAL, SINK_HEALTHY,
    SINK_WRITE_FAILURES_TOTAL,
};
use crate::source::mqtt::metrics::{
    MQTT_ACKS_TOTAL, MQTT_CONNECTED, MQTT_LEFT_FOR_REDELIVERY_TOTAL, MQTT_RECONNECTS_TOTAL,
    MQTT_SUBSCRIBED, MQTT_UNACKED,
};
use crate::state::metrics::{FENCE_TRANSITIONS_TOTAL, MEMBERSHIP_OVERFLOW_TOTAL};
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
        EVENTS_RECEIVED_TOTAL,
        MQTT_RECONNECTS_TOTAL,
        MQTT_LEFT_FOR_REDELIVERY_TOTAL,
        FIXES_LATE_TOTAL,
        FIXES_HELD_TOTAL,
        FIXES_RELEASED_TOTAL,
        DEAD_LETTER_RECORDS_DELETED_TOTAL,
        MEMBERSHIP_OVERFLOW_TOTAL,
    ] {
        metrics::counter!(name).increment(0);
    }
    for reason in Reason::ALL {
        if reason.is_ignored() {
            metrics::counter!(MESSAGES_IGNORED_TOTAL, "reason" => reason.as_str()).increment(0);
        } else {
            metrics::counter!(EVENTS_INVALID_TOTAL, "reason" => reason.as_str()).increment(0);
            metrics::counter!(DEAD_LETTER_WRITTEN_TOTAL, "reason" => reason.as_str()).increment(0);
        }
    }
    for reason in ["shed", "late"] {
        metrics::counter!(DEAD_LETTER_WRITTEN_TOTAL, "reason" => reason).increment(0);
    }
    for kind in ["enter", "exit"] {
        metrics::counter!(FENCE_TRANSITIONS_TOTAL, "kind" => kind).increment(0);
    }
    for shard in 0..shards {
        let label = shard.to_string();
        metrics::counter!(EVENTS_SHED_TOTAL, "shard" => label.clone(), "gate" => gate).increment(0);
        metrics::counter!(EVENTS_EVALUATED_TOTAL, "shard" => label.clone()).increment(0);
        metrics::counter!(BACKPRESSURE_WAITS_TOTAL, "shard" => label.clone()).increment(0);
        for p in ["low", "high"] {
            metrics::counter!(EVENTS_ADMITTED_TOTAL, "shard" => label.clone(), "priority" => p)
                .increment(0);
        }
        metrics::gauge!(GATE_LEVEL, "shard" => label.clone()).increment(0.0);
        metrics::gauge!(QUEUE_DEPTH, "shard" => label).increment(0.0);
    }
    for outcome in ["acked", "withheld_old_connection", "withheld_superseded"] {
        metrics::counter!(MQTT_ACKS_TOTAL, "outcome" => outcome).increment(0);
    }
    for by in ["window", "state"] {
        metrics::counter!(DUPLICATES_IGNORED_TOTAL, "by" => by).increment(0);
    }
    for sink in ["dead_letter", "events", "state"] {
        metrics::counter!(SINK_WRITE_FAILURES_TOTAL, "sink" => sink).increment(0);
        // Healthy until a write fails: a sink nobody has written to yet is
        // not broken.
        metrics::gauge!(SINK_HEALTHY, "sink" => sink).set(1.0);
    }
    metrics::gauge!(MQTT_CONNECTED).increment(0.0);
    metrics::gauge!(MQTT_SUBSCRIBED).increment(0.0);
    metrics::gauge!(EVENTS_IN_QUEUE).increment(0.0);
    metrics::gauge!(MQTT_UNACKED).increment(0.0);
}

fn describe() {
    crate::source::mqtt::metrics::describe();
    crate::pipeline::metrics::describe();
    crate::sink::metrics::describe();
    crate::state::metrics::describe();
    crate::state::partitioned::metrics::describe();
    crate::delivery::metrics::describe();
    crate::allowance::metrics::describe();
}
