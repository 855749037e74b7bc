//! Which rows of the held-fix log ([`super::held_rows`]) may go: a row
//! goes once none of the fixes it logged still waits, and only with every
//! row before it, since a later row's "left" for a fix must not outlive the
//! row where that fix entered.
//!
//! A fix is found by its key: each shard numbers its fixes upward within a
//! range of its own ([`crate::state::local::held_keys`]), so a row holds,
//! per range, the keys from its first one up to the next row's first one
//! in that range.

use crate::state::local::held_batch::HeldRun;
use crate::state::local::held_keys::{RANGE_BITS, range_of};
use std::collections::{HashMap, VecDeque};

pub struct HeldLog {
    /// The id of the oldest row kept (`waiting[0]`'s).
    first_id: i64,
    /// Per row kept, oldest first: how many of the fixes it logged wait.
    waiting: VecDeque<usize>,
    /// Per key range: (first key, row id) of each row kept that logged
    /// keys of that range, oldest first.
    ranges: HashMap<u64, VecDeque<(u64, i64)>>,
}

/// What one commit does to the log: worked out before the commit, and
/// taken into account ([`HeldLog::committed`]) only once it has
/// succeeded, so that a commit that fails and is retried counts once.
#[derive(Debug, Default)]
pub struct HeldPlan {
    /// The id of the row to insert with the commit's changes; `None` when
    /// there are none, or when none of them will matter once the rows
    /// before it go (every fix it logged has left, and so has every fix it
    /// says left).
    pub insert: Option<i64>,
    /// Rows up to this id go.
    pub delete_through: Option<i64>,
    /// (row position, how many of its fixes left).
    left: Vec<(usize, usize)>,
    /// The new row's fixes still waiting, and its first key per range.
    new_waiting: usize,
    new_ranges: Vec<(u64, u64)>,
}

impl HeldLog {
    /// The log after one row of the fixes `keys` (ascending) as row
    /// `id`: what a store compacted at open holds.
    pub fn one_row(id: i64, keys: &[u64]) -> Self {
        let mut ranges: HashMap<u64, VecDeque<(u64, i64)>> = HashMap::new();
        for &key in keys {
            let rows = ranges.entry(range_of(key)).or_default();
            if rows.is_empty() {
                rows.push_back((key, id));
            }
        }
        // An empty log's next row takes id + 1, as after row `id`.
        let (first_id, waiting) = if keys.is_empty() {
            (id + 1, VecDeque::new())
        } else {
            (id, VecDeque::from([keys.len()]))
        };
        Self {
            first_id,
            waiting,
            ranges,
        }
    }

    /// The id the next row takes.
    fn next_id(&self) -> i64 {
        self.first_id + self.waiting.len() as i64
    }

    /// The row that logged `key`, by position (`None`: no row kept did),
    /// and the first key past it in its range that the row does not hold
    /// (the next row's first, or `new_first`, the new row's, if above).
    fn span_of(&self, key: u64, new_first: Option<u64>) -> (Option<usize>, u64) {
        let range_end = (range_of(key) + 1).saturating_mul(1 << RANGE_BITS);
        let new_first = new_first.filter(|&f| f > key).unwrap_or(u64::MAX);
        let Some(rows) = self.ranges.get(&range_of(key)) else {
            return (None, range_end.min(new_first));
        };
        let after = rows.partition_point(|&(first, _)| first <= key);
        let end = rows
            .get(after)
            .map_or(u64::MAX, |&(first, _)| first)
            .min(range_end)
            .min(new_first);
        let at = after
            .checked_sub(1)
            .and_then(|i| usize::try_from(rows[i].1 - self.first_id).ok())
            .filter(|&at| at < self.waiting.len());
        (at, end)
    }

    /// What committing changes that touch the keys of `runs` does to the
    /// log.
    pub fn plan(&self, runs: &[HeldRun]) -> HeldPlan {
        if runs.is_empty() {
            return HeldPlan::default();
        }
        let mut plan = HeldPlan::default();
        let mut left = vec![0usize; self.waiting.len()];
        for run in runs {
            match *run {
                HeldRun::Entered { first, count } => {
                    plan.new_waiting += count as usize;
                    let range = range_of(first);
                    match plan.new_ranges.iter_mut().find(|(r, _)| *r == range) {
                        Some((_, f)) => *f = (*f).min(first),
                        None => plan.new_ranges.push((range, first)),
                    }
                }
                HeldRun::Left {
                    mut first,
                    mut count,
                } => {
                    while count > 0 {
                        let range = range_of(first);
                        let in_new = plan
                            .new_ranges
                            .iter()
                            .find(|(r, _)| *r == range)
                            .map(|&(_, f)| f);
                        if in_new.is_some_and(|f| f <= first) {
                            plan.new_waiting = plan.new_waiting.saturating_sub(count as usize);
                            break;
                        }
                        let (at, end) = self.span_of(first, in_new);
                        let n = count.min(end.saturating_sub(first)).max(1);
                        if let Some(at) = at {
                            left[at] += n as usize;
                        }
                        first = first.saturating_add(n);
                        count -= n;
                    }
                }
            }
        }
        let mut gone = 0;
        while gone < self.waiting.len() && self.waiting[gone] <= left[gone] {
            gone += 1;
        }
        let id = self.next_id();
        if gone == self.waiting.len() && plan.new_waiting == 0 {
            // Every row goes, and the new one would say nothing that
            // matters without them.
            plan.new_ranges.clear();
        } else {
            plan.insert = Some(id);
        }
        plan.delete_through = (gone > 0).then(|| self.first_id + gone as i64 - 1);
        plan.left = left
            .into_iter()
            .enumerate()
            .filter(|&(_, n)| n > 0)
            .collect();
        plan
    }

    /// Takes a committed plan into account.
    pub fn committed(&mut self, plan: HeldPlan) {
        for (at, n) in plan.left {
            self.waiting[at] = self.waiting[at].saturating_sub(n);
        }
        if let Some(id) = plan.insert {
            debug_assert_eq!(id, self.next_id());
            self.waiting.push_back(plan.new_waiting);
            for (range, first) in plan.new_ranges {
                self.ranges.entry(range).or_default().push_back((first, id));
            }
        }
        if let Some(through) = plan.delete_through {
            while self.first_id <= through && self.waiting.pop_front().is_some() {
                self.first_id += 1;
            }
            if self.waiting.is_empty() {
                self.first_id = self.first_id.max(through + 1);
            }
            self.ranges.retain(|_, rows| {
                while rows.front().is_some_and(|&(_, id)| id <= through) {
                    rows.pop_front();
                }
                !rows.is_empty()
            });
        }
    }

    /// Rows kept.
    #[cfg(test)]
    fn rows(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geofence::{HeldChange, HeldFix};
    use crate::state::local::held_batch::HeldBatch;
    use crate::state::local::held_keys::first_of_shard;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn held(key: u64) -> HeldChange {
        HeldChange::Held(
            "v".into(),
            HeldFix {
                fix_ms: 0,
                lat: 0.0,
                lon: 0.0,
                received_ms: 0,
                digest: 0,
                key,
            },
        )
    }

    /// One step: a commit of (shard's new fix | a waiting fix leaves)
    /// changes, or a restart.
    #[derive(Debug, Clone)]
    enum Step {
        Commit(Vec<(bool, usize)>),
        Restart,
    }

    fn steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                8 => prop::collection::vec((any::<bool>(), 0usize..1000), 0..12).prop_map(Step::Commit),
                1 => Just(Step::Restart),
            ],
            1..60,
        )
    }

    /// What the table's rows, read in order, leave waiting.
    fn replayed(table: &BTreeMap<i64, Vec<HeldChange>>) -> BTreeSet<u64> {
        let mut waiting = BTreeSet::new();
        for change in table.values().flatten() {
            match change {
                HeldChange::Held(_, fix) => {
                    waiting.insert(fix.key);
                }
                HeldChange::Left(key) => {
                    waiting.remove(key);
                }
            }
        }
        waiting
    }

    fn commit(
        log: &mut HeldLog,
        table: &mut BTreeMap<i64, Vec<HeldChange>>,
        changes: Vec<HeldChange>,
    ) {
        let plan = log.plan(&HeldBatch::from_changes(&changes).runs);
        if let Some(id) = plan.insert {
            assert!(!table.contains_key(&id), "row {id} inserted twice");
            table.insert(id, changes);
        }
        if let Some(through) = plan.delete_through {
            table.retain(|&id, _| id > through);
        }
        log.committed(plan);
    }

    proptest! {
        /// Whatever enters and leaves, and across restarts (the log
        /// compacted, the waiting fixes numbered again in range 0, the
        /// shards numbering from the start of their ranges), the rows
        /// kept replay to exactly the fixes waiting; with none waiting,
        /// no row is kept.
        #[test]
        fn the_rows_kept_replay_to_the_fixes_waiting(steps in steps()) {
            let shards = 3;
            let mut log = HeldLog::one_row(1, &[]);
            let mut table = BTreeMap::new();
            let mut waiting: Vec<u64> = Vec::new();
            let mut next: Vec<u64> = (0..shards).map(first_of_shard).collect();
            for step in steps {
                match step {
                    Step::Commit(ops) => {
                        let mut changes = Vec::new();
                        for (enter, pick) in ops {
                            if enter || waiting.is_empty() {
                                let shard = pick % shards;
                                waiting.push(next[shard]);
                                changes.push(held(next[shard]));
                                next[shard] += 1;
                            } else {
                                // Mostly the oldest (runs of keys that cross
                        // rows), now and then any.
                        let at = if pick % 2 == 0 {
                            (0..waiting.len()).min_by_key(|&i| waiting[i]).unwrap_or(0)
                        } else {
                            pick % waiting.len()
                        };
                        let key = waiting.swap_remove(at);
                                changes.push(HeldChange::Left(key));
                            }
                        }
                        commit(&mut log, &mut table, changes);
                    }
                    Step::Restart => {
                        // Compacted at open: one row of what waits.
                        let mut keys: Vec<u64> = replayed(&table).into_iter().collect();
                        keys.sort_unstable();
                        let id = table.keys().next_back().map_or(1, |l| l + 1);
                        table.clear();
                        if !keys.is_empty() {
                            table.insert(id, keys.iter().map(|&k| held(k)).collect());
                        }
                        log = HeldLog::one_row(id, &keys);
                        // Numbered again in range 0.
                        let mut changes: Vec<HeldChange> =
                            keys.iter().map(|&k| HeldChange::Left(k)).collect();
                        waiting = (1..=keys.len() as u64).collect();
                        changes.extend(waiting.iter().map(|&k| held(k)));
                        commit(&mut log, &mut table, changes);
                        next = (0..shards).map(first_of_shard).collect();
                    }
                }
                let expected: BTreeSet<u64> = waiting.iter().copied().collect();
                prop_assert_eq!(replayed(&table), expected);
                prop_assert_eq!(table.len(), log.rows());
                if waiting.is_empty() {
                    prop_assert!(table.is_empty(), "rows kept with nothing waiting: {:?}", table.keys());
                }
            }
        }
    }
}
