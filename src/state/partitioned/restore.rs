//! How a new owner finds a partition's state: the last commit names the
//! base (the latest snapshot's first part), and the log from there on
//! replays to the state ([`Mirror`]).

use super::PartitionError;
use super::commit_body::CommitBody;
use super::commit_log::{last_commit, read_after};
use super::mirror::Mirror;
use async_nats::jetstream;

/// Reads made again when the owner before purged the log under this one
/// (it finished a snapshot meanwhile): the next read starts at that
/// snapshot.
const ATTEMPTS: usize = 5;

/// The partition's state as its log holds it.
pub async fn load(js: &jetstream::Context, partition: u32) -> Result<Mirror, PartitionError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(last) = last_commit(js, partition).await? else {
            return Ok(Mirror::default());
        };
        let base = decode(partition, last.seq, &last.body)?.base;
        let commits = match read_after(js, partition, base.max(1) - 1).await {
            Err(PartitionError::Gap { .. }) if attempt < ATTEMPTS => continue,
            read => read?,
        };
        let mut mirror = Mirror::default();
        for commit in commits {
            let body = decode(partition, commit.seq, &commit.body)?;
            mirror
                .apply(commit.seq, &body)
                .map_err(|e| PartitionError::Unreadable {
                    partition,
                    seq: commit.seq,
                    detail: e.to_string(),
                })?;
        }
        return Ok(mirror);
    }
}

pub fn decode(partition: u32, seq: u64, bytes: &[u8]) -> Result<CommitBody, PartitionError> {
    CommitBody::decode(bytes).map_err(|e| PartitionError::Unreadable {
        partition,
        seq,
        detail: e.to_string(),
    })
}
