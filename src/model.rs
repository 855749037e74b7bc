//! The nouns every module shares.

use serde::Serialize;
use std::sync::Arc;

/// A vehicle's id as it appears on the wire. Inline up to 23 bytes (longer
/// ids are shared), because every fix decodes one, and an id allocated on
/// the decode lane and freed on another thread slowed the whole pipeline
/// (docs/decisions/0009-inline-vehicle-ids-borrowed-topic-ids.md).
pub type VehicleId = smol_str::SmolStr;

/// A fence's stable id from its GeoJSON feature.
pub type FenceId = Arc<str>;

/// Whether an event may be shed above the watermark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// An idle ping: may be shed by the gate under load.
    Low,
    /// Anything else: never shed, waits for room instead.
    High,
}

impl Priority {
    pub fn as_str(&self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::High => "high",
        }
    }
}

/// One decoded position report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Telemetry {
    pub vehicle: VehicleId,
    /// Fix time from the device, unix milliseconds. Data, never a gate clock.
    pub fix_time_ms: i64,
    pub lat: f64,
    pub lon: f64,
    pub speed_kmh: Option<f64>,
    /// From `kind` (native) or the trigger `t` (OwnTracks) and the speed;
    /// the kind itself is checked but not kept: nothing downstream reads
    /// it, and copying it cost an allocation per message.
    pub priority: Priority,
}
