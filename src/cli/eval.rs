//! Offline evaluation: fences × a file of positions → transitions.
//!
//! Positions are native telemetry, one JSON object per line. Bad lines are
//! reported with their line number and skipped; they never abort the run.
//! Output is deterministic: transitions in input order, counts sorted by id.

use crate::codec::{self, CodecSettings, DecodeError};
use crate::geofence::{Evaluator, EvaluatorSettings, EvaluatorStats, FenceIndex, TransitionKind};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::sync::Arc;

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FenceCounts {
    pub enter: u64,
    pub exit: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SkippedLine {
    pub line: usize,
    pub reason: codec::Reason,
    pub detail: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EvalReport {
    pub lines: usize,
    pub evaluated: u64,
    /// Fixes older than their vehicle's last applied fix: no transition.
    pub late: u64,
    /// Repeats of a fix (same vehicle, time and position) already applied.
    pub duplicates: u64,
    pub transitions: u64,
    pub skipped: usize,
    pub skipped_lines: Vec<SkippedLine>,
    pub per_fence: BTreeMap<String, FenceCounts>,
    pub evaluator: EvaluatorStats,
}

/// Evaluates every line of `input`, writing each transition as one NDJSON
/// line to `out`.
pub fn evaluate_positions(
    index: Arc<FenceIndex>,
    settings: EvaluatorSettings,
    input: impl BufRead,
    mut out: impl Write,
) -> io::Result<EvalReport> {
    let codec = CodecSettings {
        dedup_window: 0,
        ..CodecSettings::default()
    };
    let mut evaluator = Evaluator::new(index, settings);
    let mut report = EvalReport::default();
    let mut transitions = Vec::new();
    for (n, line) in input.split(b'\n').enumerate() {
        let line = line?;
        report.lines += 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            report.lines -= 1;
            continue;
        }
        let fix = match codec::decode("", &line, &codec) {
            Ok(fix) => fix,
            Err(DecodeError { reason, detail }) => {
                report.skipped_lines.push(SkippedLine {
                    line: n + 1,
                    reason,
                    detail,
                });
                continue;
            }
        };
        transitions.clear();
        evaluator.evaluate(
            &fix.vehicle,
            fix.fix_time_ms,
            fix.lat,
            fix.lon,
            &mut transitions,
        );
        for t in &transitions {
            serde_json::to_writer(&mut out, t)?;
            out.write_all(b"\n")?;
            let counts = report.per_fence.entry(t.fence.to_string()).or_default();
            match t.event {
                TransitionKind::Enter => counts.enter += 1,
                TransitionKind::Exit => counts.exit += 1,
            }
        }
        report.transitions += transitions.len() as u64;
    }
    out.flush()?;
    report.skipped = report.skipped_lines.len();
    report.evaluator = evaluator.stats();
    report.evaluated = report.evaluator.evaluated;
    report.late = report.evaluator.late;
    report.duplicates = report.evaluator.duplicates;
    Ok(report)
}
