//! `[gate]`: each shard's gate, and optionally the allowance all
//! instances share (checked by [`crate::allowance`]).

use super::{GateKind, GateSpec, GateSpecError};
use crate::allowance::GlobalAllowanceConfig;
use crate::problems::Problems;
use serde::{Deserialize, Serialize};

/// Each shard's gate, and optionally the allowance all instances share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateConfig {
    pub kind: GateKind,
    pub rate: f64,
    pub burst: u32,
    /// `[gate.global]`: one budget in Redis for every instance together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<GlobalAllowanceConfig>,
}

impl GateConfig {
    /// The shard gate alone.
    pub fn spec(&self) -> GateSpec {
        GateSpec {
            kind: self.kind,
            rate: self.rate,
            burst: self.burst,
        }
    }
}

impl From<GateSpec> for GateConfig {
    fn from(spec: GateSpec) -> Self {
        Self {
            kind: spec.kind,
            rate: spec.rate,
            burst: spec.burst,
            global: None,
        }
    }
}

impl GateConfig {
    pub fn check(&self, problems: &mut Problems) {
        if self.kind == GateKind::FixedWindow {
            problems.add(
                "gate.kind",
                "fixed_window is lab-only; use token, leaky_meter or leaky_shaper",
            );
        }
        if let Err(e) = self.spec().build() {
            let field = match e {
                GateSpecError::Rate(_) => "gate.rate",
                GateSpecError::Burst(_) => "gate.burst",
                GateSpecError::Syntax(_) => "gate",
            };
            problems.add(field, e.to_string());
        }
        if let Some(global) = &self.global {
            global.check(problems);
        }
    }
}
