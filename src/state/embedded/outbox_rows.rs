//! A commit's outbox entries as the embedded store keeps them: one row per
//! run of consecutive seqs, which is one row per commit, since the
//! committer numbers a commit's transitions one after another.
//!
//! Why not a row per entry: a commit appends every transition its batches
//! made (dozens to hundreds in the bench's capture), and a later commit deletes
//! them once the events file and the broker have them. As a row each, that
//! insert and delete was about a third of the committer's CPU, and most of
//! what the write-ahead log carried
//! (docs/decisions/0005-outbox-row-per-commit-and-spaced-commits.md).
//!
//! Layout: the run's first and last seq and its commit time are the row's
//! columns; its bytes are each entry in seq order as varint length +
//! vehicle id, then varint length + line. A run longer than [`MAX_ENTRIES_PER_ROW`] (a version 1
//! outbox moved over after a long broker outage) takes several rows.

use crate::delivery::outbox::OutboxEntry;
use crate::model::VehicleId;
use crate::state::local::record::{Reader, put_str, put_varint};

/// Keeps a row far below SQLite's largest value (1 GB) and the memory one
/// row needs small, whatever the outbox holds.
pub const MAX_ENTRIES_PER_ROW: u64 = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboxRowError {
    #[error("vehicle id at byte {0} is not UTF-8")]
    VehicleNotUtf8(usize),
    #[error("the row is cut short after {0} bytes")]
    Cut(usize),
    #[error("the row holds {held} entries where seqs {first}..={last} need {needed}")]
    Count {
        held: u64,
        first: u64,
        last: u64,
        needed: u64,
    },
    #[error("the row starts at seq {first}, not after the previous row's last seq {previous}")]
    Overlap { first: u64, previous: u64 },
    #[error("the row's entries are not bytes")]
    NotBytes,
}

/// One row: entries `first..=last`, committed at `committed_ms`, packed.
#[derive(Debug, PartialEq, Eq)]
pub struct OutboxRow {
    pub first: u64,
    pub last: u64,
    pub committed_ms: i64,
    pub bytes: Vec<u8>,
}

/// The rows for entries in seq order: a new row wherever a seq is not the
/// one after its predecessor's, or its commit time differs.
pub fn pack(entries: &[OutboxEntry]) -> Vec<OutboxRow> {
    let mut rows: Vec<OutboxRow> = Vec::new();
    for e in entries {
        let row = match rows.last_mut() {
            Some(row)
                if row.last.checked_add(1) == Some(e.seq)
                    && row.committed_ms == e.committed_ms
                    && row.last - row.first + 1 < MAX_ENTRIES_PER_ROW =>
            {
                row
            }
            _ => {
                rows.push(OutboxRow {
                    first: e.seq,
                    last: e.seq,
                    committed_ms: e.committed_ms,
                    bytes: Vec::new(),
                });
                rows.last_mut().expect("just pushed")
            }
        };
        row.last = e.seq;
        put_str(&mut row.bytes, &e.vehicle);
        put_varint(&mut row.bytes, e.line.len() as u64);
        row.bytes.extend_from_slice(&e.line);
    }
    rows
}

/// The entries of the row holding seqs `first..=last`, committed at
/// `committed_ms`, appended to `into`.
/// A row that ends early, holds more or fewer entries than its seqs need,
/// or is not UTF-8 where an id is expected is an error, never a panic.
pub fn unpack(
    first: u64,
    last: u64,
    committed_ms: i64,
    bytes: &[u8],
    into: &mut Vec<OutboxEntry>,
) -> Result<(), OutboxRowError> {
    let needed = last.checked_sub(first).map_or(0, |d| d.saturating_add(1));
    let count_error = |held| OutboxRowError::Count {
        held,
        first,
        last,
        needed,
    };
    let cut = |_| OutboxRowError::Cut(bytes.len());
    let mut r = Reader::new(bytes);
    let mut held = 0u64;
    while r.at() < bytes.len() {
        if held == needed {
            return Err(count_error(held + 1));
        }
        let at = r.at();
        let len = r.count().map_err(cut)?;
        let vehicle = std::str::from_utf8(r.take(len).map_err(cut)?)
            .map(VehicleId::from)
            .map_err(|_| OutboxRowError::VehicleNotUtf8(at))?;
        let len = r.count().map_err(cut)?;
        let line = r.take(len).map_err(cut)?.to_vec();
        into.push(OutboxEntry {
            seq: first + held,
            vehicle,
            line,
            committed_ms,
        });
        held += 1;
    }
    if held != needed {
        return Err(count_error(held));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entries() -> impl Strategy<Value = Vec<OutboxEntry>> {
        prop::collection::vec(
            (
                1u64..4,
                0i64..3,
                "\\PC{0,12}",
                prop::collection::vec(any::<u8>(), 0..200),
            ),
            0..40,
        )
        .prop_map(|raw| {
            let mut seq = 0;
            raw.into_iter()
                .map(|(step, committed_ms, vehicle, line)| {
                    // Mostly consecutive, with gaps now and then.
                    seq += if step == 3 { 5 } else { 1 };
                    OutboxEntry {
                        seq,
                        vehicle: vehicle.into(),
                        line,
                        committed_ms,
                    }
                })
                .collect()
        })
    }

    fn unpack_all(rows: &[OutboxRow]) -> Result<Vec<OutboxEntry>, OutboxRowError> {
        let mut out = Vec::new();
        for row in rows {
            unpack(row.first, row.last, row.committed_ms, &row.bytes, &mut out)?;
        }
        Ok(out)
    }

    proptest! {
        /// Every entry comes back, in order, and each row is one run of
        /// consecutive seqs.
        #[test]
        fn round_trips(entries in entries()) {
            let rows = pack(&entries);
            prop_assert_eq!(unpack_all(&rows), Ok(entries.clone()));
            let gaps = entries
                .windows(2)
                .filter(|w| w[1].seq != w[0].seq + 1 || w[1].committed_ms != w[0].committed_ms)
                .count();
            prop_assert_eq!(rows.len(), if entries.is_empty() { 0 } else { gaps + 1 });
        }

        /// A cut row, or one that claims more or fewer entries than it
        /// holds, is an error, not a panic nor a silent loss.
        #[test]
        fn damage_is_an_error(entries in entries()) {
            for row in pack(&entries) {
                for cut in 0..row.bytes.len() {
                    prop_assert!(unpack(row.first, row.last, 0, &row.bytes[..cut], &mut Vec::new()).is_err());
                }
                prop_assert!(unpack(row.first, row.last + 1, 0, &row.bytes, &mut Vec::new()).is_err());
                if row.last > row.first {
                    prop_assert!(unpack(row.first, row.last - 1, 0, &row.bytes, &mut Vec::new()).is_err());
                }
            }
        }
    }

    #[test]
    fn a_commits_entries_make_one_row() {
        let entry = |seq| OutboxEntry {
            seq,
            vehicle: "van1".into(),
            line: br#"{"seq":1}"#.to_vec(),
            committed_ms: 5,
        };
        let rows = pack(&[entry(7), entry(8), entry(9)]);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].first, rows[0].last), (7, 9));
        // 1 + 4 for the id, 1 + 9 for the line, three times.
        assert_eq!(rows[0].bytes.len(), 3 * 15);
        let mut bad = rows[0].bytes.clone();
        bad[1] = 0xff;
        assert_eq!(
            unpack(7, 9, 5, &bad, &mut Vec::new()),
            Err(OutboxRowError::VehicleNotUtf8(0))
        );
        assert_eq!(
            unpack(7, 10, 5, &rows[0].bytes, &mut Vec::new()),
            Err(OutboxRowError::Count {
                held: 3,
                first: 7,
                last: 10,
                needed: 4
            })
        );
    }

    /// A long run (a version 1 outbox moved over) is cut into rows of at
    /// most [`MAX_ENTRIES_PER_ROW`], and still reads back whole.
    #[test]
    fn a_long_run_takes_several_rows() {
        let total = 2 * MAX_ENTRIES_PER_ROW + 5;
        let entries: Vec<OutboxEntry> = (1..=total)
            .map(|seq| OutboxEntry {
                seq,
                vehicle: "v".into(),
                line: vec![b'x'],
                committed_ms: 0,
            })
            .collect();
        let rows = pack(&entries);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|r| r.last - r.first < MAX_ENTRIES_PER_ROW));
        assert_eq!(unpack_all(&rows), Ok(entries));
    }
}
