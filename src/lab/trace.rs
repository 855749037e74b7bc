//! `geogate lab trace`: one gate over a user's trace (CSV `t_ms[,cost]`),
//! every decision printed, then the worst-window audit against b + r·t.

use super::worst_window_excess;
use crate::admission::{Decision, Gate, GateKind, GateSpec};
use crate::clock::{NANOS_PER_MILLI, Nanos};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceDecision {
    pub t_ms: f64,
    pub cost: u32,
    pub admitted: bool,
    pub level_after: f64,
    pub release_ms: Option<f64>,
    pub retry_after_ms: Option<f64>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceReport {
    pub gate: String,
    pub decisions: Vec<TraceDecision>,
    pub admitted: usize,
    pub rejected: usize,
    /// Worst (admitted cost − (b + r·t)) over every window between admitted
    /// events (release times for a shaper): ≤ 0 means the bound held.
    pub worst_window_excess: f64,
    pub bound_holds: bool,
}

/// Parses `t_ms[,cost]` lines; a first line that is not a number is a header.
pub fn parse_trace(text: &str) -> Result<Vec<(Nanos, u32)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut cols = line.split(',').map(str::trim);
        let t = cols.next().unwrap_or("");
        let t_ms: f64 = match t.parse() {
            Ok(v) => v,
            Err(_) if i == 0 => continue,
            Err(_) => return Err(format!("line {}: t_ms {t:?} is not a number", i + 1)),
        };
        if !(t_ms.is_finite() && t_ms >= 0.0) {
            return Err(format!("line {}: t_ms must be ≥ 0", i + 1));
        }
        let cost = match cols.next() {
            None | Some("") => 1,
            Some(c) => c
                .parse()
                .map_err(|_| format!("line {}: cost {c:?} is not a whole number", i + 1))?,
        };
        let t = (t_ms * NANOS_PER_MILLI as f64).round() as Nanos;
        if out.last().is_some_and(|&(prev, _)| t < prev) {
            return Err(format!("line {}: times must not decrease", i + 1));
        }
        out.push((t, cost));
    }
    Ok(out)
}

pub fn run_trace(spec: &GateSpec, trace: &[(Nanos, u32)]) -> Result<TraceReport, String> {
    let mut gate = spec.build().map_err(|e| e.to_string())?;
    let ms = |ns: Nanos| ns as f64 / NANOS_PER_MILLI as f64;
    let mut decisions = Vec::with_capacity(trace.len());
    let mut admitted = Vec::new();
    for &(t, cost) in trace {
        let decision = gate.try_admit(t, cost);
        let level_after = (gate.level(t) * 1000.0).round() / 1000.0;
        decisions.push(match decision {
            Decision::Admit { release_at } => {
                admitted.push((
                    if spec.kind == GateKind::LeakyShaper {
                        release_at
                    } else {
                        t
                    },
                    cost,
                ));
                TraceDecision {
                    t_ms: ms(t),
                    cost,
                    admitted: true,
                    level_after,
                    release_ms: Some(ms(release_at)),
                    retry_after_ms: None,
                    reason: None,
                }
            }
            Decision::Reject {
                retry_after,
                reason,
            } => TraceDecision {
                t_ms: ms(t),
                cost,
                admitted: false,
                level_after,
                release_ms: None,
                retry_after_ms: retry_after.map(ms),
                reason: Some(format!("{reason:?}")),
            },
        });
    }
    let excess = worst_window_excess(&admitted, f64::from(spec.burst), spec.rate);
    Ok(TraceReport {
        gate: spec.label(),
        admitted: admitted.len(),
        rejected: trace.len() - admitted.len(),
        worst_window_excess: if admitted.is_empty() {
            0.0
        } else {
            (excess * 1e6).round() / 1e6
        },
        bound_holds: admitted.is_empty() || excess <= 1e-9,
        decisions,
    })
}
