//! One worker's side of the shared state: probes each fix against the
//! local fences, then applies the batch in Redis, one script call per
//! partition, all partitions at once. The batch's messages are finished
//! (acked) only after every call succeeded; a failing Redis is retried with
//! backoff until the drain deadline, holding the messages unacked.

use super::{FixFacts, SharedRules};
use crate::backoff::Backoff;
use crate::geofence::probe::{ProbeScratch, probe, widest_band};
use crate::geofence::{EvaluatorSettings, FenceIndex, Fix, FixOutcome};
use crate::redis_link::RedisLink;
use crate::shutdown::Drain;
use crate::state::Late;
use crate::state::metrics::{STATE_COMMIT_DURATION_SECONDS, STATE_REDIS_ERRORS_TOTAL};
use geo::Coord;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// What one batch came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchCounts {
    pub evaluated: u64,
    pub late: Vec<Late>,
    pub duplicates: Vec<usize>,
    pub overflows: u64,
    pub enters: u64,
    pub exits: u64,
}

pub struct SharedApplier {
    rules: Arc<SharedRules>,
    link: RedisLink,
    index: Arc<FenceIndex>,
    settings: EvaluatorSettings,
    widest: f64,
    scratch: ProbeScratch,
    batch: Vec<FixFacts>,
    backoff: Backoff,
    errors: metrics::Counter,
    round_trip: metrics::Histogram,
}

impl SharedApplier {
    pub fn new(
        rules: Arc<SharedRules>,
        link: RedisLink,
        index: Arc<FenceIndex>,
        settings: EvaluatorSettings,
    ) -> Self {
        Self {
            widest: widest_band(&index, &settings),
            rules,
            link,
            index,
            settings,
            scratch: ProbeScratch::default(),
            batch: Vec::new(),
            backoff: Backoff::new(),
            errors: metrics::counter!(STATE_REDIS_ERRORS_TOTAL),
            round_trip: metrics::histogram!(STATE_COMMIT_DURATION_SECONDS),
        }
    }

    /// A reloaded fence set applies from the next fix on.
    pub fn swap_index(&mut self, index: Arc<FenceIndex>) {
        self.widest = widest_band(&index, &self.settings);
        self.index = index;
    }

    /// Probes fix `index` of the worker's batch and adds it to the batch.
    pub fn add(&mut self, index: usize, fix: &Fix<'_>) {
        let facts = FixFacts {
            index,
            vehicle: fix.vehicle.clone(),
            fix_ms: fix.fix_ms,
            redelivered: fix.redelivered,
            digest: fix.digest,
            probe: probe(
                &self.index,
                &self.settings,
                self.widest,
                Coord {
                    x: fix.lon,
                    y: fix.lat,
                },
                &mut self.scratch,
            ),
        };
        self.batch.push(facts);
    }

    /// Applies the batch; `None` if the drain deadline passed first (the
    /// batch's messages then stay unacked, for redelivery).
    pub async fn apply(&mut self, drain: &Drain) -> Option<BatchCounts> {
        let mut groups: BTreeMap<u32, Vec<FixFacts>> = BTreeMap::new();
        for fix in self.batch.drain(..) {
            groups
                .entry(self.rules.partition_of(&fix.vehicle))
                .or_default()
                .push(fix);
        }
        let mut pending: Vec<(u32, Vec<FixFacts>)> = groups.into_iter().collect();
        let mut counts = BatchCounts::default();
        let started = Instant::now();
        loop {
            let mut calls = tokio::task::JoinSet::new();
            for (partition, fixes) in std::mem::take(&mut pending) {
                let rules = self.rules.clone();
                let mut link = self.link.clone();
                calls.spawn(async move {
                    let result = rules.apply(&mut link, partition, &fixes).await;
                    (partition, fixes, result)
                });
            }
            let mut failure = None;
            while let Some(joined) = calls.join_next().await {
                let (partition, fixes, result) = match joined {
                    Ok(done) => done,
                    // A call that panicked took its fixes with it: carry
                    // the panic on rather than leave a shard that no
                    // longer drains.
                    Err(e) => std::panic::resume_unwind(e.into_panic()),
                };
                match result {
                    Ok(applied) => {
                        counts.overflows += applied.overflows;
                        counts.enters += applied.enters;
                        counts.exits += applied.exits;
                        for (outcome, fix) in applied.outcomes.into_iter().zip(&fixes) {
                            match outcome {
                                FixOutcome::Applied | FixOutcome::Held => counts.evaluated += 1,
                                FixOutcome::Late { by_ms } => counts.late.push(Late {
                                    index: fix.index,
                                    by_ms,
                                }),
                                FixOutcome::Duplicate => counts.duplicates.push(fix.index),
                            }
                        }
                    }
                    // Only what failed is sent again: a partition applied
                    // twice would count its fixes as duplicates. A call
                    // that failed may still have run (a reply lost to a
                    // timeout), so its fixes go again marked redelivered:
                    // then a vehicle's earlier fixes in it count as
                    // duplicates, not as late.
                    Err(e) => {
                        failure = Some(e.to_string());
                        let mut fixes = fixes;
                        for fix in &mut fixes {
                            fix.redelivered = true;
                        }
                        pending.push((partition, fixes));
                    }
                }
            }
            let Some(error) = failure else {
                self.round_trip.record(started.elapsed().as_secs_f64());
                self.backoff.reset();
                crate::crash_point::reached("shared.applied");
                return Some(counts);
            };
            self.errors.increment(1);
            tracing::warn!("shared state: {error}; the batch stays unacked and is retried");
            let wait = self.backoff.step();
            if drain.would_pass(wait) {
                return None;
            }
            tokio::time::sleep(wait).await;
        }
    }
}
