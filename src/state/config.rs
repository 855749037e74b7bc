//! `[state]`: which backend keeps per-vehicle state, and its settings.
//!
//! The section is flat in the file (`backend`, `path`, `urls`, ...); here
//! each backend's keys are grouped under it ([`EmbeddedConfig`],
//! [`RedisConfig`]), whose defaults and checks live in the backend's own
//! folder, and a key that the chosen backend does not read is refused by
//! name rather than silently ignored.

use crate::problems::Problems;
use crate::sink::config::FsyncPolicy;
pub use crate::state::partitioned::config::PartitionedConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// Nothing survives the process: benchmarks, throwaway runs.
    Memory,
    /// A SQLite file at `path` (see `state::embedded`).
    Embedded,
    /// Redis (a node or a Cluster) at `urls`, shared by every instance
    /// (see `state::redis`). Retired: `config check` refuses it.
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
    pub redis: RedisConfig,
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
            redis: RedisConfig::default(),
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

/// The redis backend's keys (see `super::redis`).
#[derive(Debug, Clone, PartialEq)]
pub struct RedisConfig {
    /// One node, or a Cluster's seed nodes (then `cluster = true`).
    pub urls: Vec<String>,
    pub cluster: bool,
    /// Instances with the same prefix share the vehicles' state.
    pub prefix: String,
    /// Vehicles are spread over this many outbox streams; every instance
    /// must use the same number (checked at start).
    pub partitions: u32,
    /// Another instance's undelivered transitions are taken over after it
    /// has been silent this long.
    pub claim_idle_s: f64,
    /// For each connect and each reply, in milliseconds.
    pub timeout_ms: u64,
}

/// `[state]` as the file spells it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StateSection {
    backend: Option<StateBackend>,
    fsync: Option<FsyncPolicy>,
    path: Option<PathBuf>,
    urls: Option<Vec<String>>,
    cluster: Option<bool>,
    prefix: Option<String>,
    partitions: Option<u32>,
    claim_idle_s: Option<f64>,
    timeout_ms: Option<u64>,
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
        p.urls = s.urls.clone().unwrap_or_default();
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
        let r = &mut c.redis;
        r.urls = s.urls.unwrap_or_default();
        r.cluster = s.cluster.unwrap_or(r.cluster);
        r.prefix = s.prefix.unwrap_or_else(|| r.prefix.clone());
        r.partitions = s.partitions.unwrap_or(r.partitions);
        r.claim_idle_s = s.claim_idle_s.unwrap_or(r.claim_idle_s);
        r.timeout_ms = s.timeout_ms.unwrap_or(r.timeout_ms);
        c.written = written;
        c
    }
}

impl StateConfig {
    /// Checks the chosen backend's keys; `events` and `dead_letter` are
    /// the other files the run writes, which the state must not share.
    pub fn check(&self, events: Option<&Path>, dead_letter: &Path, problems: &mut Problems) {
        // The memory backend keeps nothing, so another backend's keys left
        // in the file (switched to memory for a throwaway run) are harmless.
        let (reads, other): (&[&str], &str) = match self.backend {
            StateBackend::Memory => (&[], ""),
            StateBackend::Embedded => (EmbeddedConfig::KEYS, "another backend"),
            StateBackend::Redis => (RedisConfig::KEYS, "the embedded backend's file"),
            StateBackend::Partitioned => (PartitionedConfig::KEYS, "another backend"),
        };
        let foreign = self.written.iter().filter(|k| !reads.contains(k));
        for key in foreign.take_while(|_| self.backend != StateBackend::Memory) {
            problems.add(
                format!("state.{key}"),
                format!(
                    "not read by backend = \"{}\" (it is a setting for {other}); remove it or choose the backend it belongs to",
                    self.backend.as_str()
                ),
            );
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
