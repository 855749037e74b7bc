//! `[state] backend = "partitioned"`: the engine's address and
//! credentials, the partition count, and how ownership is kept.

use crate::problems::Problems;
use std::path::PathBuf;

/// The partitioned backend's keys (see `super`).
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionedConfig {
    /// NATS servers (`nats://` or `tls://host:port`).
    pub urls: Vec<String>,
    /// Partitions of the fleet: the server's mapping must name the same
    /// count, and it never changes for a fleet (decision 0025).
    pub partitions: u32,
    /// How long a lease holds without renewal: an instance that stops
    /// renewing (dead, or paused) loses its partitions a term later.
    pub lease_term_s: f64,
    /// Commits between snapshots of a partition's state.
    pub snapshot_every: u64,
    /// Keep the partitions' input after a snapshot covers it (for audit or
    /// a replay; bounded then only by limits set on the streams in the
    /// engine). By default a snapshot removes the input it covers.
    pub keep_input: bool,
    /// How long the events stream keeps a commit's transitions (0: for
    /// ever): consumers must read them within it.
    pub events_max_age_s: u64,
    /// Engine credentials: a user and a file holding the password.
    pub user: Option<String>,
    pub password_file: Option<PathBuf>,
    /// The CA that signed the server's certificate (TLS is then required).
    pub ca: Option<PathBuf>,
    /// A client certificate and key, for a server that asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// For connecting and for each request, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for PartitionedConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            partitions: 16,
            lease_term_s: 6.0,
            snapshot_every: 2000,
            keep_input: false,
            events_max_age_s: 7 * 24 * 3600,
            user: None,
            password_file: None,
            ca: None,
            cert: None,
            key: None,
            timeout_ms: 2000,
        }
    }
}

impl PartitionedConfig {
    pub const KEYS: &[&str] = &[
        "urls",
        "partitions",
        "lease_term_s",
        "snapshot_every",
        "keep_input",
        "events_max_age_s",
        "user",
        "password_file",
        "ca",
        "cert",
        "key",
        "timeout_ms",
    ];

    pub fn check(&self, events: Option<&std::path::Path>, problems: &mut Problems) {
        if self.urls.is_empty() {
            problems.add("state.urls", "name at least one nats://host:port");
        }
        for url in &self.urls {
            let scheme_ok = ["nats://", "tls://"].iter().any(|s| url.starts_with(s));
            if !scheme_ok || url.parse::<async_nats::ServerAddr>().is_err() {
                problems.add(
                    "state.urls",
                    format!("{url:?} is not a nats://host:port or tls://host:port URL"),
                );
            }
        }
        if self.partitions == 0 || self.partitions > 4096 {
            problems.add("state.partitions", "must be 1 to 4096");
        }
        if !(self.lease_term_s.is_finite() && self.lease_term_s >= 1.0) {
            problems.add("state.lease_term_s", "must be a number ≥ 1 (seconds)");
        }
        if self.snapshot_every == 0 {
            problems.add("state.snapshot_every", "must be ≥ 1");
        }
        if self.user.is_some() != self.password_file.is_some() {
            problems.add(
                "state.user",
                "user and password_file go together: set both, or neither",
            );
        }
        if self.cert.is_some() != self.key.is_some() {
            problems.add(
                "state.cert",
                "cert and key go together: set both, or neither",
            );
        }
        if self.timeout_ms == 0 {
            problems.add("state.timeout_ms", "must be ≥ 1");
        }
        if events.is_some() {
            problems.add(
                "events.path",
                "with backend = \"partitioned\" transitions go to the engine's GEOGATE_EVENTS stream, one subject per partition (README, \"Running several instances\"); remove events.path",
            );
        }
    }
}
