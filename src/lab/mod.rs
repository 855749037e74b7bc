//! Labs: small deterministic models that show what the gates do.
//!
//! * [`shaping`]: token bucket vs leaky shaper in front of one server;
//! * [`window`]: token bucket vs fixed window across a window boundary;
//! * [`trace`]: one gate over a user's trace, with a worst-window audit.

pub mod shaping;
pub mod shaping_report;
pub mod trace;
pub mod window;

use crate::clock::Nanos;

/// The largest admitted cost in any window `[t_i, t_j]` between admitted
/// events, minus the bound `b + r·(t_j − t_i)`: ≤ 0 means the bound held on
/// every window. Checks all O(n²) windows, not a sample.
pub fn worst_window_excess(admitted: &[(Nanos, u32)], burst: f64, rate: f64) -> f64 {
    let mut worst = f64::NEG_INFINITY;
    for i in 0..admitted.len() {
        let mut cost = 0.0;
        for &(t, c) in &admitted[i..] {
            cost += f64::from(c);
            let bound = burst + rate * (t - admitted[i].0) as f64 / 1e9;
            worst = worst.max(cost - bound);
        }
    }
    worst
}

/// The most admissions in any half-open window `[t_i, t_i + len)`.
pub fn worst_window_count(times: &[Nanos], len: Nanos) -> usize {
    let mut worst = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while j < times.len() && times[j] < times[i] + len {
            j += 1;
        }
        worst = worst.max(j - i);
    }
    worst
}
