//! The metrics of the global allowance: each name written once, here, with its
//! description; the code records through these constants.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const GLOBAL_ALLOWANCE_TAKEN_TOKENS_TOTAL: &str = "geogate_global_allowance_taken_tokens_total";
pub const GLOBAL_ALLOWANCE_SPENT_TOKENS_TOTAL: &str = "geogate_global_allowance_spent_tokens_total";
pub const GLOBAL_ALLOWANCE_FAIL_OPEN_ADMITTED_TOTAL: &str =
    "geogate_global_allowance_fail_open_admitted_total";
pub const GLOBAL_ALLOWANCE_RESERVE_TOKENS: &str = "geogate_global_allowance_reserve_tokens";
pub const GLOBAL_ALLOWANCE_CONNECTED: &str = "geogate_global_allowance_connected";
pub const GLOBAL_ALLOWANCE_ERRORS_TOTAL: &str = "geogate_global_allowance_errors_total";
pub const GLOBAL_ALLOWANCE_FAIL_MODE_SECONDS: &str = "geogate_global_allowance_fail_mode_seconds";
pub const GLOBAL_ALLOWANCE_ROUND_TRIP_SECONDS: &str = "geogate_global_allowance_round_trip_seconds";

/// Describes them to the exporter.
pub fn describe() {
    describe_counter!(
        GLOBAL_ALLOWANCE_TAKEN_TOKENS_TOTAL,
        Unit::Count,
        "Tokens this instance took from the shared Redis bucket into its local reserve."
    );
    describe_counter!(
        GLOBAL_ALLOWANCE_SPENT_TOKENS_TOTAL,
        Unit::Count,
        "Tokens spent from the local reserve on low-priority events above the watermark."
    );
    describe_counter!(
        GLOBAL_ALLOWANCE_FAIL_OPEN_ADMITTED_TOTAL,
        Unit::Count,
        "Low-priority events admitted without payment while Redis was unreachable (fail_mode = open)."
    );
    describe_gauge!(
        GLOBAL_ALLOWANCE_RESERVE_TOKENS,
        Unit::Count,
        "Tokens held in this instance's local reserve (at most gate.global.reserve)."
    );
    describe_gauge!(
        GLOBAL_ALLOWANCE_CONNECTED,
        Unit::Count,
        "1 while Redis answers the allowance's calls, 0 during an outage."
    );
    describe_counter!(
        GLOBAL_ALLOWANCE_ERRORS_TOTAL,
        Unit::Count,
        "Failed or timed-out calls to Redis for the allowance."
    );
    describe_gauge!(
        GLOBAL_ALLOWANCE_FAIL_MODE_SECONDS,
        Unit::Seconds,
        "Seconds spent with Redis unreachable since start, labelled by fail_mode."
    );
    describe_histogram!(
        GLOBAL_ALLOWANCE_ROUND_TRIP_SECONDS,
        Unit::Seconds,
        "One refill from the shared bucket: the script call's round trip."
    );
}
