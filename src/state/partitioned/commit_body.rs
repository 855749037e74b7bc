//! A partition commit as bytes. Binary, like a vehicle record
//! ([`crate::state::local::record`]), because every batch of a partition
//! writes one and a snapshot writes a record per vehicle.
//!
//! Layout (version 1): `1`, kind byte, varint `base`, varint
//! `input_through`, varint `next_seq`, the [`Totals`] as varints, varint
//! vehicle count, each as varint length + id, `0` (gone) or `1` + varint
//! length + record, varint length + packed held-fix changes
//! ([`crate::state::local::held_batch`]), varint length + the transitions'
//! NDJSON lines, varint length + owner name.

use crate::model::VehicleId;
use crate::state::local::record::{Reader, RecordError, put_str, put_varint};

const VERSION: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A new owner's first commit: it changes no state, and fences the
    /// owner before it.
    Takeover,
    /// One or more batches of input.
    Batch,
    /// The first part of a snapshot: the partition's state is exactly what
    /// the snapshot's parts hold.
    SnapshotFirst,
    /// A further part of a snapshot.
    SnapshotPart,
}

impl Kind {
    fn byte(self) -> u8 {
        match self {
            Self::Takeover => 1,
            Self::Batch => 2,
            Self::SnapshotFirst => 3,
            Self::SnapshotPart => 4,
        }
    }

    fn of(byte: u8) -> Option<Self> {
        Some(match byte {
            1 => Self::Takeover,
            2 => Self::Batch,
            3 => Self::SnapshotFirst,
            4 => Self::SnapshotPart,
            _ => return None,
        })
    }
}

/// What the partition's input came to since its first commit, counted
/// in the commits themselves: a fix applied again by a new owner after a
/// crash is counted once, as it was applied once.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Totals {
    /// Messages read from the partition's input.
    pub read: u64,
    /// Refused before the state (could not be decoded, a wrong clock).
    pub refused: u64,
    /// Not fixes, ignored (an OwnTracks status).
    pub ignored: u64,
    /// Applied on arrival, or taken into a reorder window.
    pub evaluated: u64,
    pub held: u64,
    pub late: u64,
    pub duplicates: u64,
    pub enters: u64,
    pub exits: u64,
    pub expired: u64,
}

/// How many counts a commit carries.
const FIELDS: usize = 10;

impl Totals {
    fn fields(&self) -> [u64; FIELDS] {
        [
            self.read,
            self.refused,
            self.ignored,
            self.evaluated,
            self.held,
            self.late,
            self.duplicates,
            self.enters,
            self.exits,
            self.expired,
        ]
    }

    fn from_fields(f: [u64; FIELDS]) -> Self {
        Self {
            read: f[0],
            refused: f[1],
            ignored: f[2],
            evaluated: f[3],
            held: f[4],
            late: f[5],
            duplicates: f[6],
            enters: f[7],
            exits: f[8],
            expired: f[9],
        }
    }
}

/// One commit of a partition's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitBody {
    pub kind: Kind,
    /// Where the partition's state starts in the log: the first part of
    /// the latest snapshot written before this commit (0: the log's
    /// start). A new owner reads the log from here.
    pub base: u64,
    /// The input position the state has taken in, up to and including.
    pub input_through: u64,
    /// The seq the partition's next transition gets.
    pub next_seq: u64,
    pub totals: Totals,
    /// Each vehicle's new record (`None`: forgotten).
    pub vehicles: Vec<(VehicleId, Option<Vec<u8>>)>,
    /// Fixes that entered or left a reorder window, packed.
    pub held: Vec<u8>,
    /// The commit's transitions, one NDJSON line each.
    pub lines: Vec<u8>,
    /// The instance that wrote it.
    pub owner: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("commit version {0} (this geogate reads version {VERSION})")]
    Version(u8),
    #[error("unknown commit kind {0}")]
    Kind(u8),
    #[error("{0}")]
    Bytes(#[from] RecordError),
    #[error("vehicle id is not UTF-8")]
    NotUtf8,
    #[error("{0} bytes left over after the commit")]
    Trailing(usize),
}

impl CommitBody {
    pub fn encode(&self) -> Vec<u8> {
        let records: usize = self
            .vehicles
            .iter()
            .map(|(id, r)| id.len() + r.as_ref().map_or(0, Vec::len) + 4)
            .sum();
        let mut out = Vec::with_capacity(
            64 + records + self.held.len() + self.lines.len() + self.owner.len(),
        );
        out.push(VERSION);
        out.push(self.kind.byte());
        for v in [self.base, self.input_through, self.next_seq] {
            put_varint(&mut out, v);
        }
        for v in self.totals.fields() {
            put_varint(&mut out, v);
        }
        put_varint(&mut out, self.vehicles.len() as u64);
        for (id, record) in &self.vehicles {
            put_str(&mut out, id);
            match record {
                None => out.push(0),
                Some(record) => {
                    out.push(1);
                    put_bytes(&mut out, record);
                }
            }
        }
        put_bytes(&mut out, &self.held);
        put_bytes(&mut out, &self.lines);
        put_str(&mut out, &self.owner);
        out
    }

    /// Reads what [`Self::encode`] wrote; damaged bytes are an error, never
    /// a panic.
    pub fn decode(bytes: &[u8]) -> Result<Self, BodyError> {
        let mut r = Reader::new(bytes);
        let version = r.take(1)?[0];
        if version != VERSION {
            return Err(BodyError::Version(version));
        }
        let kind = r.take(1)?[0];
        let kind = Kind::of(kind).ok_or(BodyError::Kind(kind))?;
        let (base, input_through, next_seq) = (r.varint()?, r.varint()?, r.varint()?);
        let mut fields = [0; FIELDS];
        for f in &mut fields {
            *f = r.varint()?;
        }
        let count = r.count()?;
        let mut vehicles = Vec::with_capacity(count);
        for _ in 0..count {
            let id = VehicleId::from(text(&mut r)?);
            let record = match r.take(1)?[0] {
                0 => None,
                _ => Some(bytes_of(&mut r)?.to_vec()),
            };
            vehicles.push((id, record));
        }
        let held = bytes_of(&mut r)?.to_vec();
        let lines = bytes_of(&mut r)?.to_vec();
        let owner = text(&mut r)?.to_owned();
        if r.at() != bytes.len() {
            return Err(BodyError::Trailing(bytes.len() - r.at()));
        }
        Ok(Self {
            kind,
            base,
            input_through,
            next_seq,
            totals: Totals::from_fields(fields),
            vehicles,
            held,
            lines,
            owner,
        })
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn bytes_of<'a>(r: &mut Reader<'a>) -> Result<&'a [u8], BodyError> {
    let len = r.count()?;
    Ok(r.take(len)?)
}

fn text<'a>(r: &mut Reader<'a>) -> Result<&'a str, BodyError> {
    std::str::from_utf8(bytes_of(r)?).map_err(|_| BodyError::NotUtf8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body() -> impl Strategy<Value = CommitBody> {
        (
            0u8..4,
            (any::<u64>(), any::<u64>(), any::<u64>()),
            proptest::array::uniform10(any::<u64>()),
            proptest::collection::vec(
                (
                    "\\PC{0,20}",
                    proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
                ),
                0..5,
            ),
            proptest::collection::vec(any::<u8>(), 0..60),
            "\\PC{0,80}",
            "\\PC{0,12}",
        )
            .prop_map(
                |(kind, (base, input_through, next_seq), totals, vehicles, held, lines, owner)| {
                    CommitBody {
                        kind: Kind::of(kind + 1).unwrap_or(Kind::Batch),
                        base,
                        input_through,
                        next_seq,
                        totals: Totals::from_fields(totals),
                        vehicles: vehicles
                            .into_iter()
                            .map(|(id, r)| (VehicleId::from(id), r))
                            .collect(),
                        held,
                        lines: lines.into_bytes(),
                        owner,
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn round_trips(b in body()) {
            prop_assert_eq!(CommitBody::decode(&b.encode()), Ok(b));
        }

        #[test]
        fn every_cut_is_an_error_not_a_panic(b in body()) {
            let bytes = b.encode();
            for cut in 0..bytes.len() {
                prop_assert!(CommitBody::decode(&bytes[..cut]).is_err());
            }
        }
    }

    #[test]
    fn another_version_is_named() {
        assert_eq!(CommitBody::decode(&[9, 2]), Err(BodyError::Version(9)));
        assert_eq!(CommitBody::decode(&[1, 7]), Err(BodyError::Kind(7)));
    }
}
