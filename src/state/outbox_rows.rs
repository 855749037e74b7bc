//! A commit's outbox entries as the embedded store keeps them: one row per
//! run of consecutive seqs, which is one row per commit, since the
//! committer numbers a commit's transitions one after another.
//!
//! Why not a row per entry: a commit appends every transition its batches
//! made (dozens to hundreds in the bench's capture), and a later commit deletes
//! them once the events file and the broker have them. As a row each, that
//! insert and delete was about a third of the committer's CPU, and most of
//! what the write-ahead log carried (BENCHMARKS.md, "The outbox a row per
//! commit").
//!
//! Layout: the run's first and last seq are the row's columns; its bytes
//! are each entry in seq order as varint length + vehicle id, then varint
//! length + line.

use super::outbox::OutboxEntry;
use super::record::{Reader, RecordError, put_str, put_varint};
use crate::model::VehicleId;

/// One row: entries `first..=last`, packed.
#[derive(Debug, PartialEq, Eq)]
pub struct OutboxRow {
    pub first: u64,
    pub last: u64,
    pub bytes: Vec<u8>,
}

/// The rows for entries in seq order: a new row wherever a seq is not the
/// one after its predecessor's.
pub fn pack(entries: &[OutboxEntry]) -> Vec<OutboxRow> {
    let mut rows: Vec<OutboxRow> = Vec::new();
    for e in entries {
        let row = match rows.last_mut() {
            Some(row) if row.last.checked_add(1) == Some(e.seq) => row,
            _ => {
                rows.push(OutboxRow {
                    first: e.seq,
                    last: e.seq,
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

/// The entries of the row whose first seq is `first`, appended to `into`.
/// A row that ends early, runs past `last` or is not UTF-8 where an id is
/// expected is an error, never a panic.
pub fn unpack(
    first: u64,
    last: u64,
    bytes: &[u8],
    into: &mut Vec<OutboxEntry>,
) -> Result<(), RecordError> {
    let mut r = Reader { bytes, at: 0 };
    let mut seq = first;
    while r.at < bytes.len() {
        if seq > last {
            return Err(RecordError::Trailing(bytes.len() - r.at));
        }
        let at = r.at;
        let len = r.count()?;
        let vehicle = std::str::from_utf8(r.take(len)?)
            .map(VehicleId::from)
            .map_err(|_| RecordError::NotUtf8(at))?;
        let len = r.count()?;
        let line = r.take(len)?.to_vec();
        into.push(OutboxEntry { seq, vehicle, line });
        seq += 1;
    }
    if seq != last.wrapping_add(1) {
        return Err(RecordError::Truncated(bytes.len()));
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
                "\\PC{0,12}",
                prop::collection::vec(any::<u8>(), 0..200),
            ),
            0..40,
        )
        .prop_map(|raw| {
            let mut seq = 0;
            raw.into_iter()
                .map(|(step, vehicle, line)| {
                    // Mostly consecutive, with gaps now and then.
                    seq += if step == 3 { 5 } else { 1 };
                    OutboxEntry {
                        seq,
                        vehicle: vehicle.into(),
                        line,
                    }
                })
                .collect()
        })
    }

    fn unpack_all(rows: &[OutboxRow]) -> Result<Vec<OutboxEntry>, RecordError> {
        let mut out = Vec::new();
        for row in rows {
            unpack(row.first, row.last, &row.bytes, &mut out)?;
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
            let gaps = entries.windows(2).filter(|w| w[1].seq != w[0].seq + 1).count();
            prop_assert_eq!(rows.len(), if entries.is_empty() { 0 } else { gaps + 1 });
        }

        /// A cut row, or one that claims more or fewer entries than it
        /// holds, is an error, not a panic nor a silent loss.
        #[test]
        fn damage_is_an_error(entries in entries()) {
            for row in pack(&entries) {
                for cut in 0..row.bytes.len() {
                    prop_assert!(unpack(row.first, row.last, &row.bytes[..cut], &mut Vec::new()).is_err());
                }
                prop_assert!(unpack(row.first, row.last + 1, &row.bytes, &mut Vec::new()).is_err());
                if row.last > row.first {
                    prop_assert!(unpack(row.first, row.last - 1, &row.bytes, &mut Vec::new()).is_err());
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
        };
        let rows = pack(&[entry(7), entry(8), entry(9)]);
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].first, rows[0].last), (7, 9));
        // 1 + 4 for the id, 1 + 9 for the line, three times.
        assert_eq!(rows[0].bytes.len(), 3 * 15);
        let mut bad = rows[0].bytes.clone();
        bad[1] = 0xff;
        assert_eq!(
            unpack(7, 9, &bad, &mut Vec::new()),
            Err(RecordError::NotUtf8(0))
        );
    }
}
