//! Where telemetry comes from.

pub mod mqtt;
