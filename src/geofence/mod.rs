//! Geofences: GeoJSON loading ([`fences`]), exact geometry ([`ring`],
//! [`shape`]), the R-tree ([`index`]) and per-vehicle enter/exit state
//! ([`evaluator`]).
//!
//! Containment counts the boundary as inside, for polygons, holes and
//! circles alike: a vehicle parked on the gate line is at the depot.

mod banded;
mod cell_grid;
pub mod config;
pub mod evaluator;
pub mod fences;
mod fingerprint;
pub mod generate;
mod grid;
pub mod index;
mod packed_cells;
mod position;
mod prefetch;
pub mod registry;
pub mod ring;
pub mod shape;
mod vehicle_slots;

pub use evaluator::{
    Cause, Evaluator, EvaluatorSettings, EvaluatorStats, FenceIn, Fix, FixOutcome, HeldChange,
    HeldFix, LastFix, PendingDwell, Transition, TransitionKind, VehicleSnapshot, VehicleView,
};
pub use fences::{
    COORDINATE_NOISE_DEG, Fence, FenceDefect, FenceErrors, FenceSource, FenceSummary, LoadedFences,
    load_fences, load_fences_with_warnings, parse_features, parse_fences,
    parse_fences_with_warnings, read_fence_file, summarize,
};
pub use fingerprint::fingerprint;
pub use index::{Coverings, FenceChange, FenceIdx, FenceIndex, Tombstone};
