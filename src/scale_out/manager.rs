//! Which partitions this instance owns, tick by tick: takes the ones
//! rendezvous hashing gives it once their lease is free, renews them,
//! hands over the ones that should move, and steps down from the ones
//! whose lease another instance took or it could not renew.
//!
//! The manager never waits for an owner inside a tick (an owner may be
//! slow to stop: a read of a long log, a dead letter that cannot be
//! written): a stopped owner is kept aside and reaped at a later tick,
//! while heartbeats and renewals go on.

use super::members::{Heartbeat, owner_of};
use super::owner::{self, OwnerContext};
use crate::state::partitioned::PartitionError;
use crate::state::partitioned::lease::{ExpiryWatch, Lease, Leases};
use crate::state::partitioned::metrics::{
    OWNER_FAILURES_TOTAL, OWNERSHIP_CHANGES_TOTAL, PARTITION_OWNED,
};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A released lease names no holder: free to take at once.
const RELEASED: &str = "";

/// How long a partition whose owner failed (an engine error at start, a
/// commit the engine cannot take) waits before this instance owns it
/// again: a failure that repeats costs a takeover commit each time.
const AFTER_FAILURE: Duration = Duration::from_secs(5);

struct Owned {
    lease: Lease,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), PartitionError>>,
    /// Finishing to hand over to this instance; released once the task ends.
    handing_to: Option<String>,
    /// When the lease was last renewed, on this machine's clock: an
    /// owner that cannot renew for a whole term stops.
    renewed: Instant,
}

/// An owner told to stop whose lease is no longer this instance's.
struct Stopping {
    partition: u32,
    task: JoinHandle<Result<(), PartitionError>>,
}

pub struct Manager {
    instance: String,
    /// The leases' holder: the instance and a token of this process, so
    /// that a second process under the same name (or an old one resumed)
    /// never takes this one's leases for its own.
    holder: String,
    partitions: u32,
    term: Duration,
    leases: Leases,
    watch: ExpiryWatch,
    owned: BTreeMap<u32, Owned>,
    stopping: Vec<Stopping>,
    /// Partitions not to take again before the instant given.
    resting: HashMap<u32, Instant>,
    ctx: OwnerContext,
}

impl Manager {
    pub fn new(
        instance: String,
        partitions: u32,
        term: Duration,
        leases: Leases,
        ctx: OwnerContext,
    ) -> Self {
        Self {
            holder: format!("{instance}#{}", process_token()),
            instance,
            partitions,
            term,
            leases,
            watch: ExpiryWatch::new(term),
            owned: BTreeMap::new(),
            stopping: Vec::new(),
            resting: HashMap::new(),
            ctx,
        }
    }

    /// One round: reap what ended, then for each partition keep, hand
    /// over or take it as `live` says.
    pub async fn tick(&mut self, live: &BTreeMap<String, Heartbeat>) {
        self.reap();
        // Every lease is watched from the first tick that sees it, so one
        // left by a dead instance runs out a term after its last renewal,
        // not a term after this instance first wanted its partition.
        let mut leases = match self.leases.all(self.partitions).await {
            Ok(leases) => leases,
            Err(e) => {
                tracing::warn!("{e}");
                self.stop_unrenewed();
                return;
            }
        };
        let now = Instant::now();
        for lease in leases.values() {
            self.watch.expired(lease, now);
        }
        for p in 0..self.partitions {
            let wanted = owner_of(p, live.keys().map(String::as_str)).map(str::to_owned);
            let mine = wanted.as_deref() == Some(self.instance.as_str());
            if self.owned.contains_key(&p) {
                self.keep_or_hand_over(p, mine, wanted).await;
            } else if mine && !self.busy(p, now) {
                self.try_take(p, leases.remove(&p)).await;
            }
        }
        self.stop_unrenewed();
    }

    /// A partition this instance cannot take now: its last owner here is
    /// still stopping, or failed a moment ago.
    fn busy(&self, p: u32, now: Instant) -> bool {
        self.stopping.iter().any(|s| s.partition == p)
            || self.resting.get(&p).is_some_and(|until| now < *until)
    }

    /// Renews a partition it should keep; starts handing over one that
    /// should move.
    async fn keep_or_hand_over(&mut self, p: u32, mine: bool, wanted: Option<String>) {
        let Some(owned) = self.owned.get_mut(&p) else {
            return;
        };
        if !mine && owned.handing_to.is_none() {
            tracing::info!(partition = p, to = ?wanted, "handing the partition over");
            owned.handing_to = wanted;
            let _ = owned.stop.send(true);
        }
        match self.leases.renew(&owned.lease).await {
            Ok(lease) => {
                owned.lease = lease;
                owned.renewed = Instant::now();
            }
            Err(PartitionError::LeaseLost { .. }) => {
                tracing::warn!(
                    partition = p,
                    "lease taken by another instance: stepping down"
                );
                self.step_down(p);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }

    /// Takes partition `p`, whose lease is `current`, if that is free,
    /// released, this process's own, or run out.
    async fn try_take(&mut self, p: u32, current: Option<Lease>) {
        let free = match &current {
            None => true,
            Some(l) if l.holder == RELEASED || l.holder == self.holder => true,
            Some(l) => self.watch.expired(l, Instant::now()),
        };
        if !free {
            return;
        }
        let lease = match self.leases.take(p, &self.holder, current.as_ref()).await {
            Ok(lease) => lease,
            Err(PartitionError::LeaseLost { .. }) => return,
            Err(e) => {
                tracing::warn!("{e}");
                return;
            }
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(owner::own(p, self.ctx.clone(), stopped));
        metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(1.0);
        metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => "taken").increment(1);
        self.owned.insert(
            p,
            Owned {
                lease,
                stop,
                task,
                handing_to: None,
                renewed: Instant::now(),
            },
        );
    }

    /// Stops the owner of `p`, whose lease is another's now (or could not
    /// be renewed): it is reaped once it has stopped.
    fn step_down(&mut self, p: u32) {
        if let Some(owned) = self.owned.remove(&p) {
            let _ = owned.stop.send(true);
            metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(0.0);
            metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => "lost").increment(1);
            self.stopping.push(Stopping {
                partition: p,
                task: owned.task,
            });
        }
    }

    /// Steps down from the partitions whose lease has not been renewed
    /// for a whole term (the engine unreachable): another instance may
    /// hold it now.
    fn stop_unrenewed(&mut self) {
        let stale: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.renewed.elapsed() >= self.term)
            .map(|(p, _)| *p)
            .collect();
        for p in stale {
            tracing::warn!(partition = p, "lease not renewed for a term: stepping down");
            self.step_down(p);
        }
    }

    /// Finishes with the owners that have ended: handed over (their lease
    /// is released then), deposed, or failed (the partition rests a
    /// moment before this instance takes it again).
    fn reap(&mut self) {
        let now = Instant::now();
        let ended: Vec<u32> = self
            .owned
            .iter()
            .filter(|(_, o)| o.task.is_finished())
            .map(|(p, _)| *p)
            .collect();
        for p in ended {
            let Some(owned) = self.owned.remove(&p) else {
                continue;
            };
            let handed = owned.handing_to.is_some();
            if self.ended(p, owned.task, now) && handed {
                let (leases, lease) = (self.leases.clone(), owned.lease.clone());
                // Released in the background: the next owner takes it at
                // its next tick, or a term later if this write is lost.
                tokio::spawn(async move {
                    if let Err(e) = leases.take(p, RELEASED, Some(&lease)).await {
                        tracing::warn!("partition {p}: releasing the lease: {e}");
                    }
                });
            }
            metrics::gauge!(PARTITION_OWNED, "partition" => p.to_string()).set(0.0);
            let change = if handed { "handed_off" } else { "lost" };
            metrics::counter!(OWNERSHIP_CHANGES_TOTAL, "change" => change).increment(1);
        }
        let mut i = 0;
        while i < self.stopping.len() {
            if self.stopping[i].task.is_finished() {
                let s = self.stopping.swap_remove(i);
                self.ended(s.partition, s.task, now);
            } else {
                i += 1;
            }
        }
    }

    /// Reports how a finished owner ended; whether it ended well.
    fn ended(
        &mut self,
        p: u32,
        task: JoinHandle<Result<(), PartitionError>>,
        now: Instant,
    ) -> bool {
        use futures_util::FutureExt;
        // Finished: ready at once.
        match task.now_or_never() {
            None | Some(Ok(Ok(()))) => true,
            Some(Err(e)) => {
                tracing::error!("partition {p}: owner task failed: {e}");
                self.resting.insert(p, now + AFTER_FAILURE);
                false
            }
            Some(Ok(Err(e))) => {
                let deposed = matches!(e, PartitionError::Deposed { .. });
                if deposed {
                    tracing::warn!("partition {p}: {e}");
                } else {
                    tracing::error!("partition {p}: owner failed: {e}");
                    metrics::counter!(OWNER_FAILURES_TOTAL).increment(1);
                    self.resting.insert(p, now + AFTER_FAILURE);
                }
                false
            }
        }
    }

    /// Finishes every partition and releases its lease (a graceful stop),
    /// waiting at most `deadline` for the owners.
    pub async fn release_all(&mut self, deadline: Duration) {
        for owned in self.owned.values_mut() {
            owned.handing_to.get_or_insert_with(String::new);
            let _ = owned.stop.send(true);
        }
        let until = Instant::now() + deadline;
        while !self.owned.is_empty() && Instant::now() < until {
            // Keep the leases while the owners finish their last commits.
            let held: Vec<u32> = self.owned.keys().copied().collect();
            for p in held {
                if let Some(owned) = self.owned.get_mut(&p)
                    && !owned.task.is_finished()
                    && owned.renewed.elapsed() >= self.term / 3
                    && let Ok(lease) = self.leases.renew(&owned.lease).await
                {
                    owned.lease = lease;
                    owned.renewed = Instant::now();
                }
            }
            self.reap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Releases are written in the background: give them a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        for (p, owned) in std::mem::take(&mut self.owned) {
            tracing::warn!("partition {p}: its owner did not finish within the drain deadline");
            owned.task.abort();
        }
        // Owners that stepped down and are still finishing: their leases
        // are another's already, and they must not hold the stop up.
        for stopping in std::mem::take(&mut self.stopping) {
            stopping.task.abort();
        }
    }
}

/// 64 random bits for this process's leases.
fn process_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish()
    )
}
