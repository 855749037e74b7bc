//! The partitions' metrics: each name written once, here, with its
//! description.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

pub const PARTITIONS: &str = "geogate_partitions";
pub const PARTITION_OWNED: &str = "geogate_partition_owned";
pub const PARTITION_LAG_MESSAGES: &str = "geogate_partition_lag_messages";
pub const OWNERSHIP_CHANGES_TOTAL: &str = "geogate_partition_ownership_changes_total";
pub const FENCED_WRITES_TOTAL: &str = "geogate_partition_fenced_writes_total";
pub const OWNER_FAILURES_TOTAL: &str = "geogate_partition_owner_failures_total";
pub const SNAPSHOTS_TOTAL: &str = "geogate_partition_snapshots_total";
pub const PARTITION_COMMIT_SECONDS: &str = "geogate_partition_commit_seconds";

pub fn describe() {
    describe_gauge!(
        PARTITIONS,
        Unit::Count,
        "Partitions of the fleet (state.partitions): every instance reports it, so an alert can compare it with the partitions owned."
    );
    describe_gauge!(
        PARTITION_OWNED,
        Unit::Count,
        "1 for each partition this instance owns now, by partition; 0 for one it let go."
    );
    describe_gauge!(
        PARTITION_LAG_MESSAGES,
        Unit::Count,
        "Messages in the partition's input after the last one its owner read, by partition (reported by the owner)."
    );
    describe_counter!(
        OWNERSHIP_CHANGES_TOTAL,
        Unit::Count,
        "Partitions this instance took (change=taken), handed to another instance (change=handed_off) or lost to one (change=lost)."
    );
    describe_counter!(
        FENCED_WRITES_TOTAL,
        Unit::Count,
        "Commits or event publishes the engine refused because another owner had taken the partition over: each one is a deposed owner kept from writing."
    );
    describe_counter!(
        OWNER_FAILURES_TOTAL,
        Unit::Count,
        "Partition owners that ended on an error other than being deposed (the engine, an unreadable commit, a commit too large): the log says which; the partition rests a few seconds before this instance owns it again."
    );
    describe_counter!(
        SNAPSHOTS_TOTAL,
        Unit::Count,
        "Snapshots written to partition logs (the log before each is removed)."
    );
    describe_histogram!(
        PARTITION_COMMIT_SECONDS,
        Unit::Seconds,
        "One partition commit: the log append, and the publish of its transitions to the events stream."
    );
}
