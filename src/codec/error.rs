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
}

impl Reason {
    pub const ALL: [Reason; 8] = [
        Reason::MalformedJson,
        Reason::MissingField,
        Reason::WrongType,
        Reason::OutOfRange,
        Reason::NonFinite,
        Reason::Oversize,
        Reason::UnknownFormat,
        Reason::Duplicate,
    ];

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
        }
    }
}

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
