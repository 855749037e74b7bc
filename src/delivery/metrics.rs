//! The metrics of delivery: each name written once, here, with its
//! description; the code records through these constants.

use metrics::{Unit, describe_counter};

pub const EVENTS_PUBLISH_SKIPPED_TOTAL: &str = "geogate_events_publish_skipped_total";

/// Describes them to the exporter.
pub fn describe() {
    describe_counter!(
        EVENTS_PUBLISH_SKIPPED_TOTAL,
        Unit::Count,
        "Transitions not published over MQTT because their vehicle id is not a valid topic level (they are in the events file)."
    );
}
