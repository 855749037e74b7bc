//! `[fences]`: the fence file and the membership rules' settings.

use super::EvaluatorSettings;
use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Where the fence set comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FencesSource {
    /// The fence file; SIGHUP reads it again, and the API only reads.
    #[default]
    File,
    /// The state store; the file (if any) seeds an empty store once, and
    /// the API changes the set.
    Store,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FencesConfig {
    /// The fence file: the set with `source = "file"`, the seed of an
    /// empty store with `"store"`.
    #[serde(default)]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub source: FencesSource,
    #[serde(default)]
    pub hysteresis_m: f64,
    #[serde(default)]
    pub dwell_s: f64,
    #[serde(default = "default_max_memberships")]
    pub max_memberships: usize,
    #[serde(default = "default_idle_expiry_s")]
    pub idle_expiry_s: f64,
}

fn default_max_memberships() -> usize {
    256
}

fn default_idle_expiry_s() -> f64 {
    86_400.0
}

impl FencesConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.source == FencesSource::File && self.path.is_none() {
            problems.add(
                "fences.path",
                "is required with source = \"file\" (or set source = \"store\" and add fences through the API)",
            );
        }
        for (field, v) in [
            ("fences.hysteresis_m", self.hysteresis_m),
            ("fences.dwell_s", self.dwell_s),
            ("fences.idle_expiry_s", self.idle_expiry_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                problems.add(field, format!("must be a finite number ≥ 0, got {v}"));
            }
        }
    }

    /// The evaluator's settings these fences are evaluated with.
    pub fn settings(&self) -> EvaluatorSettings {
        EvaluatorSettings {
            hysteresis_m: self.hysteresis_m,
            dwell_s: self.dwell_s,
            max_memberships: self.max_memberships,
            idle_expiry_ms: (self.idle_expiry_s * 1000.0) as i64,
            reorder_window_ms: 0,
        }
    }
}
