//! Where events leave geogate: transitions to their consumers, refusals to
//! the dead letter.

pub mod dead_letter;
pub mod events;
