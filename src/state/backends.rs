//! The one place that knows every backend: the configured one opened
//! behind the seam. A new backend adds its folder and one arm here.

use super::config::{StateBackend, StateConfig};
use super::{Backend, OpenContext, StateError, embedded, local, memory, redis};

/// Opens the configured backend and starts what delivers from it. A
/// backend that cannot start safely (a lost or stale state file, a
/// second process on the same file, an unreachable Redis) refuses here,
/// before anything is taken from the broker.
pub async fn open(config: &StateConfig, ctx: OpenContext) -> Result<Box<dyn Backend>, StateError> {
    match config.backend {
        StateBackend::Memory => {
            let opened = memory::open(ctx.events.as_deref())?;
            Ok(Box::new(local::LocalBackend::start(opened, config, ctx)?))
        }
        StateBackend::Embedded => {
            let opened = embedded::open(config, ctx.events.as_deref())?;
            Ok(Box::new(local::LocalBackend::start(opened, config, ctx)?))
        }
        StateBackend::Redis => Ok(Box::new(redis::RedisBackend::open(config, ctx).await?)),
        // Its shards come and go with ownership: `scale_out` runs it.
        StateBackend::Partitioned => Err(StateError::Shared(
            "backend = \"partitioned\" runs through geogate's scale-out, not one fixed set of shards".into(),
        )),
    }
}
