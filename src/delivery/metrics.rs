//! The metrics of delivery: each name written once, here, with its
//! description; the code records through these constants.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const EVENTS_PUBLISH_SKIPPED_TOTAL: &str = "geogate_events_publish_skipped_total";
pub const OUTPUT_DELIVERED_TOTAL: &str = "geogate_output_delivered_total";
pub const OUTPUT_EXPIRED_TOTAL: &str = "geogate_output_expired_total";
pub const OUTPUT_RETRIES_TOTAL: &str = "geogate_output_retries_total";
pub const OUTPUT_PENDING_ENTRIES: &str = "geogate_output_pending_entries";
pub const OUTPUT_LATENCY_SECONDS: &str = "geogate_output_latency_seconds";

/// An output's labels: `key` (`output`, or `sink` for its health) names
/// it; with partitioned state, each partition's owner runs the partition's
/// own, labelled with it.
pub fn output_labels(
    key: &'static str,
    output: &'static str,
    partition: Option<u32>,
) -> Vec<(&'static str, String)> {
    let mut labels = vec![(key, output.to_owned())];
    if let Some(p) = partition {
        labels.push(("partition", p.to_string()));
    }
    labels
}

/// Describes them to the exporter.
pub fn describe() {
    describe_counter!(
        EVENTS_PUBLISH_SKIPPED_TOTAL,
        Unit::Count,
        "Transitions not published over MQTT because their vehicle id is not a valid topic level (they are in the events file)."
    );
    describe_counter!(
        OUTPUT_DELIVERED_TOTAL,
        Unit::Count,
        "Transitions an output after the events file (mqtt, webhook) confirmed delivered."
    );
    describe_counter!(
        OUTPUT_EXPIRED_TOTAL,
        Unit::Count,
        "Transitions an output could not deliver within its maximum age: written to the dead letter as <output>_expired."
    );
    describe_counter!(
        OUTPUT_RETRIES_TOTAL,
        Unit::Count,
        "Transitions an output sent again (a failed or refused attempt, a lost session)."
    );
    describe_gauge!(
        OUTPUT_PENDING_ENTRIES,
        Unit::Count,
        "Transitions queued for an output and not yet delivered; at events.max_pending the relay holds acks (intake pushes back)."
    );
    describe_histogram!(
        OUTPUT_LATENCY_SECONDS,
        Unit::Seconds,
        "From a transition's commit to its output confirming delivery."
    );
}
