//! The metrics of the dead letter and every sink that can fail: each name
//! written once, here, with its description; the code records through these
//! constants.

use metrics::{Unit, describe_counter, describe_gauge};

pub const DEAD_LETTER_WRITTEN_TOTAL: &str = "geogate_dead_letter_written_total";
pub const DEAD_LETTER_RECORDS_DELETED_TOTAL: &str = "geogate_dead_letter_records_deleted_total";
pub const SINK_HEALTHY: &str = "geogate_sink_healthy";
pub const SINK_WRITE_FAILURES_TOTAL: &str = "geogate_sink_write_failures_total";

/// Describes them to the exporter.
pub fn describe() {
    describe_counter!(
        DEAD_LETTER_WRITTEN_TOTAL,
        Unit::Count,
        "Dead-letter records written, by reason."
    );
    describe_counter!(
        DEAD_LETTER_RECORDS_DELETED_TOTAL,
        Unit::Count,
        "Dead-letter records deleted because their file was rotated past dead_letter.rotate_keep."
    );
    describe_gauge!(
        SINK_HEALTHY,
        Unit::Count,
        "0 while a sink's writes fail (its messages stay unacked and are retried), 1 otherwise."
    );
    describe_counter!(
        SINK_WRITE_FAILURES_TOTAL,
        Unit::Count,
        "Failed write attempts per sink (dead_letter, events, state: a failed commit)."
    );
}
