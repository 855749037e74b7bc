//! `geogate partitions status`: each partition's lease holder, how far its
//! input goes, what its owner has committed, and what it came to, read
//! from the engine (so it works with every instance down).

use super::engine::{self, EngineError};
use crate::source::jetstream::stream_name;
use crate::state::partitioned::commit_body::{CommitBody, Totals};
use crate::state::partitioned::commit_log::last_commit;
use crate::state::partitioned::config::PartitionedConfig;
use crate::state::partitioned::lease::Leases;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct PartitionStatus {
    pub partition: u32,
    /// The lease's holder (`None`: never taken or released).
    pub holder: Option<String>,
    /// The input's last position.
    pub input_last: u64,
    /// The position the last commit took the state to.
    pub committed: u64,
    /// Messages in the input after the committed position.
    pub lag: u64,
    pub totals: Totals,
}

pub async fn read(config: &PartitionedConfig) -> Result<Vec<PartitionStatus>, EngineError> {
    let js = engine::connect(config, "geogate-status").await?;
    read_from(&js, config.partitions).await
}

/// [`read`] over a connection the caller has.
pub async fn read_from(
    js: &async_nats::jetstream::Context,
    partitions: u32,
) -> Result<Vec<PartitionStatus>, EngineError> {
    let jet = |e: String| EngineError::JetStream(e);
    let mut leases = Leases::open(js)
        .await
        .map_err(|e| jet(e.to_string()))?
        .all(partitions)
        .await
        .map_err(|e| jet(e.to_string()))?;
    let mut out = Vec::new();
    for p in 0..partitions {
        let holder = leases
            .remove(&p)
            .map(|l| l.holder)
            .filter(|h| !h.is_empty());
        let input_last = match js.get_stream(stream_name(p)).await {
            Ok(mut s) => {
                s.info()
                    .await
                    .map_err(|e| jet(e.to_string()))?
                    .state
                    .last_sequence
            }
            Err(_) => 0,
        };
        let last = last_commit(js, p).await.map_err(|e| jet(e.to_string()))?;
        let body = match last {
            Some(c) => Some(CommitBody::decode(&c.body).map_err(|e| jet(e.to_string()))?),
            None => None,
        };
        let committed = body.as_ref().map_or(0, |b| b.input_through);
        out.push(PartitionStatus {
            partition: p,
            holder,
            input_last,
            committed,
            lag: input_last.saturating_sub(committed),
            totals: body.map(|b| b.totals).unwrap_or_default(),
        });
    }
    Ok(out)
}
