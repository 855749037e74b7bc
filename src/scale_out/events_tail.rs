//! `geogate partitions events`: the fleet's transitions as NDJSON, read
//! from the engine's events stream (every partition, in the order the
//! stream holds them; within a partition, in seq order), for a consumer
//! without a NATS client of its own, or an operator looking.

use super::engine::{self, EngineError};
use crate::jetstream_link::reader_after;
use crate::state::partitioned::config::PartitionedConfig;
use crate::state::partitioned::events_stream::STREAM;
use futures_util::StreamExt;
use std::io::Write;
use std::time::Duration;

/// Writes every line after stream position `after` to `out`; with
/// `follow`, keeps waiting for more until the process is stopped.
pub async fn tail(
    config: &PartitionedConfig,
    after: u64,
    follow: bool,
    out: &mut impl Write,
) -> Result<(), EngineError> {
    let jet = |e: String| EngineError::JetStream(e);
    let js = engine::connect(config, "geogate-events").await?;
    let stream = js
        .get_stream(STREAM)
        .await
        .map_err(|e| jet(format!("{STREAM}: {e} (no instance has published yet?)")))?;
    let reader = reader_after(&stream, after).await.map_err(jet)?;
    loop {
        let mut batch = reader
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .map_err(|e| jet(e.to_string()))?;
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| jet(e.to_string()))?;
            got += 1;
            match out.write_all(&message.payload).and_then(|()| out.flush()) {
                Ok(()) => {}
                // The reader has gone (`| head`): done, not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
                Err(e) => return Err(jet(format!("writing the lines out: {e}"))),
            }
        }
        if got == 0 && !follow {
            return Ok(());
        }
    }
}
