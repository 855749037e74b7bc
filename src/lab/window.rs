//! `geogate lab window`: a token bucket and a fixed-window counter with the
//! same nominal limit (r per second), over a trace that bunches at 0.9 s
//! and again at 1.0 s, straddling the window boundary on purpose.

use super::worst_window_count;
use crate::admission::{FixedWindow, Gate, Rate, TokenBucket};
use crate::clock::{NANOS_PER_MILLI, NANOS_PER_SEC, Nanos};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LimiterResult {
    pub limiter: String,
    pub offered: usize,
    pub admitted: usize,
    /// Most admissions in any 1 s window, `[t, t + 1 s)`.
    pub worst_second: usize,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WindowLab {
    pub rate: f64,
    pub burst: u32,
    /// `b + r·1 s`: what the bucket promises for any second.
    pub bound_per_second: f64,
    pub trace_ms: Vec<u64>,
    pub token_bucket: LimiterResult,
    pub fixed_window: LimiterResult,
}

/// One early arrival, a bunch just before the 1 s boundary and one on it,
/// then a steady tail.
pub fn straddling_trace(rate: f64) -> Vec<u64> {
    let bunch = (rate.ceil() as u64 + 1).max(2);
    let mut t = vec![100];
    t.extend(std::iter::repeat_n(900, bunch as usize));
    t.extend(std::iter::repeat_n(1000, bunch as usize));
    t.extend([1300, 1600, 1900, 2200, 2500]);
    t
}

fn run(gate: &mut impl Gate, name: &str, trace: &[Nanos]) -> LimiterResult {
    let admitted: Vec<Nanos> = trace
        .iter()
        .copied()
        .filter(|&t| gate.try_admit(t, 1).is_admit())
        .collect();
    LimiterResult {
        limiter: name.into(),
        offered: trace.len(),
        admitted: admitted.len(),
        worst_second: worst_window_count(&admitted, NANOS_PER_SEC),
    }
}

pub fn window_lab(rate: f64, burst: u32) -> Result<WindowLab, String> {
    let r = Rate::per_second(rate).map_err(|e| e.to_string())?;
    let mut bucket = TokenBucket::new(r, burst).map_err(|e| e.to_string())?;
    let limit = rate.round().max(1.0) as u32;
    let mut window = FixedWindow::new(limit, NANOS_PER_SEC).map_err(|e| e.to_string())?;
    let trace_ms = straddling_trace(rate);
    let trace: Vec<Nanos> = trace_ms.iter().map(|ms| ms * NANOS_PER_MILLI).collect();
    Ok(WindowLab {
        rate,
        burst,
        bound_per_second: f64::from(burst) + rate,
        token_bucket: run(&mut bucket, "token-bucket", &trace),
        fixed_window: run(&mut window, &format!("fixed-window ({limit}/s)"), &trace),
        trace_ms,
    })
}
