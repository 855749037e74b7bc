//! `[gate.global]`: the Redis token bucket all instances share.

use crate::problems::Problems;
use crate::redis_link::check_redis_urls;
use serde::{Deserialize, Serialize};

/// The Redis token bucket behind `[gate.global]` (see `allowance`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalAllowanceConfig {
    /// `redis://host:port`: one for a single node, the seed nodes for a
    /// Cluster (then `cluster = true`).
    pub urls: Vec<String>,
    #[serde(default)]
    pub cluster: bool,
    /// The accounting key: instances with the same key share one budget.
    #[serde(default = "default_key")]
    pub key: String,
    /// Tokens per second for all instances together.
    pub rate: f64,
    /// The shared bucket's capacity b (it starts full).
    pub burst: u32,
    /// Tokens one low-priority event costs.
    #[serde(default = "default_cost")]
    pub cost: u32,
    /// Most tokens one instance holds locally, taken from Redis in chunks;
    /// loosens the shared bound by at most this much per instance.
    #[serde(default = "default_reserve")]
    pub reserve: u32,
    /// Once Redis is unreachable and the reserve is spent: `open` admits
    /// (counted), `closed` sheds. Required: the choice must be explicit.
    pub fail_mode: super::FailMode,
    /// For each connect and each reply, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The CA that signed the server's certificate, for `rediss://` URLs
    /// (the system's roots otherwise).
    #[serde(default)]
    pub ca: Option<std::path::PathBuf>,
    /// An ACL user, and a file holding its password.
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
}

fn default_key() -> String {
    "geogate:allowance".into()
}

fn default_cost() -> u32 {
    1
}

fn default_reserve() -> u32 {
    32
}

fn default_timeout_ms() -> u64 {
    250
}

impl GlobalAllowanceConfig {
    /// Reports each problem under `gate.global.<field>`.
    pub fn check(&self, problems: &mut Problems) {
        check_redis_urls("gate.global", &self.urls, self.cluster, problems);
        if self.key.is_empty() {
            problems.add("gate.global.key", "must not be empty");
        }
        if !(self.rate.is_finite() && self.rate > 0.0) {
            problems.add(
                "gate.global.rate",
                format!("must be a number > 0 (tokens/s), got {}", self.rate),
            );
        }
        if self.burst == 0 {
            problems.add("gate.global.burst", "must be ≥ 1");
        }
        if self.cost == 0 || self.cost > self.burst {
            problems.add(
                "gate.global.cost",
                format!(
                    "must be between 1 and burst ({}), got {}",
                    self.burst, self.cost
                ),
            );
        }
        if self.reserve < self.cost || self.reserve > self.burst {
            problems.add(
                "gate.global.reserve",
                format!(
                    "must be between cost ({}) and burst ({}), got {}",
                    self.cost, self.burst, self.reserve
                ),
            );
        }
        if self.timeout_ms == 0 {
            problems.add("gate.global.timeout_ms", "must be ≥ 1");
        }
        if self.ca.is_some() && !self.urls.iter().all(|u| u.starts_with("rediss://")) {
            problems.add(
                "gate.global.ca",
                "a CA is for TLS: use rediss:// URLs with it",
            );
        }
        if self.password_file.is_some() && self.user.is_none() {
            problems.add(
                "gate.global.user",
                "password_file needs the ACL user it belongs to (\"default\" for requirepass)",
            );
        }
    }
}
