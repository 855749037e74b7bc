//! Which fence sets the live instances run. The shared rules give the same
//! result whichever instance probes a fix only if every instance probes
//! with the same fences and settings: during a rollout of a new fence file
//! they do not, and a vehicle can flap between two answers. That window is
//! made visible rather than silent: each instance registers its fence
//! set's fingerprint every housekeeping pass, and
//! `geogate_fence_sets_live` counts the distinct ones among instances
//! heard from within `claim_idle_s` (alert `GeogateFenceSetsDiffer`).

use crate::redis_link::RedisLink;
use crate::state::metrics::FENCE_SETS_LIVE;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::watch;

const SCRIPT: &str = include_str!("fence_sets.lua");

pub struct FenceSets {
    key: String,
    me: String,
    ours: watch::Receiver<String>,
    window: Duration,
    script: redis::Script,
    live: metrics::Gauge,
    /// What was last logged, so a disagreement is logged when it changes.
    last_seen: BTreeMap<String, Vec<String>>,
}

impl FenceSets {
    pub fn new(key: String, me: &str, ours: watch::Receiver<String>, window: Duration) -> Self {
        Self {
            key,
            me: me.to_owned(),
            ours,
            window,
            script: redis::Script::new(SCRIPT),
            live: metrics::gauge!(FENCE_SETS_LIVE),
            last_seen: BTreeMap::new(),
        }
    }

    /// Registers this instance's current fence set and updates the gauge.
    pub async fn register(&mut self, link: &mut RedisLink) -> Result<(), String> {
        let ours = self.ours.borrow().clone();
        let flat: Vec<String> = self
            .script
            .key(&self.key)
            .arg(&self.me)
            .arg(&ours)
            .arg(self.window.as_millis() as u64)
            .invoke_async(link)
            .await
            .map_err(|e| e.to_string())?;
        let mut by_set: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pair in flat.chunks_exact(2) {
            by_set
                .entry(pair[1].clone())
                .or_default()
                .push(pair[0].clone());
        }
        self.live.set(by_set.len() as f64);
        if by_set.len() > 1 && by_set != self.last_seen {
            tracing::warn!(
                "instances run different fence sets (fingerprint: instances): {by_set:?}; this one runs {ours}. Until they agree, a vehicle's transitions depend on which instance gets its fixes"
            );
        }
        self.last_seen = by_set;
        Ok(())
    }

    /// Leaves the register, so a stopped instance does not count as live.
    pub async fn leave(&mut self, link: &mut RedisLink) {
        let left: redis::RedisResult<Vec<String>> = self
            .script
            .key(&self.key)
            .arg(&self.me)
            .arg("")
            .arg(self.window.as_millis() as u64)
            .invoke_async(link)
            .await;
        if let Err(e) = left {
            tracing::warn!("fence sets: could not leave the register: {e}");
        }
    }
}
