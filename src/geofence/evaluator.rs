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
//! Time and order (ARCHITECTURE.md, "Time and order"):
//! * A vehicle's transitions are a function of its fixes in **fix-time
//!   order**. With a reorder window of w ms, each arriving fix waits in its
//!   vehicle's window until the receive clock passes its arrival + w, and
//!   leaves in fix-time order ([`Evaluator::release_due`]); with no window
//!   it is applied on arrival.
//! * A fix older than the vehicle's last applied fix once its window has
//!   passed is **late**: it changes nothing and is reported with how late
//!   it was.
//! * A **duplicate** is the same message again, known by its digest: one
//!   waiting in the window, or one applied at the vehicle's last fix time.
//!   An older fix the broker marks as redelivered is taken as applied
//!   before (by this process, or by one that crashed before acking it).
//!   Two different messages with the same fix time are two fixes, applied
//!   in arrival order.
//! * **Liveness runs on the receive clock**: a vehicle not heard from for
//!   `idle_expiry` is forgotten, with an `exit` (cause `expired`) for each
//!   fence it was in ([`Evaluator::expire_idle`]). No fix time, of this
//!   vehicle or another, moves it.
//!
//! Timed outputs (a window release, an expiry) fire only up to the
//! **watermark** the caller passes: the receive-clock time up to which
//! every message has been handed in, so a backlog delays them but never
//! orders them ahead of the vehicle's own fixes.
//!
//! State is bounded: at most `max_memberships` fences per vehicle
//! (overflow counted).

use super::fences::{Fence, FenceSource};
use super::index::{Coverings, FenceIdx, FenceIndex};
use super::prefetch::prefetch;
use super::vehicle_slots::{SlotRef, VehicleSlots};
use crate::model::{FenceId, VehicleId};
use geo::Coord;
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// Most digests kept of the fixes applied at one fix time: enough for an
/// event report and a periodic report in the same second, and a few more.
const SAME_TIME_DIGESTS: usize = 4;

/// Most fixes one vehicle's window holds; past it the oldest-arrived is
/// released early (counted), so a device flooding one vehicle id cannot
/// grow the state without bound.
pub const MAX_WINDOW_FIXES: usize = 1024;

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

/// Why a transition that no fix caused happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    /// The vehicle was not heard from for the idle expiry.
    Expired,
    /// The fence was deleted while the vehicle was in it.
    FenceDeleted,
    /// The fence's geometry changed so that the vehicle's last position
    /// no longer holds it (by the hysteresis rule).
    FenceChanged,
}

/// One enter or exit, as written to NDJSON and MQTT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Transition {
    pub vehicle: VehicleId,
    pub fence: FenceId,
    pub event: TransitionKind,
    /// The fix time (unix ms) that caused it; for an expiry, the receive
    /// clock's time at which the vehicle became idle.
    pub ts: i64,
    /// Set for a transition no fix caused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    /// The fence set version that put the fence (for an exit caused by a
    /// change: the change's).
    pub fence_version: u64,
    /// Receive-clock time (unix ms) of the message that caused it, for the
    /// transition latency; not part of the event.
    #[serde(skip)]
    pub received_ms: i64,
    /// The fence's GeoJSON, whose properties the event line may carry
    /// (`delivery::outbox`); not part of the event as such.
    #[serde(skip)]
    pub source: Option<Arc<FenceSource>>,
}

impl Transition {
    /// A transition of `fence`, caused by a fix at `ts` received at
    /// `received_ms`.
    pub fn of(
        vehicle: &VehicleId,
        fence: &Fence,
        event: TransitionKind,
        ts: i64,
        received_ms: i64,
    ) -> Self {
        Self {
            vehicle: vehicle.clone(),
            fence: fence.id.clone(),
            event,
            ts,
            cause: None,
            fence_version: fence.version,
            received_ms,
            source: Some(fence.source.clone()),
        }
    }
}

/// What one fix did to its vehicle's state on arrival.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixOutcome {
    /// Evaluated against the fences and applied (it may have produced no
    /// transition).
    Applied,
    /// Waiting in the vehicle's reorder window; applied when it leaves.
    Held,
    /// Older than the vehicle's last applied fix, by `by_ms`: nothing
    /// changed.
    Late { by_ms: i64 },
    /// The same message again (see the module's notes). Nothing changed.
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvaluatorSettings {
    /// Global hysteresis in metres; a fence's `hysteresis_m` overrides it.
    pub hysteresis_m: f64,
    /// Global dwell in seconds; a fence's `dwell_s` overrides it.
    pub dwell_s: f64,
    pub max_memberships: usize,
    /// Forget a vehicle (with exits) this many ms of receive clock after it
    /// was last heard from.
    pub idle_expiry_ms: i64,
    /// How long a fix waits in its vehicle's window, in receive-clock ms
    /// (0: applied on arrival).
    pub reorder_window_ms: i64,
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

    /// How often idle vehicles are looked for, in receive-clock ms: an
    /// expiry fires at most this late (its event time is exact anyway),
    /// and the sweep, which visits every vehicle, runs at most this often.
    fn sweep_every_ms(&self) -> i64 {
        (self.idle_expiry_ms / 64).clamp(1_000, 60_000)
    }
}

impl Default for EvaluatorSettings {
    fn default() -> Self {
        Self {
            hysteresis_m: 0.0,
            dwell_s: 0.0,
            max_memberships: 256,
            idle_expiry_ms: 24 * 3600 * 1000,
            reorder_window_ms: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EvaluatorStats {
    /// Fixes applied (on arrival or on leaving the window).
    pub evaluated: u64,
    /// Fixes taken into a reorder window.
    pub held: u64,
    /// Fixes a full window released before their time.
    pub window_overflow: u64,
    pub late: u64,
    pub duplicates: u64,
    pub expired: u64,
    pub membership_overflow: u64,
    pub enters: u64,
    pub exits: u64,
    /// Dwells in progress dropped because their fence was deleted.
    pub dwells_dropped: u64,
    /// Exits a fence's deletion or change caused.
    pub change_exits: u64,
}

/// A fix waiting in its vehicle's reorder window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldFix {
    pub fix_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub received_ms: i64,
    pub digest: u64,
    /// Its key in a durable store's log of held fixes
    /// ([`HeldChange`]); 0 when it is in no log.
    pub key: u64,
}

/// One change to the held fixes, for a durable store: a fix entering a
/// window is logged apart from its vehicle's record, and leaves the log
/// when it is applied (in the same commit as the record it changes). A
/// fix that only waits rewrites nothing, so a window costs one small
/// append per fix, not a second write of a record that carries the whole
/// window (docs/decisions/0021-held-fixes-log.md).
#[derive(Debug, Clone, PartialEq)]
pub enum HeldChange {
    Held(VehicleId, HeldFix),
    Left(u64),
}

/// A held fix's turn to leave its window: when, and which of its
/// vehicle's fixes leave with it (those dated up to its own).
#[derive(Debug, Clone, Copy)]
struct Due {
    at_ms: i64,
    fix_ms: i64,
    vehicle: SlotRef,
}

/// How far down the due queue a release starts loading a vehicle's slot,
/// and its window's fixes: far enough for the loads to arrive before
/// they are read, near enough that they are still in cache then.
const LOAD_SLOT_AHEAD: usize = 16;
const LOAD_WINDOW_AHEAD: usize = 8;

#[derive(Debug, Default)]
struct VehicleState {
    /// The last applied fix's time (`i64::MIN`: none yet).
    last_fix_ms: i64,
    /// Digests of the messages applied at `last_fix_ms`.
    last_digests: Vec<u64>,
    /// When the vehicle was last heard from, on the receive clock.
    last_heard_ms: i64,
    /// Fences the vehicle is in, ascending.
    members: Vec<FenceIdx>,
    /// Fences awaiting dwell confirmation: (fence, first qualifying fix).
    pending: Vec<(FenceIdx, i64)>,
    /// The reorder window, in fix-time order (arrival order among equals).
    /// A deque: fixes leave from the front and mostly arrive at the back.
    window: VecDeque<HeldFix>,
    /// The last applied fix's position (lat, lon); NaN before any.
    last_lat: f64,
    last_lon: f64,
    /// Listed in `changed` since the last [`Evaluator::take_changed`].
    changed: bool,
}

impl VehicleState {
    fn new(last_heard_ms: i64) -> Self {
        Self {
            last_fix_ms: i64::MIN,
            last_heard_ms,
            last_lat: f64::NAN,
            last_lon: f64::NAN,
            ..Self::default()
        }
    }

    fn position(&self) -> Option<Coord<f64>> {
        (!self.last_lat.is_nan()).then_some(Coord {
            x: self.last_lon,
            y: self.last_lat,
        })
    }
}

/// The fence set version a vehicle with these open questions has its
/// memberships settled against, given the set's: a record says so, so
/// that a restart asks again every question still open.
fn settled_version(questions: Option<&Vec<Stale>>, set_version: u64) -> u64 {
    questions
        .into_iter()
        .flatten()
        .map(|s| s.version.saturating_sub(1))
        .fold(set_version, u64::min)
}

/// The deleted fences among open questions: still listed as the vehicle's
/// until their exits come.
fn doomed(questions: Option<&Vec<Stale>>) -> impl Iterator<Item = &Stale> {
    questions
        .into_iter()
        .flatten()
        .filter(|st| st.cause == Cause::FenceDeleted)
}

/// A membership a fence change put in question.
#[derive(Debug, Clone)]
struct Stale {
    fence: FenceId,
    /// The GeoJSON the exit names: the deleted fence's, or the changed
    /// one's new definition.
    source: Arc<FenceSource>,
    cause: Cause,
    /// The change's version and time.
    version: u64,
    at_ms: i64,
}

/// One fix to evaluate.
#[derive(Debug, Clone, Copy)]
pub struct Fix<'a> {
    pub vehicle: &'a VehicleId,
    pub fix_ms: i64,
    pub lat: f64,
    pub lon: f64,
    /// The broker's duplicate flag, which tells an already-applied fix
    /// from a late one.
    pub redelivered: bool,
    /// When it was received, on the receive clock (unix ms).
    pub received_ms: i64,
    /// The message's digest ([`crate::codec::message_digest`]): what makes
    /// two fixes the same message.
    pub digest: u64,
}

impl Fix<'_> {
    /// The fix as the index takes it: (lon, lat).
    fn point(&self) -> Coord<f64> {
        Coord {
            x: self.lon,
            y: self.lat,
        }
    }

    /// A digest of the fix itself (time and position), for callers with
    /// no message to digest: offline evaluation and tests.
    pub fn position_digest(fix_ms: i64, lat: f64, lon: f64) -> u64 {
        let mut bytes = [0u8; 24];
        bytes[..8].copy_from_slice(&fix_ms.to_le_bytes());
        bytes[8..16].copy_from_slice(&lat.to_bits().to_le_bytes());
        bytes[16..].copy_from_slice(&lon.to_bits().to_le_bytes());
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }
}

/// One vehicle's state with fence ids in place of index positions: what a
/// state store keeps, valid across fence reloads and restarts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VehicleSnapshot {
    pub last_fix_ms: i64,
    /// Digests of the messages applied at `last_fix_ms`.
    pub last_digests: Vec<u64>,
    /// When it was last heard from, on the receive clock.
    pub last_heard_ms: i64,
    /// In fence-file order at the time of the snapshot.
    pub members: Vec<FenceId>,
    /// (fence, first qualifying fix time) for each dwell in progress.
    pub pending: Vec<(FenceId, i64)>,
    /// The reorder window's fixes, in fix-time order.
    pub window: Vec<HeldFix>,
    /// The last applied fix's (lat, lon).
    pub position: Option<(f64, f64)>,
    /// The fence set version the memberships are settled against: a fence
    /// changed or deleted after it is asked about again at restore.
    pub fences_version: u64,
}

/// One vehicle as the state query answers it: what operators ask first
/// after a restart.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VehicleView {
    pub vehicle: VehicleId,
    /// The fences it is in, in id order, with their versions. A fence whose
    /// deletion's exit is still to come is listed until it comes.
    pub fences: Vec<FenceIn>,
    pub pending_dwells: Vec<PendingDwell>,
    /// The last applied fix.
    pub last_fix: Option<LastFix>,
    /// When it was last heard from, on the receive clock (unix ms).
    pub last_heard_ms: i64,
    /// Fixes waiting in its reorder window.
    pub waiting_fixes: usize,
    /// The fence set version the answer is of.
    pub fence_set_version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FenceIn {
    pub id: FenceId,
    pub version: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingDwell {
    pub fence: FenceId,
    /// The first fix of the run that qualifies (unix ms).
    pub since_ms: i64,
    /// When a fix will confirm the enter, at the earliest.
    pub confirms_at_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LastFix {
    pub ts: i64,
    pub lat: f64,
    pub lon: f64,
}

pub struct Evaluator {
    index: Arc<FenceIndex>,
    settings: EvaluatorSettings,
    vehicles: VehicleSlots<VehicleState>,
    stats: EvaluatorStats,
    /// When each held fix is due to leave its window, in arrival order. A
    /// queue, not a heap: due times are the receive clock plus one window,
    /// so they rise with arrivals (a fix handed over out of receive order,
    /// across decode lanes, waits at most until the one queued before it
    /// is due). An entry whose fix has already left, with a later one of
    /// its vehicle, releases nothing.
    due: VecDeque<Due>,
    /// False after a restore, until `due` is sorted again.
    due_sorted: bool,
    /// Fixes in every window together.
    held: usize,
    /// The receive-clock time of the next idle sweep.
    next_sweep_ms: i64,
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
    /// Fixes that entered or left a window since the last
    /// [`Self::take_held`] (tracked with `changed`).
    held_log: Vec<HeldChange>,
    /// The key the next held fix gets in the log.
    next_held_key: u64,
    /// Memberships fence changes put in question, by vehicle in id order,
    /// answered once the vehicle's input has caught up with the change
    /// ([`Self::reconcile`]). Apart from the vehicles' state, which a
    /// million vehicles hold: few have a question at any time.
    questions: BTreeMap<VehicleId, Vec<Stale>>,
}

impl Evaluator {
    pub fn new(index: Arc<FenceIndex>, settings: EvaluatorSettings) -> Self {
        Self {
            index,
            settings,
            vehicles: VehicleSlots::default(),
            stats: EvaluatorStats::default(),
            due: VecDeque::new(),
            due_sorted: true,
            held: 0,
            next_sweep_ms: i64::MIN,
            covering: Vec::new(),
            batch_points: Vec::new(),
            batch_coverings: Coverings::default(),
            read_from_batch: 0,
            changed: Vec::new(),
            track_changes: false,
            held_log: Vec::new(),
            next_held_key: 1,
            questions: BTreeMap::new(),
        }
    }

    /// Lists changed vehicles for [`Self::take_changed`], and held fixes
    /// for [`Self::take_held`], numbering them from `first_held_key` (not
    /// 0; keys no other shard's evaluator gives, nor any fix already
    /// logged).
    pub fn tracking_changes(mut self, first_held_key: u64) -> Self {
        self.track_changes = true;
        self.next_held_key = first_held_key;
        self
    }

    pub fn stats(&self) -> EvaluatorStats {
        self.stats
    }

    pub fn settings(&self) -> &EvaluatorSettings {
        &self.settings
    }

    /// How many fixes [`Self::evaluate_covered`] took from a batch's
    /// lookup rather than looking them up itself.
    pub fn read_from_batch(&self) -> u64 {
        self.read_from_batch
    }

    pub fn tracked_vehicles(&self) -> usize {
        self.vehicles.len()
    }

    /// Fixes waiting in reorder windows now.
    pub fn held_now(&self) -> usize {
        self.held
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

    /// The vehicle's state now, if it is tracked.
    pub fn view(&self, vehicle: &str) -> Option<VehicleView> {
        let s = self.vehicles.get(vehicle)?;
        let index = &self.index;
        let mut fences: Vec<FenceIn> = s
            .members
            .iter()
            .map(|&f| {
                let fence = index.fence(f);
                FenceIn {
                    id: fence.id.clone(),
                    version: fence.version,
                }
            })
            .chain(doomed(self.questions.get(vehicle)).map(|st| FenceIn {
                id: st.fence.clone(),
                version: st.version,
            }))
            .collect();
        fences.sort_by(|a, b| a.id.cmp(&b.id));
        let pending_dwells = s
            .pending
            .iter()
            .map(|&(f, since_ms)| {
                let fence = index.fence(f);
                PendingDwell {
                    fence: fence.id.clone(),
                    since_ms,
                    confirms_at_ms: since_ms.saturating_add(self.settings.dwell_ms_of(fence)),
                }
            })
            .collect();
        Some(VehicleView {
            vehicle: vehicle.into(),
            fences,
            pending_dwells,
            last_fix: s.position().map(|p| LastFix {
                ts: s.last_fix_ms,
                lat: p.y,
                lon: p.x,
            }),
            last_heard_ms: s.last_heard_ms,
            waiting_fixes: s.window.len(),
            fence_set_version: index.version(),
        })
    }

    /// Evaluates one fix delivered for the first time, received at its own
    /// fix time and digested by its position, appending its transitions to
    /// `out`: the in-order reference (`geogate eval`, tests).
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

    /// [`Self::evaluate`] with the broker's duplicate flag.
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
            received_ms: fix_ms,
            digest: Fix::position_digest(fix_ms, lat, lon),
        };
        self.evaluate_fix(fix, out)
    }

    /// Takes one arriving fix: applied now, held in its window, or refused
    /// as late or a duplicate.
    pub fn evaluate_fix(&mut self, fix: Fix<'_>, out: &mut Vec<Transition>) -> FixOutcome {
        self.arrive(fix, None, out)
    }

    /// Looks up the fences covering each of `fixes` together, for
    /// [`Self::evaluate_covered`]: a batch overlaps the cache misses of its
    /// points' lookups, which one fix at a time queue one behind the other
    /// (see [`FenceIndex::containing_batch`]). The lookup of a fix that then
    /// proves late, a duplicate or held is wasted.
    pub fn cover_batch<'a>(&mut self, fixes: impl IntoIterator<Item = Fix<'a>>) {
        self.batch_points.clear();
        self.batch_points
            .extend(fixes.into_iter().map(|fix| fix.point()));
        self.index
            .containing_batch(&self.batch_points, &mut self.batch_coverings);
    }

    /// [`Self::evaluate_fix`], reading the fix's covering fences from
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
        self.arrive(fix, batch_position, out)
    }

    fn arrive(
        &mut self,
        fix: Fix<'_>,
        batch_position: Option<usize>,
        out: &mut Vec<Transition>,
    ) -> FixOutcome {
        let (slot, state) = self
            .vehicles
            .get_or_insert_with(fix.vehicle, || VehicleState::new(fix.received_ms));
        state.last_heard_ms = state.last_heard_ms.max(fix.received_ms);
        // Every outcome but a hold changes the record (a held fix is
        // logged instead; the store takes its receive time from the log).
        let mut changed = |state: &mut VehicleState| {
            if self.track_changes && !state.changed {
                state.changed = true;
                self.changed.push(fix.vehicle.clone());
            }
        };
        let applied_before = (fix.fix_ms == state.last_fix_ms
            && state.last_digests.contains(&fix.digest))
            || (fix.redelivered && fix.fix_ms < state.last_fix_ms);
        // Where the fix goes in the window: after every held fix of its
        // time or earlier. Fixes mostly come in order, so that is the back.
        let at = if state.window.back().is_none_or(|h| h.fix_ms <= fix.fix_ms) {
            state.window.len()
        } else {
            state.window.partition_point(|h| h.fix_ms <= fix.fix_ms)
        };
        // Only a held fix of the same time can be the same message.
        let held_before = state
            .window
            .range(..at)
            .rev()
            .take_while(|h| h.fix_ms == fix.fix_ms)
            .any(|h| h.digest == fix.digest);
        if applied_before || held_before {
            changed(state);
            self.stats.duplicates += 1;
            return FixOutcome::Duplicate;
        }
        if fix.fix_ms < state.last_fix_ms {
            changed(state);
            self.stats.late += 1;
            return FixOutcome::Late {
                by_ms: state.last_fix_ms - fix.fix_ms,
            };
        }
        let held = HeldFix {
            fix_ms: fix.fix_ms,
            lat: fix.lat,
            lon: fix.lon,
            received_ms: fix.received_ms,
            digest: fix.digest,
            key: 0,
        };
        if self.settings.reorder_window_ms <= 0 && state.window.is_empty() {
            changed(state);
            if batch_position.is_some() {
                self.read_from_batch += 1;
            }
            apply(
                &self.index,
                &self.settings,
                &mut self.stats,
                fix.vehicle,
                state,
                held,
                batch_position.map(|i| self.batch_coverings.of(i)),
                &mut self.covering,
                out,
            );
            return FixOutcome::Applied;
        }
        let held = if self.track_changes {
            let held = HeldFix {
                key: self.next_held_key,
                ..held
            };
            self.next_held_key += 1;
            self.held_log
                .push(HeldChange::Held(fix.vehicle.clone(), held));
            held
        } else {
            held
        };
        // Equal times keep arrival order.
        state.window.insert(at, held);
        self.stats.held += 1;
        self.held += 1;
        self.due.push_back(Due {
            at_ms: fix
                .received_ms
                .saturating_add(self.settings.reorder_window_ms),
            fix_ms: fix.fix_ms,
            vehicle: slot,
        });
        if state.window.len() > MAX_WINDOW_FIXES {
            // Release up to the earliest-arrived fix, as if its time had
            // come: the window stays bounded and stays in fix-time order.
            let first_arrived = state
                .window
                .iter()
                .min_by_key(|h| h.received_ms)
                .map_or(i64::MIN, |h| h.fix_ms);
            let n = state.window.partition_point(|h| h.fix_ms <= first_arrived);
            self.stats.window_overflow += n as u64;
            self.held -= n;
            changed(state);
            let (index, settings) = (&self.index, &self.settings);
            release_front(
                index,
                settings,
                &mut self.stats,
                fix.vehicle,
                state,
                n,
                &mut self.covering,
                self.track_changes.then_some(&mut self.held_log),
                out,
            );
        }
        FixOutcome::Held
    }

    /// Applies, in fix-time order, every held fix whose time in the window
    /// has passed by `watermark_ms` (the receive-clock time up to which all
    /// input has been handed in), together with any earlier fixes of its
    /// vehicle still waiting. Returns how many fixes left their windows.
    pub fn release_due(&mut self, watermark_ms: i64, out: &mut Vec<Transition>) -> u64 {
        if !self.due_sorted {
            self.due.make_contiguous().sort_by_key(|e| e.at_ms);
            self.due_sorted = true;
        }
        let mut released = 0;
        while self
            .due
            .front()
            .is_some_and(|due| due.at_ms <= watermark_ms)
        {
            self.load_ahead();
            let Some(Due {
                fix_ms: upto,
                vehicle: slot,
                ..
            }) = self.due.pop_front()
            else {
                break;
            };
            let Some((vehicle, state)) = self.vehicles.at_mut(slot) else {
                continue;
            };
            // This fix is due, and every held fix of its vehicle dated
            // before it leaves with it: mostly the first few.
            let n = state.window.iter().take_while(|h| h.fix_ms <= upto).count();
            if n == 0 {
                continue;
            }
            self.held -= n;
            if self.track_changes && !state.changed {
                state.changed = true;
                self.changed.push(vehicle.clone());
            }
            let (index, settings) = (&self.index, &self.settings);
            release_front(
                index,
                settings,
                &mut self.stats,
                vehicle,
                state,
                n,
                &mut self.covering,
                self.track_changes.then_some(&mut self.held_log),
                out,
            );
            released += n as u64;
        }
        released
    }

    /// Starts loading what the releases a few entries down the due queue
    /// will read: the vehicle's slot, further ahead, then its window's
    /// first fixes, nearer (by then the slot has come in, so reading where
    /// the window is does not wait).
    fn load_ahead(&self) {
        if let Some(ahead) = self.due.get(LOAD_SLOT_AHEAD) {
            self.vehicles.prefetch(ahead.vehicle);
        }
        if let Some(near) = self.due.get(LOAD_WINDOW_AHEAD)
            && let Some(state) = self.vehicles.peek(near.vehicle)
            && let Some(first) = state.window.front()
        {
            prefetch(first);
        }
    }

    /// Applies every fix still waiting in a window, in fix-time order per
    /// vehicle (a graceful stop's drain); returns how many.
    pub fn release_all(&mut self, out: &mut Vec<Transition>) -> u64 {
        self.release_due(i64::MAX, out)
    }

    /// Forgets every vehicle not heard from for the idle expiry by
    /// `watermark_ms` whose window is empty, emitting an `exit` (cause
    /// `expired`, at the time it became idle) for each fence it was in.
    /// Sweeps at most once per [`EvaluatorSettings::sweep_every_ms`];
    /// returns how many vehicles it forgot.
    pub fn expire_idle(&mut self, watermark_ms: i64, out: &mut Vec<Transition>) -> usize {
        if watermark_ms < self.next_sweep_ms {
            return 0;
        }
        self.next_sweep_ms = watermark_ms.saturating_add(self.settings.sweep_every_ms());
        self.expire_now(watermark_ms, out)
    }

    /// [`Self::expire_idle`] without the sweep interval. The exits come in
    /// vehicle-id order, so that two runs write them alike.
    pub fn expire_now(&mut self, watermark_ms: i64, out: &mut Vec<Transition>) -> usize {
        let idle_ms = self.settings.idle_expiry_ms.max(1);
        let index = &self.index;
        let changed = &mut self.changed;
        let track = self.track_changes;
        let mut expired: Vec<(VehicleId, i64, Vec<FenceIdx>)> = Vec::new();
        self.vehicles.retain(|id, s| {
            let idle_at = s.last_heard_ms.saturating_add(idle_ms);
            let keep = idle_at > watermark_ms || !s.window.is_empty();
            if !keep {
                if track && !s.changed {
                    changed.push(id.clone());
                }
                expired.push((id.clone(), idle_at, std::mem::take(&mut s.members)));
            }
            keep
        });
        expired.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut exits = 0;
        for (vehicle, idle_at, members) in &expired {
            let mut leaving: Vec<Transition> = members
                .iter()
                .map(|&m| Transition {
                    cause: Some(Cause::Expired),
                    ..Transition::of(
                        vehicle,
                        index.fence(m),
                        TransitionKind::Exit,
                        *idle_at,
                        *idle_at,
                    )
                })
                .collect();
            // A deletion's exit still owed (the watermark had not reached
            // the change): the vehicle leaves by whichever came first.
            let owed = self.questions.remove(vehicle).unwrap_or_default();
            for st in owed
                .into_iter()
                .filter(|st| st.cause == Cause::FenceDeleted)
            {
                let (ts, cause) = if *idle_at < st.at_ms {
                    (*idle_at, Cause::Expired)
                } else {
                    (st.at_ms, Cause::FenceDeleted)
                };
                leaving.push(Transition {
                    vehicle: vehicle.clone(),
                    fence: st.fence,
                    event: TransitionKind::Exit,
                    ts,
                    cause: Some(cause),
                    fence_version: st.version,
                    received_ms: ts,
                    source: Some(st.source),
                });
            }
            leaving.sort_by(|a, b| (a.ts, &a.fence).cmp(&(b.ts, &b.fence)));
            exits += leaving.len();
            out.append(&mut leaving);
        }
        self.stats.exits += exits as u64;
        self.stats.expired += expired.len() as u64;
        expired.len()
    }

    /// Drains the vehicles changed since the last call into `out`, each
    /// with its state now (`None`: expired, delete it). The snapshots'
    /// windows are empty: held fixes are in the held log
    /// ([`Self::take_held`]).
    pub fn take_changed(&mut self, out: &mut Vec<(VehicleId, Option<VehicleSnapshot>)>) {
        for id in self.changed.drain(..) {
            let index = &self.index;
            let questions = self.questions.get(&id);
            let snapshot = self.vehicles.get_mut(&id).map(|s| {
                s.changed = false;
                // A deletion's exit still to come keeps its fence among the
                // members, so that a restart asks about it again.
                let doomed = doomed(questions).map(|st| st.fence.clone());
                VehicleSnapshot {
                    last_fix_ms: s.last_fix_ms,
                    last_digests: s.last_digests.clone(),
                    last_heard_ms: s.last_heard_ms,
                    members: s
                        .members
                        .iter()
                        .map(|&f| index.fence(f).id.clone())
                        .chain(doomed)
                        .collect(),
                    pending: s
                        .pending
                        .iter()
                        .map(|&(f, since)| (index.fence(f).id.clone(), since))
                        .collect(),
                    window: Vec::new(),
                    position: s.position().map(|p| (p.y, p.x)),
                    fences_version: settled_version(questions, index.version()),
                }
            });
            out.push((id, snapshot));
        }
    }

    /// Drains the fixes that entered or left a window since the last call
    /// into `out`, in the order it happened.
    pub fn take_held(&mut self, out: &mut Vec<HeldChange>) {
        out.append(&mut self.held_log);
    }

    /// Puts back a vehicle's committed state (at start, from the store).
    /// Fences no longer in the fence set are dropped without events, as a
    /// reload drops them, and the vehicle is then listed as changed: the
    /// store must hold what this process holds, or a later reload that
    /// brings the fence back and a crash would bring the membership back
    /// too.
    ///
    /// A membership of a fence deleted or changed after the record's
    /// `fences_version` is put in question as a running evaluator would
    /// have ([`Self::swap_index`]): its exit comes from
    /// [`Self::reconcile`], so a crash between a fence change and its
    /// exits' commit loses none of them.
    pub fn restore(&mut self, vehicle: VehicleId, snapshot: &VehicleSnapshot) {
        let index = &self.index;
        let settled = snapshot.fences_version;
        let mut members = Vec::with_capacity(snapshot.members.len());
        let mut stale = Vec::new();
        for id in &snapshot.members {
            match Standing::of_id(index, id, settled) {
                Standing::Same(f) => members.push(f),
                Standing::Changed(f) => {
                    members.push(f);
                    stale.push(Stale::changed(index.fence(f)));
                }
                Standing::Deleted(stale_one) => stale.push(stale_one),
                Standing::Gone => {}
            }
        }
        members.sort_unstable();
        members.dedup();
        members.truncate(self.settings.max_memberships);
        let mut dropped = 0;
        let pending: Vec<(FenceIdx, i64)> = snapshot
            .pending
            .iter()
            .filter_map(|(id, since)| match Standing::of_id(index, id, settled) {
                Standing::Same(f) | Standing::Changed(f) => Some((f, *since)),
                Standing::Deleted(_) | Standing::Gone => {
                    dropped += 1;
                    None
                }
            })
            .take(self.settings.max_memberships)
            .collect();
        self.stats.dwells_dropped += dropped;
        let shrank = members.len() + stale.len() < snapshot.members.len()
            || pending.len() < snapshot.pending.len();
        let changed = self.track_changes && (shrank || !stale.is_empty());
        if changed {
            self.changed.push(vehicle.clone());
        }
        let (last_lat, last_lon) = snapshot.position.unwrap_or((f64::NAN, f64::NAN));
        let questioned = !stale.is_empty();
        let slot = self.vehicles.insert(
            vehicle.clone(),
            VehicleState {
                last_fix_ms: snapshot.last_fix_ms,
                last_digests: snapshot.last_digests.clone(),
                last_heard_ms: snapshot.last_heard_ms,
                members,
                pending,
                window: snapshot.window.iter().copied().collect(),
                last_lat,
                last_lon,
                changed,
            },
        );
        if questioned {
            self.questions.insert(vehicle, stale);
        }
        let window_ms = self.settings.reorder_window_ms.max(0);
        self.due.extend(snapshot.window.iter().map(|h| Due {
            at_ms: h.received_ms.saturating_add(window_ms),
            fix_ms: h.fix_ms,
            vehicle: slot,
        }));
        // Restored vehicles come in any order: sorted before the next
        // release.
        self.due_sorted = false;
        self.held += snapshot.window.len();
    }

    /// Whether anything restored or changed is waiting for
    /// [`Self::take_changed`] or [`Self::take_held`].
    pub fn has_changes(&self) -> bool {
        !self.changed.is_empty() || !self.held_log.is_empty()
    }

    /// Swaps in a changed fence set; a fix evaluated from now on uses it.
    ///
    /// Memberships and dwells of unchanged fences carry over. A membership
    /// of a fence since deleted, or changed (its geometry may no longer
    /// hold the vehicle), is put in question: [`Self::reconcile`] answers
    /// it with an exit dated at the change, once the vehicle's input has
    /// caught up with it. A dwell in progress on a deleted fence is dropped
    /// (counted); one on a changed fence goes on. Nothing is entered: a
    /// fence created or widened under a vehicle is entered at its next fix.
    pub fn swap_index(&mut self, new: Arc<FenceIndex>) {
        let old = std::mem::replace(&mut self.index, new);
        // The batch's coverings name the old index's fences.
        self.batch_points.clear();
        let index = &self.index;
        let same_numbering = old.numbering() == index.numbering();
        let standing = |f: FenceIdx| {
            if same_numbering && index.is_live(f) {
                Standing::Same(f)
            } else {
                Standing::of_fence(index, old.fence(f))
            }
        };
        let mut dropped = 0;
        let mut asked = Vec::new();
        for (id, state) in self.vehicles.iter_mut() {
            let mut members = Vec::with_capacity(state.members.len());
            let mut questions = Vec::new();
            for &m in &state.members {
                match standing(m) {
                    Standing::Same(f) => members.push(f),
                    Standing::Changed(f) => {
                        members.push(f);
                        questions.push(Stale::changed(index.fence(f)));
                    }
                    Standing::Deleted(stale) => questions.push(stale),
                    Standing::Gone => {}
                }
            }
            members.sort_unstable();
            let gone = members.len() + questions.len() < state.members.len();
            state.members = members;
            let pending = state.pending.len();
            state.pending.retain_mut(|(f, _)| match standing(*f) {
                Standing::Same(n) | Standing::Changed(n) => {
                    *f = n;
                    true
                }
                Standing::Deleted(_) | Standing::Gone => false,
            });
            dropped += (pending - state.pending.len()) as u64;
            // The store must hear of every membership dropped or put in
            // question, or a restart would bring it back unasked.
            let shrank = gone || state.pending.len() < pending;
            if self.track_changes && (shrank || !questions.is_empty()) && !state.changed {
                state.changed = true;
                self.changed.push(id.clone());
            }
            if !questions.is_empty() {
                asked.push((id.clone(), questions));
            }
        }
        for (id, questions) in asked {
            let open = self.questions.entry(id).or_default();
            // A later change of a fence supersedes an open question about
            // its earlier change: answered as of the latest, as a restart
            // would answer it.
            open.retain(|q| {
                q.cause != Cause::FenceChanged || questions.iter().all(|n| n.fence != q.fence)
            });
            open.extend(questions);
        }
        self.stats.dwells_dropped += dropped;
    }

    /// Answers the memberships fence changes put in question, for each
    /// vehicle whose input has caught up with its change: `watermark_ms`
    /// has passed the change's time and no fix received before it still
    /// waits in the vehicle's window (DESIGN.md's timer rule: such an exit
    /// never overtakes the vehicle's own fixes). A deleted fence's
    /// membership ends with an exit, cause `fence_deleted`; a changed
    /// fence's ends, cause `fence_changed`, if the vehicle's last position
    /// is clear outside the new geometry (the hysteresis rule's exit).
    /// Each exit is dated at its change and carries its version; a
    /// vehicle's exits come in (time, fence id) order, vehicles in id
    /// order. Returns how many exits it made.
    pub fn reconcile(&mut self, watermark_ms: i64, out: &mut Vec<Transition>) -> usize {
        if self.questions.is_empty() {
            return 0;
        }
        let mut made = 0;
        let (index, settings) = (&self.index, &self.settings);
        let mut waiting = BTreeMap::new();
        for (vehicle, questions) in std::mem::take(&mut self.questions) {
            let Some(state) = self.vehicles.get_mut(&vehicle) else {
                continue;
            };
            let first_arrival = state.window.iter().map(|h| h.received_ms).min();
            let ready = |st: &Stale| {
                st.at_ms <= watermark_ms && first_arrival.is_none_or(|r| r >= st.at_ms)
            };
            let (mut due, rest): (Vec<Stale>, Vec<Stale>) = questions.into_iter().partition(ready);
            if !rest.is_empty() {
                waiting.insert(vehicle.clone(), rest);
            }
            if due.is_empty() {
                continue;
            }
            due.sort_by(|a, b| (a.at_ms, &a.fence).cmp(&(b.at_ms, &b.fence)));
            let position = state.position();
            for st in due {
                if st.cause == Cause::FenceChanged {
                    let Some(f) = index.find(&st.fence) else {
                        continue;
                    };
                    let fence = index.fence(f);
                    let stays = position
                        .is_none_or(|p| fence.covers(p) || !settings.clear_of_boundary(fence, p));
                    let Ok(at) = state.members.binary_search(&f) else {
                        continue;
                    };
                    if stays {
                        continue;
                    }
                    state.members.remove(at);
                }
                out.push(Transition {
                    vehicle: vehicle.clone(),
                    fence: st.fence,
                    event: TransitionKind::Exit,
                    ts: st.at_ms,
                    cause: Some(st.cause),
                    fence_version: st.version,
                    received_ms: st.at_ms,
                    source: Some(st.source),
                });
                made += 1;
            }
            if self.track_changes && !state.changed {
                state.changed = true;
                self.changed.push(vehicle);
            } else if !self.track_changes {
                state.changed = false;
            }
        }
        self.questions = waiting;
        self.stats.exits += made as u64;
        self.stats.change_exits += made as u64;
        made
    }
}

/// Where a membership stands in a new fence set.
enum Standing {
    /// The same fence, at this position.
    Same(FenceIdx),
    /// Its fence changed since, now at this position.
    Changed(FenceIdx),
    /// Its fence was deleted since.
    Deleted(Stale),
    /// Its fence is gone with no deletion on record (a fence file edited
    /// while geogate was down): dropped without an event.
    Gone,
}

impl Standing {
    /// Where a membership of `old` stands in `index`.
    fn of_fence(index: &FenceIndex, old: &Fence) -> Self {
        Self::of_id(index, &old.id, old.version)
    }

    /// Where a membership of fence `id`, settled as of `version`, stands
    /// in `index`.
    fn of_id(index: &FenceIndex, id: &str, version: u64) -> Self {
        if let Some(t) = index.tombstone(id).filter(|t| t.version > version) {
            return Self::Deleted(Stale {
                fence: id.into(),
                source: t.source.clone(),
                cause: Cause::FenceDeleted,
                version: t.version,
                at_ms: t.at_ms,
            });
        }
        match index.find(id) {
            Some(f) if index.fence(f).version > version => Self::Changed(f),
            Some(f) => Self::Same(f),
            None => Self::Gone,
        }
    }
}

impl Stale {
    fn changed(fence: &Fence) -> Self {
        Self {
            fence: fence.id.clone(),
            source: fence.source.clone(),
            cause: Cause::FenceChanged,
            version: fence.version,
            at_ms: fence.changed_ms,
        }
    }
}

/// Applies the first `n` fixes of the vehicle's window, in order, taking
/// them out of it (and out of the held log, when one is kept).
#[allow(clippy::too_many_arguments)]
fn release_front(
    index: &FenceIndex,
    settings: &EvaluatorSettings,
    stats: &mut EvaluatorStats,
    vehicle: &VehicleId,
    state: &mut VehicleState,
    n: usize,
    scratch: &mut Vec<FenceIdx>,
    mut held_log: Option<&mut Vec<HeldChange>>,
    out: &mut Vec<Transition>,
) {
    for _ in 0..n {
        let Some(h) = state.window.pop_front() else {
            return;
        };
        if let Some(log) = held_log.as_deref_mut()
            && h.key != 0
        {
            log.push(HeldChange::Left(h.key));
        }
        apply(
            index, settings, stats, vehicle, state, h, None, scratch, out,
        );
    }
}

/// Applies one fix to its vehicle's state: exits, then enters with dwell
/// bookkeeping. `covering` is the fix's covering fences when the caller
/// looked them up in a batch; else they are looked up into `scratch`.
#[allow(clippy::too_many_arguments)]
fn apply(
    index: &FenceIndex,
    settings: &EvaluatorSettings,
    stats: &mut EvaluatorStats,
    vehicle: &VehicleId,
    state: &mut VehicleState,
    fix: HeldFix,
    covering: Option<&[FenceIdx]>,
    scratch: &mut Vec<FenceIdx>,
    out: &mut Vec<Transition>,
) {
    let p = Coord {
        x: fix.lon,
        y: fix.lat,
    };
    let fix_ms = fix.fix_ms;
    stats.evaluated += 1;
    // A changed fence's open question is answered from here on by this
    // position: a member it keeps stays, one it exits is gone.
    state.last_lat = fix.lat;
    state.last_lon = fix.lon;
    if fix_ms != state.last_fix_ms {
        state.last_digests.clear();
    }
    if state.last_digests.len() < SAME_TIME_DIGESTS {
        state.last_digests.push(fix.digest);
    }
    state.last_fix_ms = fix_ms;
    let covering: &[FenceIdx] = match covering {
        Some(c) => c,
        None => {
            index.containing(p, scratch);
            scratch
        }
    };
    let clear_of_boundary = |f: FenceIdx| settings.clear_of_boundary(index.fence(f), p);
    let transition = |f: FenceIdx, event| {
        Transition::of(vehicle, index.fence(f), event, fix_ms, fix.received_ms)
    };

    // Exits first.
    let exits_from = out.len();
    state.members.retain(|&m| {
        let stays = covering.binary_search(&m).is_ok() || !clear_of_boundary(m);
        if !stays {
            out.push(transition(m, TransitionKind::Exit));
            stats.exits += 1;
        }
        stays
    });

    by_fence_id(&mut out[exits_from..]);

    // Then enters, with dwell bookkeeping.
    let enters_from = out.len();
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
    by_fence_id(&mut out[enters_from..]);
    pending.truncate(settings.max_memberships);
    state.pending = pending;
}

/// Puts one group of a fix's transitions in fence id order. Positions
/// follow ids in a set as built; fences changed since sit after them, so
/// a group naming one of those is sorted here.
fn by_fence_id(group: &mut [Transition]) {
    if group.len() > 1 && !group.is_sorted_by(|a, b| a.fence <= b.fence) {
        group.sort_by(|a, b| a.fence.cmp(&b.fence));
    }
}
