//! `[state]`: which backend keeps per-vehicle state, and its settings.
//!
//! The section is flat in the file (`backend`, `path`, `urls`, ...); here
//! each backend's keys are grouped under it ([`EmbeddedConfig`],
//! [`PartitionedConfig`]), and a key that the chosen backend does not read
//! is refused by name rather than silently ignored.

use crate::problems::Problems;
use crate::sink::config::FsyncPolicy;
pub use crate::state::partitioned::config::PartitionedConfig;
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// Nothing survives the process: benchmarks, throwaway runs.
    Memory,
    /// A SQLite file at `path` (see `state::embedded`).
    Embedded,
    /// Retired: vehicle state shared in Redis. Still parsed, so that
    /// `config check` can refuse it with the way to migrate rather than
    /// as an unknown word.
    Redis,
    /// Ordered partitions in NATS JetStream at `urls`, one owner each
    /// (see `state::partitioned`).
    Partitioned,
}

impl StateBackend {
    fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Embedded => "embedded",
            Self::Redis => "redis",
            Self::Partitioned => "partitioned",
        }
    }
}

/// Where per-vehicle state and the outbox live (see `state`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(from = "StateSection")]
pub struct StateConfig {
    pub backend: StateBackend,
    /// `flush`: a commit survives a process crash; `always`: it is fsynced
    /// and survives power loss too. Applies to the events file as well.
    pub fsync: FsyncPolicy,
    /// Start from no state even if the file holds some (`--reset-state`);
    /// never read from the file, so a reset is always explicit.
    pub reset: bool,
    /// Start even though the events file lacks transitions the store has
    /// already pruned (`--accept-events-gap`): they are lost, and this
    /// says so. Never read from the file, like `reset`.
    pub accept_events_gap: bool,
    pub embedded: EmbeddedConfig,
    pub partitioned: PartitionedConfig,
    /// The backend-specific keys the file set, to refuse those the chosen
    /// backend does not read.
    pub written: Vec<&'static str>,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            backend: StateBackend::Embedded,
            fsync: FsyncPolicy::Flush,
            reset: false,
            accept_events_gap: false,
            embedded: EmbeddedConfig::default(),
            partitioned: PartitionedConfig::default(),
            written: Vec::new(),
        }
    }
}

/// The embedded backend's keys (see `super::embedded`).
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddedConfig {
    /// The SQLite file: one geogate per file.
    pub path: PathBuf,
}

/// Keys only the retired redis backend read. Still accepted by the
/// parser, so that a config written for it reaches `config check` and
/// hears how to migrate, instead of failing on an unknown key; refused
/// there by name under any backend that checks its keys.
const RETIRED_REDIS_KEYS: &[&str] = &["cluster", "prefix", "claim_idle_s"];

/// `[state]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateSection {
    backend: Option<StateBackend>,
    fsync: Option<FsyncPolicy>,
    path: Option<PathBuf>,
    urls: Option<Vec<String>>,
    partitions: Option<u32>,
    timeout_ms: Option<u64>,
    // The retired redis backend's own keys: only whether they are there
    // matters (see `RETIRED_REDIS_KEYS`).
    cluster: Option<IgnoredAny>,
    prefix: Option<IgnoredAny>,
    claim_idle_s: Option<IgnoredAny>,
    lease_term_s: Option<f64>,
    snapshot_every: Option<u64>,
    keep_input: Option<bool>,
    events_max_age_s: Option<u64>,
    user: Option<String>,
    password_file: Option<PathBuf>,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

impl From<StateSection> for StateConfig {
    fn from(s: StateSection) -> Self {
        let mut c = StateConfig::default();
        let mut written = Vec::new();
        let mut set = |name: &'static str, present: bool| {
            if present {
                written.push(name);
            }
        };
        set("path", s.path.is_some());
        set("urls", s.urls.is_some());
        set("cluster", s.cluster.is_some());
        set("prefix", s.prefix.is_some());
        set("partitions", s.partitions.is_some());
        set("claim_idle_s", s.claim_idle_s.is_some());
        set("timeout_ms", s.timeout_ms.is_some());
        set("lease_term_s", s.lease_term_s.is_some());
        set("snapshot_every", s.snapshot_every.is_some());
        set("keep_input", s.keep_input.is_some());
        set("events_max_age_s", s.events_max_age_s.is_some());
        set("user", s.user.is_some());
        set("password_file", s.password_file.is_some());
        set("ca", s.ca.is_some());
        set("cert", s.cert.is_some());
        set("key", s.key.is_some());
        c.backend = s.backend.unwrap_or(c.backend);
        c.fsync = s.fsync.unwrap_or(c.fsync);
        let e = &mut c.embedded;
        e.path = s.path.unwrap_or_else(|| e.path.clone());
        let p = &mut c.partitioned;
        p.urls = s.urls.unwrap_or_default();
        p.partitions = s.partitions.unwrap_or(p.partitions);
        p.timeout_ms = s.timeout_ms.unwrap_or(p.timeout_ms);
        p.lease_term_s = s.lease_term_s.unwrap_or(p.lease_term_s);
        p.snapshot_every = s.snapshot_every.unwrap_or(p.snapshot_every);
        p.keep_input = s.keep_input.unwrap_or(p.keep_input);
        p.events_max_age_s = s.events_max_age_s.unwrap_or(p.events_max_age_s);
        p.user = s.user;
        p.password_file = s.password_file;
        p.ca = s.ca;
        p.cert = s.cert;
        p.key = s.key;
        c.written = written;
        c
    }
}

impl StateConfig {
    /// Checks the chosen backend's keys; `events` and `dead_letter` are
    /// the other files the run writes, which the state must not share.
    pub fn check(&self, events: Option<&Path>, dead_letter: &Path, problems: &mut Problems) {
        let reads: Option<&[&str]> = match self.backend {
            // The memory backend keeps nothing, so another backend's keys
            // left in the file (switched to memory for a throwaway run) are
            // harmless; the redis backend is refused whole below, which is
            // what its user needs to hear.
            StateBackend::Memory | StateBackend::Redis => None,
            StateBackend::Embedded => Some(EmbeddedConfig::KEYS),
            StateBackend::Partitioned => Some(PartitionedConfig::KEYS),
        };
        let foreign = reads
            .into_iter()
            .flat_map(|reads| self.written.iter().filter(move |k| !reads.contains(k)));
        for key in foreign {
            let message = if RETIRED_REDIS_KEYS.contains(key) {
                "a setting of the retired redis backend, read by no backend now; remove it"
                    .to_owned()
            } else {
                format!(
                    "not read by backend = \"{}\" (it is a setting for another backend); remove it or choose the backend it belongs to",
                    self.backend.as_str()
                )
            };
            problems.add(format!("state.{key}"), message);
        }
        match self.backend {
            StateBackend::Memory => {}
            StateBackend::Embedded => self.embedded.check(events, dead_letter, problems),
            StateBackend::Redis => problems.add(
                "state.backend",
                "backend = \"redis\" is retired: several instances sharing vehicle state in Redis race each other's fixes and lose order (README, \"Migrating from the Redis state backend\"); use backend = \"partitioned\" to run several instances, or \"embedded\" for one",
            ),
            StateBackend::Partitioned => self.partitioned.check(events, problems),
        }
    }
}
