//! What can go wrong holding a partition: another instance took it (a
//! normal event: this one steps down), or the engine failed.

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error(
        "partition {partition}: another owner has committed since sequence {expected}: this instance no longer owns the partition"
    )]
    Deposed { partition: u32, expected: u64 },
    #[error("partition {partition}: its lease was taken by another instance")]
    LeaseLost { partition: u32 },
    #[error(
        "partition {partition}: the commit log starts at {found}, not {expected}: commits before a snapshot were removed while this instance read them"
    )]
    Gap {
        partition: u32,
        expected: u64,
        found: u64,
    },
    #[error("partition {partition}: commit {seq} cannot be read: {detail}")]
    Unreadable {
        partition: u32,
        seq: u64,
        detail: String,
    },
    #[error("partition {partition}: {what}: {detail}")]
    Engine {
        partition: u32,
        /// The stream or subject the engine was asked about.
        what: String,
        detail: String,
    },
}

impl PartitionError {
    pub(super) fn engine(partition: u32, what: &str, e: impl std::fmt::Display) -> Self {
        Self::Engine {
            partition,
            what: what.to_owned(),
            detail: e.to_string(),
        }
    }
}
