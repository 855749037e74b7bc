//! The redis backend's keys of `[state]`: their defaults and checks.

use crate::problems::Problems;
use crate::redis_link::check_redis_urls;
use crate::state::config::RedisConfig;
use std::path::Path;

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            urls: Vec::new(),
            cluster: false,
            prefix: "geogate".into(),
            partitions: 16,
            claim_idle_s: 30.0,
            timeout_ms: 1000,
        }
    }
}

impl RedisConfig {
    /// The `[state]` keys this backend reads, besides `backend` and `fsync`.
    pub const KEYS: &[&str] = &[
        "urls",
        "cluster",
        "prefix",
        "partitions",
        "claim_idle_s",
        "timeout_ms",
    ];

    pub fn check(&self, events: Option<&Path>, problems: &mut Problems) {
        check_redis_urls("state", &self.urls, self.cluster, problems);
        if self.prefix.is_empty() || self.prefix.contains(['{', '}']) {
            problems.add(
                "state.prefix",
                "must be non-empty, without { or } (they mark Redis hash tags)",
            );
        }
        if self.partitions == 0 {
            problems.add("state.partitions", "must be ≥ 1");
        }
        if !(self.claim_idle_s.is_finite() && self.claim_idle_s > 0.0) {
            problems.add("state.claim_idle_s", "must be a number > 0 (seconds)");
        }
        if self.timeout_ms == 0 {
            problems.add("state.timeout_ms", "must be ≥ 1");
        }
        if events.is_none() {
            problems.add(
                "events.path",
                "the redis backend delivers transitions to this instance's events file; name one",
            );
        }
    }
}
