//! Why a payload was refused, as a bounded reason code (the metric label and
//! dead-letter `reason`) plus a precise human detail.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    MalformedJson,
    MissingField,
    WrongType,
    OutOfRange,
    NonFinite,
    Oversize,
    UnknownFormat,
    Duplicate,
    /// The fix is dated further ahead of its receive time than
    /// `codec.max_clock_ahead_s`.
    ClockAhead,
    /// The vehicle id is outside the form ids take
    /// ([`crate::model::check_vehicle_id`]).
    BadVehicleId,
    /// An OwnTracks message that is not a location: ignored, not refused.
    NotALocation,
    /// An empty payload, clearing a retained message: ignored.
    RetainedClear,
}

impl Reason {
    pub const ALL: [Reason; 12] = [
        Reason::MalformedJson,
        Reason::MissingField,
        Reason::WrongType,
        Reason::OutOfRange,
        Reason::NonFinite,
        Reason::Oversize,
        Reason::UnknownFormat,
        Reason::Duplicate,
        Reason::ClockAhead,
        Reason::BadVehicleId,
        Reason::NotALocation,
        Reason::RetainedClear,
    ];

    /// Routine traffic that is not a fix: counted as ignored and acked,
    /// not dead-lettered (an OwnTracks `lwt` arrives at every unclean
    /// disconnect; a retained clear whenever a device is removed).
    pub const fn is_ignored(self) -> bool {
        matches!(self, Reason::NotALocation | Reason::RetainedClear)
    }

    /// Its position in [`Self::ALL`], for arrays of per-reason counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Reason::MalformedJson => "malformed_json",
            Reason::MissingField => "missing_field",
            Reason::WrongType => "wrong_type",
            Reason::OutOfRange => "out_of_range",
            Reason::NonFinite => "non_finite",
            Reason::Oversize => "oversize",
            Reason::UnknownFormat => "unknown_format",
            Reason::Duplicate => "duplicate",
            Reason::ClockAhead => "clock_ahead",
            Reason::BadVehicleId => "bad_vehicle_id",
            Reason::NotALocation => "not_a_location",
            Reason::RetainedClear => "retained_clear",
        }
    }
}

/// [`Reason::index`] is the declaration order: `ALL` must list every
/// reason in that order, checked here when the crate compiles.
const _: () = {
    let mut i = 0;
    while i < Reason::ALL.len() {
        assert!(Reason::ALL[i].index() == i);
        i += 1;
    }
    // The last declared reason closes `ALL`, so none is missing from it.
    assert!(Reason::RetainedClear.index() + 1 == Reason::ALL.len());
};

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{reason}: {detail}")]
pub struct DecodeError {
    pub reason: Reason,
    pub detail: String,
}

impl DecodeError {
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Self {
            reason,
            detail: detail.into(),
        }
    }
}
