//! The one place that knows every backend: the configured one opened
//! behind the seam. A new backend adds its folder and one arm here.

use super::config::{StateBackend, StateConfig};
use super::{Backend, OpenContext, StateError, embedded, local, memory};

/// Opens the configured backend and starts what delivers from it. A
/// backend that cannot start safely (a lost or stale state file, a
/// second process on the same file) refuses here, before anything is
/// taken from the broker.
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
        // `config check` refuses it with the way to migrate, so only a
        // config built in code gets here.
        StateBackend::Redis => Err(StateError::Unsupported(
            "backend = \"redis\" is retired (README, \"Migrating from the Redis state backend\"): use \"partitioned\" to run several instances, or \"embedded\" for one",
        )),
        // Its shards come and go with ownership: `scale_out` runs it.
        StateBackend::Partitioned => Err(StateError::Unsupported(
            "backend = \"partitioned\" runs through geogate's scale-out, not one fixed set of shards",
        )),
    }
}
