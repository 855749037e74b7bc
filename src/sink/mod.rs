//! Where events leave geogate: the dead-letter file for everything refused.

pub mod dead_letter;
