//! geogate: live GPS telemetry in over MQTT, shift-change bursts shed by a
//! rate gate, every admitted fix evaluated against geofences.
//!
//! Layout by concern, following the data flow in `ARCHITECTURE.md`:
//!
//! * [`source`]: where messages come from (MQTT intake, ordered acks);
//! * [`codec`]: bytes and topic → telemetry, or a precise reason;
//! * [`admission`]: the gates and the one admission rule;
//! * [`allowance`]: the budget all instances share, in Redis;
//! * [`pipeline`]: wiring, the shard router and workers, the accounting;
//! * [`geofence`]: fences, the index, exact containment, enter/exit state;
//! * [`state`]: per-vehicle state and the outbox, across crashes;
//! * [`scale_out`]: several instances on ordered partitions, one owner
//!   each;
//! * [`sink`]: dead letter and transitions out, and how they fail;
//! * [`replay`]: captures, record, live and virtual replay, synth;
//! * [`lab`], [`report`], [`cli`]: what the commands show;
//! * [`clock`], [`model`], [`config`], [`backoff`], [`broker`],
//!   [`metrics`], [`redis_link`], [`jetstream_link`], [`runtime`]: shared pieces.

pub mod admission;
pub mod allowance;
pub mod api;
pub mod backoff;
pub mod broker;
pub mod cli;
pub mod clock;
pub mod codec;
pub mod config;
pub mod crash_point;
pub mod delivery;
pub mod geofence;
pub mod jetstream_link;
pub mod lab;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod problems;
pub mod redis_link;
pub mod replay;
pub mod report;
pub mod runtime;
pub mod sampling;
pub mod scale_out;
pub mod service;
pub mod shutdown;
pub mod sink;
pub mod source;
pub mod stable_hash;
pub mod state;
