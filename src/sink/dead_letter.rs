//! The dead-letter sink: one NDJSON record per refused message, written
//! (and flushed, or fsynced) before that message is acknowledged, so a
//! refusal is never silent and never lost.
//!
//! A record holds the receive time, topic, reason, detail, shard (when one
//! was chosen) and the original payload: as a string when it is valid UTF-8,
//! otherwise base64 under `payload_base64`. The file rotates to `<path>.1`
//! when it would exceed `rotate_bytes`, older rotations moving up to
//! `<path>.N` (`rotate_keep`); the records of a file pushed past N are
//! deleted, and counted (`geogate_dead_letter_records_deleted_total`), so
//! what rotation drops is never silent.
//!
//! A crash can tear the last line. [`DeadLetterSink::open`] detects a torn
//! tail, reports it, and starts the next record on a fresh line: never fatal.

use super::append_file::{AppendFile, last_newline};
use super::health::SinkHealth;
use crate::sink::config::FsyncPolicy;
use crate::sink::metrics::DEAD_LETTER_RECORDS_DELETED_TOTAL;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

/// One record. Its text borrows from the refused message where it can
/// (the topic, the reason, a UTF-8 payload): the router builds one per
/// refusal and serialises it at once, and when a gate sheds a burst that
/// is thousands a second, each a copy of its payload that nothing needs.
/// Read back from a file, every field is owned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter<'a> {
    /// Unix milliseconds when geogate received the message.
    pub received_ms: i64,
    pub topic: Cow<'a, str>,
    /// `shed` or a codec reason (`malformed_json`, ...).
    pub reason: Cow<'a, str>,
    pub detail: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub shard: Option<usize>,
    /// For `shed`: the gate that refused it and its retry hint.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gate: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub retry_after_ms: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload_base64: Option<String>,
}

impl<'a> DeadLetter<'a> {
    /// A record for `payload`: the payload as text when it is UTF-8, else
    /// as base64 (see [`crate::sink::payload`]).
    pub fn new(
        received_ms: i64,
        topic: &'a str,
        reason: &'a str,
        detail: impl Into<Cow<'a, str>>,
        payload: &'a [u8],
    ) -> Self {
        let (text, b64) = crate::sink::payload::text_or_base64(payload);
        Self {
            received_ms,
            topic: Cow::Borrowed(topic),
            reason: Cow::Borrowed(reason),
            detail: detail.into(),
            shard: None,
            gate: None,
            retry_after_ms: None,
            payload: text,
            payload_base64: b64,
        }
    }
}

/// What opening found at the end of an existing file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    Clean,
    /// The last `bytes` bytes had no newline: a record torn by a crash.
    TornTail {
        bytes: u64,
    },
}

pub struct DeadLetterSink {
    file: AppendFile,
    health: std::sync::Arc<SinkHealth>,
    rotate_bytes: u64,
    fsync: FsyncPolicy,
    /// Records queued by [`Self::queue`], whole lines back to back, until
    /// they are placed behind a successful rotation check (a failed
    /// rotation keeps the rest here for the next [`Self::flush`]). One
    /// buffer, not one allocation per record.
    queued: Vec<u8>,
    /// Where each queued line ends in `queued`.
    queued_ends: Vec<usize>,
    /// Rotated files kept.
    keep: u32,
    /// Records deleted by rotation so far.
    deleted: u64,
    /// Records written but not yet synced as the policy asks (`always`).
    /// After a failed fsync the descriptor is dropped and its dirty pages
    /// may be gone, so these are written again before the next fsync.
    unsynced: Vec<u8>,
}

impl DeadLetterSink {
    /// Opens (appending) and checks the tail of an existing file.
    pub fn open(
        path: &Path,
        rotate_bytes: u64,
        fsync: FsyncPolicy,
    ) -> io::Result<(Self, Recovery)> {
        let recovery = match File::open(path) {
            Ok(mut existing) => {
                let len = existing.metadata()?.len();
                torn_tail(&mut existing, len)?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Recovery::Clean,
            Err(e) => return Err(e),
        };
        let mut file = AppendFile::open(path)?;
        if let Recovery::TornTail { .. } = recovery {
            // Terminate the torn record so the next one starts clean; the
            // torn line stays for an operator to inspect.
            file.queue(b"\n");
            file.write_unwritten()?;
        }
        let sink = Self {
            health: std::sync::Arc::new(SinkHealth::new(
                "dead_letter",
                path,
                "its message stays unacked",
            )),
            file,
            rotate_bytes,
            fsync,
            queued: Vec::new(),
            queued_ends: Vec::new(),
            unsynced: Vec::new(),
            keep: 1,
            deleted: 0,
        };
        Ok((sink, recovery))
    }

    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Keeps `keep` rotated files (at least 1) instead of one.
    pub fn keeping(mut self, keep: u32) -> Self {
        self.keep = keep.max(1);
        self
    }

    /// Records deleted by rotation since open.
    pub fn deleted_records(&self) -> u64 {
        self.deleted
    }

    pub fn health(&self) -> std::sync::Arc<SinkHealth> {
        self.health.clone()
    }

    /// Appends one record durably (per the fsync policy) before returning:
    /// [`Self::queue`], then [`Self::flush`].
    pub fn write(&mut self, record: &DeadLetter) -> io::Result<()> {
        self.queue(record);
        self.flush()
    }

    /// Queues one record for the next [`Self::flush`]; nothing reaches the
    /// file before it. Why queue: the router refuses whole runs of
    /// messages in a burst (a gate shedding above the watermark, a
    /// publisher sending garbage), and a write call per record, or an
    /// fsync per record with `fsync = "always"`, made each refusal cost
    /// more than an admitted event (benches/pipeline.rs, `pipeline_shedding`).
    ///
    /// Infallible, so that every refusal has its record: a message never
    /// finished would hold back every later ack, which go out in receive
    /// order. A record is strings, integers and one float (a non-finite
    /// one is written as `null`), which serde_json always serialises into
    /// memory. Returns the line without its newline (the MQTT mirror's
    /// message).
    pub fn queue(&mut self, record: &DeadLetter) -> &[u8] {
        let start = self.queued.len();
        serde_json::to_writer(&mut self.queued, record)
            .expect("strings and numbers always serialise into memory");
        let end = self.queued.len();
        self.queued.push(b'\n');
        self.queued_ends.push(self.queued.len());
        &self.queued[start..end]
    }

    /// Whether records are queued or still unwritten after a failure.
    pub fn has_unflushed(&self) -> bool {
        !self.queued.is_empty() || self.file.has_unwritten() || !self.unsynced.is_empty()
    }

    /// Writes everything queued durably (per the fsync policy), in one
    /// write call and at most one fsync unless a rotation falls between.
    /// On error nothing is lost or doubled: what was not written stays
    /// with the sink, and the next call finishes it. A crash part-way
    /// tears at most the last line written, which [`Self::open`] reports.
    pub fn flush(&mut self) -> io::Result<()> {
        let mut placed = 0;
        let result = self.place_queued(&mut placed);
        if let Some(&bytes) = placed.checked_sub(1).and_then(|i| self.queued_ends.get(i)) {
            self.queued.drain(..bytes);
            self.queued_ends.drain(..placed);
            self.queued_ends.iter_mut().for_each(|end| *end -= bytes);
        }
        result?;
        self.file.write_unwritten()?;
        self.sync_unsynced()
    }

    /// Moves queued lines into the file's buffer, rotating first wherever
    /// the next line would take the file past `rotate_bytes`; `placed`
    /// counts the lines moved, so a failure keeps the rest queued.
    fn place_queued(&mut self, placed: &mut usize) -> io::Result<()> {
        let mut start = 0;
        while let Some(&end) = self.queued_ends.get(*placed) {
            let len = end - start;
            let buffered = self.file.len() + self.file.unwritten_len();
            if buffered > 0 && buffered + len as u64 > self.rotate_bytes {
                // What is already buffered belongs to the current file.
                self.file.write_unwritten()?;
                self.make_room_for_rotation()?;
                // Rotation syncs the file it moves away.
                self.file.rotate(&rotated_path(self.file.path(), 1))?;
                self.unsynced.clear();
            }
            let line = &self.queued[start..end];
            self.file.queue(line);
            if self.fsync == FsyncPolicy::Always {
                self.unsynced.extend_from_slice(line);
            }
            start = end;
            *placed += 1;
        }
        Ok(())
    }

    fn sync_unsynced(&mut self) -> io::Result<()> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        if let Err(e) = self.file.sync_data() {
            // Written is not durable: write it again, then sync again (a
            // copy may survive twice; a record is never acked unsynced).
            self.file.queue(&self.unsynced);
            return Err(e);
        }
        self.unsynced.clear();
        Ok(())
    }

    /// Moves `<path>.k` to `<path>.k+1` from the oldest down, deleting
    /// (and counting) the one that would pass `keep`. Safe to run again
    /// after a failure part-way: missing files are skipped.
    fn make_room_for_rotation(&mut self) -> io::Result<()> {
        let base = self.file.path().to_owned();
        let oldest = rotated_path(&base, self.keep);
        match count_records(&oldest) {
            Ok(records) => {
                std::fs::remove_file(&oldest)?;
                self.deleted += records;
                metrics::counter!(DEAD_LETTER_RECORDS_DELETED_TOTAL).increment(records);
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        for k in (1..self.keep).rev() {
            match std::fs::rename(rotated_path(&base, k), rotated_path(&base, k + 1)) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }

    /// Forgets a record shutdown gave up on (its message stays unacked).
    pub fn discard_unwritten(&mut self) {
        self.queued.clear();
        self.queued_ends.clear();
        self.file.discard_unwritten();
        self.unsynced.clear();
    }

    /// Flushes to stable storage (shutdown).
    pub fn sync(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Lines in the file at `path`, read in small pieces. Why not read it
/// whole: at the default `rotate_bytes` that was a 64 MiB buffer, freshly
/// faulted in (and zeroed) on the router's thread at every rotation; in a
/// shedding burst that was most of the router's time (benches/pipeline.rs,
/// `pipeline_shedding`).
fn count_records(path: &Path) -> io::Result<u64> {
    let mut file = File::open(path)?;
    let mut buffer = vec![0u8; 64 * 1024];
    let mut lines = 0u64;
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return Ok(lines),
            Ok(n) => lines += buffer[..n].iter().filter(|&&b| b == b'\n').count() as u64,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// `<path>.k`: rotation `k`, 1 the newest.
pub fn rotated_path(path: &Path, k: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}

fn torn_tail(file: &mut File, len: u64) -> io::Result<Recovery> {
    if len == 0 {
        return Ok(Recovery::Clean);
    }
    // Scan back (at most 1 MiB) for the last newline.
    const WINDOW: u64 = 1 << 20;
    Ok(match last_newline(file, len, WINDOW)? {
        Some(i) if i + 1 == len => Recovery::Clean,
        Some(i) => Recovery::TornTail { bytes: len - i - 1 },
        None => Recovery::TornTail {
            bytes: len.min(WINDOW),
        },
    })
}

/// Reads every complete record of a dead-letter file; returns them with the
/// 1-based line numbers of lines that do not parse (torn or foreign).
pub fn read_records(path: &Path) -> io::Result<(Vec<DeadLetter<'static>>, Vec<usize>)> {
    let mut records = Vec::new();
    let mut bad = Vec::new();
    for (i, line) in BufReader::new(File::open(path)?).lines().enumerate() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(r) => records.push(r),
            Err(_) => bad.push(i + 1),
        }
    }
    Ok((records, bad))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_parseable_records_and_base64_for_binary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        let (mut sink, recovery) =
            DeadLetterSink::open(&path, 1 << 20, FsyncPolicy::Always).unwrap();
        assert_eq!(recovery, Recovery::Clean);
        sink.write(&DeadLetter::new(
            1,
            "fleet/a/telemetry",
            "malformed_json",
            "x",
            b"{\"a\n",
        ))
        .unwrap();
        sink.write(&DeadLetter::new(
            2,
            "t",
            "malformed_json",
            "utf8",
            &[0xff, 0x00],
        ))
        .unwrap();
        let (records, bad) = read_records(&path).unwrap();
        assert!(bad.is_empty());
        assert_eq!(records[0].payload.as_deref(), Some("{\"a\n"));
        assert_eq!(records[1].payload_base64.as_deref(), Some("/wA="));
    }

    #[test]
    fn torn_tail_is_detected_and_the_next_record_starts_clean() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        let torn = "{\"received_ms\":2,\"top";
        let whole = "{\"received_ms\":1,\"topic\":\"t\",\"reason\":\"r\",\"detail\":\"d\"}\n";
        std::fs::write(&path, format!("{whole}{torn}")).unwrap();
        let (mut sink, recovery) =
            DeadLetterSink::open(&path, 1 << 20, FsyncPolicy::Flush).unwrap();
        assert_eq!(
            recovery,
            Recovery::TornTail {
                bytes: torn.len() as u64
            }
        );
        sink.write(&DeadLetter::new(3, "t", "oversize", "big", b"x"))
            .unwrap();
        let (records, bad) = read_records(&path).unwrap();
        assert_eq!(
            records.iter().map(|r| r.received_ms).collect::<Vec<_>>(),
            [1, 3]
        );
        assert_eq!(bad, [2], "the torn line is kept and reported");
    }

    /// The tail check reads back in small chunks now: a clean file far
    /// longer than one chunk is still clean, and a torn line longer than
    /// the 1 MiB searched is reported as 1 MiB torn, as before.
    #[test]
    fn tail_check_on_a_long_clean_file_and_a_torn_line_past_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        let line = format!("{}\n", "y".repeat(9_999));
        std::fs::write(&path, line.repeat(50)).unwrap();
        let (_, recovery) = DeadLetterSink::open(&path, 1 << 30, FsyncPolicy::Flush).unwrap();
        assert_eq!(recovery, Recovery::Clean);
        let torn = dir.path().join("torn.ndjson");
        std::fs::write(&torn, format!("{line}{}", "z".repeat((1 << 20) + 7))).unwrap();
        let (_, recovery) = DeadLetterSink::open(&torn, 1 << 30, FsyncPolicy::Flush).unwrap();
        assert_eq!(recovery, Recovery::TornTail { bytes: 1 << 20 });
    }

    #[test]
    fn rotation_keeps_rotate_keep_files_and_counts_what_it_deletes() {
        // Written one by one, and queued in batches of 37 (rotations then
        // fall inside a batch).
        for batch in [1, 37] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("dl.ndjson");
            let (sink, _) = DeadLetterSink::open(&path, 4096, FsyncPolicy::Always).unwrap();
            let mut sink = sink.keeping(2);
            // About 70 records a file: five rotations, three files deleted.
            for i in 0..400 {
                sink.queue(&DeadLetter::new(
                    i,
                    "t",
                    "shed",
                    "gate",
                    b"{\"vehicle\":\"v\"}",
                ));
                if (i + 1) % batch == 0 {
                    sink.flush().unwrap();
                }
            }
            sink.flush().unwrap();
            assert!(!sink.has_unflushed());
            let read = |p: &Path| read_records(p).unwrap().0;
            let (newest, one, two) = (
                read(&path),
                read(&rotated_path(&path, 1)),
                read(&rotated_path(&path, 2)),
            );
            assert!(!rotated_path(&path, 3).exists(), "only rotate_keep files");
            for file in [path.clone(), rotated_path(&path, 1), rotated_path(&path, 2)] {
                assert!(
                    std::fs::metadata(&file).unwrap().len() <= 4096,
                    "batch {batch}"
                );
            }
            let kept: Vec<i64> = [&two, &one, &newest]
                .iter()
                .flat_map(|f| f.iter().map(|r| r.received_ms))
                .collect();
            // Contiguous and ending at the last record; all the older ones
            // are exactly the ones counted as deleted.
            assert_eq!(kept.last(), Some(&399), "batch {batch}");
            assert!(kept.windows(2).all(|w| w[1] == w[0] + 1), "contiguous");
            assert_eq!(sink.deleted_records(), kept[0] as u64, "batch {batch}");
            assert!(sink.deleted_records() > 0, "rotation deleted something");
        }
    }

    /// A rotation that fails part-way through a flush keeps the records it
    /// had not placed, in order, for the next flush: none lost, none
    /// written twice, whatever was placed before the failure.
    #[test]
    fn a_rotation_failing_mid_flush_loses_and_repeats_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        // About 16 records a file, so 25 rotate once.
        let (mut sink, _) = DeadLetterSink::open(&path, 1500, FsyncPolicy::Always).unwrap();
        let record = |i| DeadLetter::new(i, "t", "shed", "gate", b"{\"vehicle\":\"v\"}");
        // `<path>.1` as a directory: the rotation cannot count the records
        // of what it would replace, so it fails after placing some.
        let blocker = rotated_path(&path, 1);
        std::fs::create_dir(&blocker).unwrap();
        for i in 0..20 {
            sink.queue(&record(i));
        }
        assert!(sink.flush().is_err());
        let placed = read_records(&path).unwrap().0.len();
        assert!(
            (1..20).contains(&placed),
            "the failure falls mid-flush: {placed} of 20 placed"
        );
        std::fs::remove_dir(&blocker).unwrap();
        for i in 20..25 {
            sink.queue(&record(i));
        }
        sink.flush().unwrap();
        assert!(!sink.has_unflushed());
        let mut all = read_records(&blocker).unwrap().0;
        all.extend(read_records(&path).unwrap().0);
        assert_eq!(
            all.iter().map(|r| r.received_ms).collect::<Vec<_>>(),
            (0..25).collect::<Vec<_>>()
        );
    }

    #[test]
    fn queued_records_reach_the_file_only_when_flushed_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dl.ndjson");
        let (mut sink, _) = DeadLetterSink::open(&path, 1 << 20, FsyncPolicy::Flush).unwrap();
        for i in 0..5 {
            sink.queue(&DeadLetter::new(i, "t", "shed", "gate", b"x"));
        }
        assert!(sink.has_unflushed());
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "nothing before the flush"
        );
        sink.flush().unwrap();
        assert!(!sink.has_unflushed());
        let (records, bad) = read_records(&path).unwrap();
        assert!(bad.is_empty());
        assert_eq!(
            records.iter().map(|r| r.received_ms).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }
}
