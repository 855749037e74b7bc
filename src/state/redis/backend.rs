//! The redis backend behind the seam: [`SharedStage`] (Redis reached and
//! checked, the outbox consumer delivering through [`crate::delivery`])
//! as a [`Backend`], and each shard's [`SharedApplier`] as its
//! [`ShardState`]. Nothing of the vehicles is kept in this process: each
//! fix is probed against the local fences and the batch applied in Redis.

use super::{SharedApplier, SharedStage};
use crate::geofence::{FenceIndex, VehicleSnapshot};
use crate::model::VehicleId;
use crate::shutdown::Drain;
use crate::state::StateConfig;
use crate::state::metrics::RuleCounters;
use crate::state::{
    Backend, Batch, BoxFuture, Completion, OpenContext, Outcomes, ShardState, StateError, Stopped,
};
use std::sync::Arc;

pub struct RedisBackend {
    stage: SharedStage,
    settings: crate::geofence::EvaluatorSettings,
    drain: Drain,
}

impl RedisBackend {
    /// Connects and starts delivering to the events file, which this
    /// backend needs: every instance writes what it takes from the
    /// streams there.
    pub async fn open(config: &StateConfig, ctx: OpenContext) -> Result<Self, StateError> {
        let Some(events) = ctx.events.as_deref() else {
            return Err(StateError::Shared(
                "the redis backend delivers transitions to events.path, which is not set".into(),
            ));
        };
        let stage = SharedStage::start(
            config,
            &ctx.settings,
            events,
            &ctx.instance,
            ctx.outputs,
            ctx.fence_fingerprint,
            ctx.drain.clone(),
        )
        .await?;
        Ok(Self {
            stage,
            settings: ctx.settings,
            drain: ctx.drain,
        })
    }
}

impl Backend for RedisBackend {
    fn take_restored(&mut self) -> Vec<(VehicleId, VehicleSnapshot)> {
        Vec::new()
    }

    fn shard(
        &mut self,
        _shard: usize,
        index: Arc<FenceIndex>,
        _restored: Vec<(VehicleId, VehicleSnapshot)>,
    ) -> Box<dyn ShardState> {
        Box::new(RedisShard {
            applier: self.stage.applier(index, self.settings),
            drain: self.drain.clone(),
            rules: RuleCounters::default(),
        })
    }

    fn finish(self: Box<Self>) -> BoxFuture<'static, ()> {
        Box::pin(self.stage.finish())
    }
}

struct RedisShard {
    applier: SharedApplier,
    drain: Drain,
    rules: RuleCounters,
}

impl ShardState for RedisShard {
    fn apply<'a>(
        &'a mut self,
        batch: Batch<'a>,
        done: Box<dyn Completion>,
    ) -> BoxFuture<'a, Result<(), Stopped>> {
        if let Some(index) = batch.fences {
            self.applier.swap_index(index);
        }
        for (i, fix) in batch.fixes.iter().enumerate() {
            self.applier.add(i, fix);
        }
        Box::pin(async move {
            if batch.fixes.is_empty() {
                done.complete(Outcomes::default());
                return Ok(());
            }
            let Some(counts) = self.applier.apply(&self.drain).await else {
                // Past the drain deadline: the batch stays unacked.
                return Err(Stopped);
            };
            self.rules
                .record(counts.enters, counts.exits, counts.overflows);
            done.complete(Outcomes {
                evaluated: counts.evaluated,
                late: counts.late,
                duplicates: counts.duplicates,
                enters: counts.enters,
                exits: counts.exits,
                ..Outcomes::default()
            });
            Ok(())
        })
    }
}
