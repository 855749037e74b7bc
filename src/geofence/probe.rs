//! A fix's position as a shared state store needs it: which fences contain
//! it (and whether it is clear of each one's hysteresis band, with each
//! one's dwell), and which fences it is near enough to stay in.
//!
//! Geometry stays with the instance that has the fences in memory; the
//! store applies the membership rules to these facts alone, so the rules
//! need no geometry and give the same answer wherever they run. The facts
//! are exactly the ones [`super::Evaluator`] consults: a member stays when
//! it contains the point or the point is inside its band; a fence is
//! entered only when it contains the point and the point is clear of its
//! band.

use super::evaluator::EvaluatorSettings;
use super::index::{FenceIdx, FenceIndex};
use crate::model::FenceId;
use geo::Coord;
use serde::Serialize;

/// One fence containing the point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Containing {
    pub id: FenceId,
    /// Clear of the fence's hysteresis band: it may be entered.
    pub clear: bool,
    pub dwell_ms: i64,
}

/// The facts about one position, in fence-index order.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FenceProbe {
    pub containing: Vec<Containing>,
    /// Fences not containing the point whose band it is inside: a member
    /// of these stays a member.
    pub near: Vec<FenceId>,
}

/// Reusable buffers for [`probe`].
#[derive(Debug, Default)]
pub struct ProbeScratch {
    covering: Vec<FenceIdx>,
    near: Vec<FenceIdx>,
}

/// The largest hysteresis any fence has under `settings`.
pub fn widest_band(index: &FenceIndex, settings: &EvaluatorSettings) -> f64 {
    index
        .fences()
        .iter()
        .map(|f| settings.hysteresis_of(f))
        .fold(0.0, f64::max)
}

/// The facts about `p` (lon, lat). `widest` is [`widest_band`], computed
/// once per fence set.
pub fn probe(
    index: &FenceIndex,
    settings: &EvaluatorSettings,
    widest: f64,
    p: Coord<f64>,
    scratch: &mut ProbeScratch,
) -> FenceProbe {
    index.containing(p, &mut scratch.covering);
    let containing = scratch
        .covering
        .iter()
        .map(|&f| {
            let fence = index.fence(f);
            Containing {
                id: fence.id.clone(),
                clear: settings.clear_of_boundary(fence, p),
                dwell_ms: settings.dwell_ms_of(fence),
            }
        })
        .collect();
    scratch.near.clear();
    if widest > 0.0 {
        index.near(p, widest, &mut scratch.near);
        scratch.near.sort_unstable();
        scratch.near.dedup();
    }
    let near = scratch
        .near
        .iter()
        .filter(|f| scratch.covering.binary_search(f).is_err())
        .map(|&f| index.fence(f))
        .filter(|fence| !settings.clear_of_boundary(fence, p))
        .map(|fence| fence.id.clone())
        .collect();
    FenceProbe { containing, near }
}
