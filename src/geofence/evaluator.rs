//! Per-vehicle membership and the enter/exit events it implies.
//!
//! For each fix the evaluator computes the covering fences, then emits every
//! `Exit` before any `Enter` (a vehicle crossing from one fence into its
//! neighbour leaves first), each group in fence-file order.
//!
//! Jitter suppression, per fence or global:
//! * **hysteresis h** (metres): enter only when covered and the boundary is at
//!   least h away; exit only when outside and the boundary is at least h
//!   away. Between the two, membership holds.
//! * **dwell d** (seconds): an enter is confirmed by the first fix at least d
//!   after the first of an unbroken run of qualifying fixes; the event
//!   carries the confirming fix's time. Exits are immediate.
//!
//! A fix older than the vehicle's last evaluated fix changes nothing and is
//! counted as out of order; one at the same time, or an older one the
//! broker marks as redelivered, was applied before (by this process or by
//! one that crashed after committing it) and is counted as a duplicate.
//! State is bounded: at most
//! `max_memberships` fences per vehicle (overflow counted), and a vehicle
//! whose last fix is older than `idle_expiry` behind the newest fix seen is
//! forgotten silently (counted): its next fix starts from no membership.

use super::fences::Fence;
use super::index::{Coverings, FenceIdx, FenceIndex};
use crate::model::{FenceId, VehicleId};
use geo::Coord;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::Arc;

/// Sweep for idle vehicles once per this many evaluations.
const EXPIRY_SWEEP_EVERY: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TransitionKind {
    Enter,
    Exit,
}

impl TransitionKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            TransitionKind::Enter => "enter",
            TransitionKind::Exit => "exit",
        }
    }
}

/// One enter or exit, as written to NDJSON and MQTT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub vehicle: VehicleId,
    pub fence: FenceId,
    pub event: TransitionKind,
    /// The fix time (unix ms) that caused it.
    pub ts: i64,
}

/// What one fix did to its vehicle's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixOutcome {
    /// Evaluated against the fences and applied (it may have produced no
    /// transition).
    Applied,
    /// Older than the vehicle's last applied fix: nothing changed.
    OutOfOrder,
    /// Already applied: the vehicle's last applied fix has this time, or
    /// the broker redelivered a fix older than it. Nothing changed.
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvaluatorSettings {
    /// Global hysteresis in metres; a fence's `hysteresis_m` overrides it.
    pub hysteresis_m: f64,
    /// Global dwell in seconds; a fence's `dwell_s` overrides it.
    pub dwell_s: f64,
    pub max_memberships: usize,
    /// Forget a vehicle this many ms of fix time after its last fix.
    pub idle_expiry_ms: i64,
}

impl EvaluatorSettings {
    /// The fence's hysteresis in metres: its own, else the global one.
    pub fn hysteresis_of(&self, fence: &Fence) -> f64 {
        fence.hysteresis_m.unwrap_or(self.hysteresis_m)
    }

    /// The fence's dwell in milliseconds: its own, else the global one.
    pub fn dwell_ms_of(&self, fence: &Fence) -> i64 {
        (fence.dwell_s.unwrap_or(self.dwell_s) * 1000.0).round() as i64
    }

    /// Whether `p` is clear of the fence's hysteresis band: only then may
    /// the fence be entered (from outside) or left (from inside).
    pub fn clear_of_boundary(&self, fence: &Fence, p: Coord) -> bool {
        let h = self.hysteresis_of(fence);
        h <= 0.0 || !fence.boundary_within(p, h)
    }
}

impl Default for EvaluatorSettings {
    fn default() -> Self {
        Self {
            hysteresis_m: 0.0,
            dwell_s: 0.0,
            max_memberships: 256,
            idle_expiry_ms: 24 * 3600 * 1000,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EvaluatorStats {
    pub evaluated: u64,
    pub out_of_order: u64,
    pub duplicates: u64,
    pub expired: u64,
    pub membership_overflow: u64,
    pub enters: u64,
    pub exits: u64,
}

#[derive(Debug, Default)]
struct VehicleState {
    last_fix_ms: i64,
    /// Fences the vehicle is in, ascending.
    members: Vec<FenceIdx>,
    /// Fences awaiting dwell confirmation: (fence, first qualifying fix).
    pending: Vec<(FenceIdx, i64)>,
    /// Listed in `changed` since the last [`Evaluator::take_changed`].
    changed: bool,
}

/// One fix to evaluate. `redelivered` is the broker's duplicate flag,
/// which tells an already-applied fix from an out-of-order one.
#[derive(Debug, Clone, Copy)]
pub struct Fix<'a> {
    pub vehicle: &'a VehicleId,
    pub fix_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub redelivered: bool,
}

impl Fix<'_> {
    /// The fix as the index takes it: (lon, lat).
    fn point(&self) -> Coord<f64> {
        Coord {
            x: self.lon,
            y: self.lat,
        }
    }
}

/// One vehicle's state with fence ids in place of index positions: what a
/// state store keeps, valid across fence reloads and restarts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VehicleSnapshot {
    pub last_fix_ms: i64,
    /// In fence-file order at the time of the snapshot.
    pub members: Vec<FenceId>,
    /// (fence, first qualifying fix time) for each dwell in progress.
    pub pending: Vec<(FenceId, i64)>,
}

pub struct Evaluator {
    index: Arc<FenceIndex>,
    settings: EvaluatorSettings,
    /// foldhash, seeded per process: SipHash was a visible share of the
    /// per-event cost, and a random seed still keeps crafted ids from
    /// colliding on purpose.
    vehicles: HashMap<VehicleId, VehicleState, foldhash::fast::RandomState>,
    stats: EvaluatorStats,
    newest_fix_ms: i64,
    /// Scratch buffer for covering fences, reused across fixes.
    covering: Vec<FenceIdx>,
    /// The points of the batch given to [`Self::cover_batch`], and the
    /// fences covering each.
    batch_points: Vec<Coord<f64>>,
    batch_coverings: Coverings,
    /// Fixes [`Self::evaluate_covered`] read from the batch (the rest it
    /// looked up itself): what shows that a caller's batches are used.
    read_from_batch: u64,
    /// Vehicles whose state changed (or that expired) since the last
    /// [`Self::take_changed`]: what the next state commit must write.
    changed: Vec<VehicleId>,
    /// Off unless a durable store needs `changed` (it costs a clone of
    /// the id per vehicle per batch).
    track_changes: bool,
}

impl Evaluator {
    pub fn new(index: Arc<FenceIndex>, settings: EvaluatorSettings) -> Self {
        Self {
            index,
            settings,
            vehicles: HashMap::default(),
            stats: EvaluatorStats::default(),
            newest_fix_ms: i64::MIN,
            covering: Vec::new(),
            batch_points: Vec::new(),
            batch_coverings: Coverings::default(),
            read_from_batch: 0,
            changed: Vec::new(),
            track_changes: false,
        }
    }

    /// Lists changed vehicles for [`Self::take_changed`].
    pub fn tracking_changes(mut self) -> Self {
        self.track_changes = true;
        self
    }

    pub fn stats(&self) -> EvaluatorStats {
        self.stats
    }

    /// How many fixes [`Self::evaluate_covered`] took from a batch's
    /// lookup rather than looking them up itself.
    pub fn read_from_batch(&self) -> u64 {
        self.read_from_batch
    }

    pub fn tracked_vehicles(&self) -> usize {
        self.vehicles.len()
    }

    pub fn index(&self) -> &Arc<FenceIndex> {
        &self.index
    }

    /// Fence ids the vehicle is currently in, in fence-file order.
    pub fn memberships(&self, vehicle: &str) -> Vec<FenceId> {
        self.vehicles
            .get(vehicle)
            .map(|s| {
                s.members
                    .iter()
                    .map(|&f| self.index.fence(f).id.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Evaluates one fix delivered for the first time, appending its
    /// transitions to `out`.
    pub fn evaluate(
        &mut self,
        vehicle: &VehicleId,
        fix_ms: i64,
        lat: f64,
        lon: f64,
        out: &mut Vec<Transition>,
    ) -> FixOutcome {
        self.evaluate_delivery(vehicle, fix_ms, lat, lon, false, out)
    }

    /// Evaluates one fix; `redelivered` is the broker's duplicate flag,
    /// which tells an already-applied fix from an out-of-order one.
    pub fn evaluate_delivery(
        &mut self,
        vehicle: &VehicleId,
        fix_ms: i64,
        lat: f64,
        lon: f64,
        redelivered: bool,
        out: &mut Vec<Transition>,
    ) -> FixOutcome {
        let fix = Fix {
            vehicle,
            fix_ms,
            lat,
            lon,
            redelivered,
        };
        self.evaluate_fix(fix, out)
    }

    /// [`Self::evaluate_delivery`], the fix given whole.
    pub fn evaluate_fix(&mut self, fix: Fix<'_>, out: &mut Vec<Transition>) -> FixOutcome {
        self.apply(fix, None, out)
    }

    /// Looks up the fences covering each of `fixes` together, for
    /// [`Self::evaluate_covered`]: a batch overlaps the cache misses of its
    /// points' lookups, which one fix at a time queue one behind the other
    /// (see [`FenceIndex::containing_batch`]). The lookup of a fix that then
    /// proves out of order or a duplicate is wasted.
    pub fn cover_batch<'a>(&mut self, fixes: impl IntoIterator<Item = Fix<'a>>) {
        self.batch_points.clear();
        self.batch_points
            .extend(fixes.into_iter().map(|fix| fix.point()));
        self.index
            .containing_batch(&self.batch_points, &mut self.batch_coverings);
    }

    /// [`Self::evaluate_delivery`], reading the fix's covering fences from
    /// point `i` of the last [`Self::cover_batch`] when that point is this
    /// fix's (else it looks them up now, as after a [`Self::swap_index`],
    /// which drops the batch): the same outcome and transitions either way.
    pub fn evaluate_covered(
        &mut self,
        i: usize,
        fix: Fix<'_>,
        out: &mut Vec<Transition>,
    ) -> FixOutcome {
        let batch_position = (self.batch_points.get(i) == Some(&fix.point())).then_some(i);
        if batch_position.is_some() {
            self.read_from_batch += 1;
        }
        self.apply(fix, batch_position, out)
    }

    /// One fix, its covering fences looked up now (`batch_position` `None`)
    /// or read from that point of the last [`Self::cover_batch`].
    fn apply(
        &mut self,
        fix: Fix<'_>,
        batch_position: Option<usize>,
        out: &mut Vec<Transition>,
    ) -> FixOutcome {
        let p = fix.point();
        let Fix {
            vehicle,
            fix_ms,
            redelivered,
            ..
        } = fix;
        // Look up before inserting: a known vehicle (the common case) costs
        // no clone of its id (a heap share for ids past 23 bytes).
        if !self.vehicles.contains_key(vehicle) {
            let fresh = VehicleState {
                last_fix_ms: i64::MIN,
                ..VehicleState::default()
            };
            self.vehicles.insert(vehicle.clone(), fresh);
        }
        let Some(state) = self.vehicles.get_mut(vehicle) else {
            return FixOutcome::Applied;
        };
        if fix_ms == state.last_fix_ms || (redelivered && fix_ms < state.last_fix_ms) {
            self.stats.duplicates += 1;
            return FixOutcome::Duplicate;
        }
        if fix_ms < state.last_fix_ms {
            self.stats.out_of_order += 1;
            return FixOutcome::OutOfOrder;
        }
        self.stats.evaluated += 1;
        state.last_fix_ms = fix_ms;
        if self.track_changes && !state.changed {
            state.changed = true;
            self.changed.push(vehicle.clone());
        }
        let index: &FenceIndex = &self.index;
        let settings = &self.settings;
        let stats = &mut self.stats;
        let covering: &[FenceIdx] = match batch_position {
            Some(i) => self.batch_coverings.of(i),
            None => {
                index.containing(p, &mut self.covering);
                &self.covering
            }
        };
        let clear_of_boundary = |f: FenceIdx| settings.clear_of_boundary(index.fence(f), p);
        let transition = |f: FenceIdx, event| Transition {
            vehicle: vehicle.clone(),
            fence: index.fence(f).id.clone(),
            event,
            ts: fix_ms,
        };

        // Exits first.
        state.members.retain(|&m| {
            let stays = covering.binary_search(&m).is_ok() || !clear_of_boundary(m);
            if !stays {
                out.push(transition(m, TransitionKind::Exit));
                stats.exits += 1;
            }
            stays
        });

        // Then enters, with dwell bookkeeping.
        let mut pending = Vec::new();
        for &f in covering.iter() {
            if state.members.binary_search(&f).is_ok() || !clear_of_boundary(f) {
                continue;
            }
            let fence = index.fence(f);
            let dwell_ms = settings.dwell_ms_of(fence);
            let since = state
                .pending
                .iter()
                .find(|(pf, _)| *pf == f)
                .map_or(fix_ms, |&(_, s)| s);
            if dwell_ms > 0 && fix_ms.saturating_sub(since) < dwell_ms {
                pending.push((f, since));
                continue;
            }
            if state.members.len() >= settings.max_memberships {
                stats.membership_overflow += 1;
                continue;
            }
            let at = state.members.partition_point(|&m| m < f);
            state.members.insert(at, f);
            out.push(transition(f, TransitionKind::Enter));
            stats.enters += 1;
        }
        pending.truncate(settings.max_memberships);
        state.pending = pending;

        self.newest_fix_ms = self.newest_fix_ms.max(fix_ms);
        if self.stats.evaluated.is_multiple_of(EXPIRY_SWEEP_EVERY) {
            self.expire_idle(self.newest_fix_ms);
        }
        FixOutcome::Applied
    }

    /// Forgets vehicles whose last fix is more than the idle expiry before
    /// `now_ms`; returns how many.
    pub fn expire_idle(&mut self, now_ms: i64) -> usize {
        let horizon = now_ms.saturating_sub(self.settings.idle_expiry_ms);
        let before = self.vehicles.len();
        let changed = &mut self.changed;
        let track = self.track_changes;
        self.vehicles.retain(|id, s| {
            let keep = s.last_fix_ms >= horizon;
            if track && !keep && !s.changed {
                changed.push(id.clone());
            }
            keep
        });
        let expired = before - self.vehicles.len();
        self.stats.expired += expired as u64;
        expired
    }

    /// Drains the vehicles changed since the last call into `out`, each
    /// with its state now (`None`: expired, delete it).
    pub fn take_changed(&mut self, out: &mut Vec<(VehicleId, Option<VehicleSnapshot>)>) {
        for id in self.changed.drain(..) {
            let snapshot = self.vehicles.get_mut(&id).map(|s| {
                s.changed = false;
                VehicleSnapshot {
                    last_fix_ms: s.last_fix_ms,
                    members: s
                        .members
                        .iter()
                        .map(|&f| self.index.fence(f).id.clone())
                        .collect(),
                    pending: s
                        .pending
                        .iter()
                        .map(|&(f, since)| (self.index.fence(f).id.clone(), since))
                        .collect(),
                }
            });
            out.push((id, snapshot));
        }
    }

    /// Puts back a vehicle's committed state (at start, from the store).
    /// Fences no longer in the fence set are dropped without events, as a
    /// reload drops them.
    pub fn restore(&mut self, vehicle: VehicleId, snapshot: &VehicleSnapshot) {
        let index = &self.index;
        let mut members: Vec<FenceIdx> = snapshot
            .members
            .iter()
            .filter_map(|id| index.find(id))
            .collect();
        members.sort_unstable();
        members.dedup();
        members.truncate(self.settings.max_memberships);
        let pending = snapshot
            .pending
            .iter()
            .filter_map(|(id, since)| index.find(id).map(|f| (f, *since)))
            .take(self.settings.max_memberships)
            .collect();
        self.newest_fix_ms = self.newest_fix_ms.max(snapshot.last_fix_ms);
        self.vehicles.insert(
            vehicle,
            VehicleState {
                last_fix_ms: snapshot.last_fix_ms,
                members,
                pending,
                changed: false,
            },
        );
    }

    /// Swaps in a reloaded fence set. Memberships and pending dwells survive
    /// for fence ids present in both; the rest are dropped without events.
    pub fn swap_index(&mut self, new: Arc<FenceIndex>) {
        let old = std::mem::replace(&mut self.index, new);
        // The batch's coverings name the old index's fences.
        self.batch_points.clear();
        let remap = |f: FenceIdx| self.index.find(&old.fence(f).id);
        for (id, state) in self.vehicles.iter_mut() {
            let (members, pending) = (state.members.len(), state.pending.len());
            state.members = state.members.iter().filter_map(|&f| remap(f)).collect();
            state.members.sort_unstable();
            state.pending = state
                .pending
                .iter()
                .filter_map(|&(f, s)| remap(f).map(|n| (n, s)))
                .collect();
            // A membership the reload dropped must leave the store too, or
            // the fence's return (a second reload, a restart with the old
            // file) would bring it back where a running geogate would not.
            let shrank = state.members.len() < members || state.pending.len() < pending;
            if self.track_changes && shrank && !state.changed {
                state.changed = true;
                self.changed.push(id.clone());
            }
        }
    }
}
