//! geogate: live GPS telemetry in over MQTT, shift-change bursts shed by a
//! rate gate, every admitted fix evaluated against geofences.
//!
//! Layout, following the data flow in `ARCHITECTURE.md`:
//!
//! * [`clock`]: integer-nanosecond time, monotonic or manual;
//! * [`model`]: telemetry, ids and priority;
//! * [`admission`]: the gates (token bucket, leaky meter and shaper, fixed
//!   window) and the watermark policy in front of each shard queue;
//! * [`geofence`]: GeoJSON fences, the R-tree index and exact containment,
//!   and the per-vehicle enter/exit evaluator.

pub mod accounting;
pub mod admission;
pub mod backoff;
pub mod broker;
pub mod capture;
pub mod clock;
pub mod codec;
pub mod config;
pub mod demo;
pub mod eval;
pub mod geofence;
pub mod lab;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod replay;
pub mod report;
pub mod shard;
pub mod sim;
pub mod sink;
pub mod source;
pub mod synth;
