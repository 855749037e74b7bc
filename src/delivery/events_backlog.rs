//! What the events files hold after an output's cursor, read forward a
//! page at a time.
//!
//! With the Redis backend the outbox is gone once its lines are written, so
//! an output that restarts behind the file (MQTT, the webhook) is fed from
//! the events file and the files rotated away from it. However far behind
//! it is, only one page is in memory at a time, and the start is found by
//! reading back from the end, so the cost is what is left to send.

use super::events_file::{each_line_backwards, rotated_files};
use super::outbox::OutboxEntry;
use crate::sink::append_file::last_newline;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// A line's fields the backlog needs; the rest is sent as written.
#[derive(serde::Deserialize)]
struct Head<'a> {
    seq: u64,
    #[serde(borrow)]
    vehicle: std::borrow::Cow<'a, str>,
}

pub struct Backlog {
    /// Files not entered yet, oldest first.
    files: VecDeque<PathBuf>,
    /// The file being read.
    current: Option<Reading>,
    /// The last seq read: lines at or before it are skipped.
    after: u64,
    /// Lines past this seq are not the backlog's: the file's writer hands
    /// them over itself.
    until: u64,
    /// Entries read and not yet handed out: a failed read keeps them.
    ready: VecDeque<OutboxEntry>,
}

/// A file and the offset of its next unread line. The reader is dropped
/// on a failed read and the file opened again at `offset`, so a failure
/// costs neither a line nor its place.
struct Reading {
    path: PathBuf,
    offset: u64,
    reader: Option<(BufReader<File>, i64)>,
}

impl Backlog {
    /// The lines with a seq in `after + 1..=until` in `path` and the files
    /// rotated away from it: the rotated ones first, oldest first, then the
    /// current one. Lines without a seq (someone else's) are skipped.
    ///
    /// A line's commit time is not on it, so each is given its file's last
    /// modification, which comes at or after every line's commit (to the
    /// file system's timestamp granularity): an entry's maximum age may run
    /// out late, not early.
    pub fn open(path: &Path, after: u64, until: u64) -> io::Result<Self> {
        let mut files: VecDeque<PathBuf> = rotated_files(path)?
            .into_iter()
            .filter(|r| r.last > after)
            .map(|r| r.path)
            .collect();
        files.push_back(path.to_owned());
        // The first file is entered where its lines pass `after`.
        let current = match files.pop_front() {
            Some(first) => Some(Reading {
                offset: start_after(&first, after)?,
                path: first,
                reader: None,
            }),
            None => None,
        };
        Ok(Self {
            files,
            current,
            after,
            until,
            ready: VecDeque::new(),
        })
    }

    /// The seq the backlog starts at, if it has any entry: above the
    /// confirmed seq + 1 when lines were moved or deleted by hand.
    pub fn first_seq(&mut self) -> io::Result<Option<u64>> {
        self.fill(1)?;
        Ok(self.ready.front().map(|e| e.seq))
    }

    /// Up to `max` entries, oldest first; empty once the backlog is done.
    /// After an error the next call goes on where this one failed.
    pub fn next_page(&mut self, max: usize) -> io::Result<Vec<OutboxEntry>> {
        self.fill(max)?;
        let n = max.min(self.ready.len());
        Ok(self.ready.drain(..n).collect())
    }

    /// Reads until `max` entries are ready or the backlog is done.
    fn fill(&mut self, max: usize) -> io::Result<()> {
        let mut line = Vec::new();
        while self.ready.len() < max {
            let Some(reading) = self.current.as_mut() else {
                match self.files.pop_front() {
                    Some(path) => {
                        self.current = Some(Reading {
                            path,
                            offset: 0,
                            reader: None,
                        });
                        continue;
                    }
                    None => return Ok(()),
                }
            };
            let (reader, modified_ms) = match &mut reading.reader {
                Some(open) => open,
                None => match reopen(&reading.path, reading.offset)? {
                    Some(open) => reading.reader.insert(open),
                    // Gone (a rotated file deleted by hand): the next one.
                    None => {
                        self.current = None;
                        continue;
                    }
                },
            };
            line.clear();
            let read = match reader.read_until(b'\n', &mut line) {
                Ok(read) => read,
                Err(e) => {
                    reading.reader = None;
                    return Err(e);
                }
            };
            if read == 0 || line.last() != Some(&b'\n') {
                // The file's end (a torn line is not a line).
                self.current = None;
                continue;
            }
            reading.offset += read as u64;
            line.pop();
            let Ok(head) = serde_json::from_slice::<Head>(&line) else {
                continue;
            };
            if head.seq <= self.after {
                continue;
            }
            if head.seq > self.until {
                self.current = None;
                self.files.clear();
                return Ok(());
            }
            self.after = head.seq;
            let entry = OutboxEntry {
                seq: head.seq,
                vehicle: head.vehicle.as_ref().into(),
                line: line.clone(),
                committed_ms: 0,
            };
            self.ready.push_back(entry.committed_at(*modified_ms));
        }
        Ok(())
    }
}

/// `path` opened at `offset`, with its last modification in ms; `None`
/// if it does not exist.
fn reopen(path: &Path, offset: u64) -> io::Result<Option<(BufReader<File>, i64)>> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let modified_ms = file
        .metadata()?
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    file.seek(SeekFrom::Start(offset))?;
    Ok(Some((
        BufReader::with_capacity(64 * 1024, file),
        modified_ms,
    )))
}

/// The offset in `path` just past the last line at or before seq `after`
/// (0 when every line is past it, or the file is missing). Read from the
/// end back: each complete line is visited once, the last first, and with
/// its newline takes `len + 1` bytes.
fn start_after(path: &Path, after: u64) -> io::Result<u64> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let Some(newline) = last_newline(&mut file, len, u64::MAX)? else {
        return Ok(0);
    };
    let mut past = 0;
    each_line_backwards(
        &mut file,
        newline,
        usize::MAX,
        |line| match serde_json::from_slice::<Head>(line) {
            Ok(head) if head.seq <= after => false,
            _ => {
                past += line.len() as u64 + 1;
                true
            }
        },
    )?;
    Ok((newline + 1).saturating_sub(past))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delivery::events_file::rotated_path;

    fn line(seq: u64) -> String {
        format!(
            r#"{{"id":"i{seq}","seq":{seq},"vehicle":"v{seq}","fence":"A","event":"enter","ts":1}}"#
        )
    }

    fn all(path: &Path, after: u64, until: u64, page: usize) -> Vec<(u64, String, String)> {
        let mut backlog = Backlog::open(path, after, until).unwrap();
        let mut got = Vec::new();
        loop {
            let next = backlog.next_page(page).unwrap();
            if next.is_empty() {
                return got;
            }
            assert!(next.len() <= page, "a page holds at most its size");
            got.extend(next.into_iter().map(|e| {
                (
                    e.seq,
                    e.vehicle.to_string(),
                    String::from_utf8(e.line).unwrap(),
                )
            }));
        }
    }

    #[test]
    fn the_lines_after_a_seq_come_oldest_first_skipping_lines_without_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        assert!(all(&path, 0, 10, 3).is_empty(), "no file");
        let content = format!(
            "{}\n{}\nnot json\n{}\n\n{}\n{{\"se",
            line(1),
            line(2),
            line(3),
            line(4)
        );
        std::fs::write(&path, content).unwrap();
        assert_eq!(
            all(&path, 2, 10, 1),
            [(3, "v3".into(), line(3)), (4, "v4".into(), line(4))]
        );
        assert_eq!(
            all(&path, 0, 10, 3).iter().map(|e| e.0).collect::<Vec<_>>(),
            [1, 2, 3, 4],
            "the torn last line is not one"
        );
        assert!(all(&path, 4, 10, 3).is_empty());
        assert_eq!(all(&path, 1, 3, 10).len(), 2, "nothing past `until`");
        let mut backlog = Backlog::open(&path, 1, 10).unwrap();
        assert_eq!(backlog.first_seq().unwrap(), Some(2));
        assert_eq!(
            backlog.next_page(10).unwrap().len(),
            3,
            "the peeked one too"
        );
    }

    #[test]
    fn a_backlog_runs_across_rotated_files_from_the_one_holding_its_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        let write = |path: &Path, seqs: std::ops::RangeInclusive<u64>| {
            // Lines longer than a read chunk now and then.
            let text: String = seqs
                .map(|s| match s % 50 {
                    0 => format!(
                        "{{\"seq\":{s},\"vehicle\":\"v\",\"pad\":\"{}\"}}\n",
                        "x".repeat(70_000)
                    ),
                    _ => line(s) + "\n",
                })
                .collect();
            std::fs::write(path, text).unwrap();
        };
        write(&rotated_path(&path, 1, 100), 1..=100);
        write(&rotated_path(&path, 101, 200), 101..=200);
        write(&path, 201..=230);
        for (after, page) in [(0, 7), (49, 64), (50, 1), (150, 1000), (200, 5), (229, 2)] {
            let seqs: Vec<u64> = all(&path, after, 230, page).iter().map(|e| e.0).collect();
            assert_eq!(seqs, (after + 1..=230).collect::<Vec<_>>(), "after {after}");
        }
        // A rotated file deleted by hand: the backlog starts past the hole.
        std::fs::remove_file(rotated_path(&path, 101, 200)).unwrap();
        let mut backlog = Backlog::open(&path, 120, 230).unwrap();
        assert_eq!(backlog.first_seq().unwrap(), Some(201));
    }

    #[test]
    fn a_failed_read_loses_no_entry_and_the_next_page_goes_on_from_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        let lines = |seqs: std::ops::RangeInclusive<u64>| -> String {
            seqs.map(|s| line(s) + "\n").collect()
        };
        std::fs::write(rotated_path(&path, 1, 10), lines(1..=10)).unwrap();
        // A directory opens, and reading it fails (EISDIR).
        let middle = rotated_path(&path, 11, 20);
        std::fs::create_dir(&middle).unwrap();
        std::fs::write(&path, lines(21..=25)).unwrap();
        let mut backlog = Backlog::open(&path, 3, 25).unwrap();
        assert!(backlog.next_page(100).is_err());
        assert!(backlog.next_page(100).is_err(), "still failing");
        std::fs::remove_dir(&middle).unwrap();
        std::fs::write(&middle, lines(11..=20)).unwrap();
        let seqs: Vec<u64> = backlog
            .next_page(100)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (4..=25).collect::<Vec<_>>());
    }

    #[test]
    fn entries_are_given_their_files_last_change_as_commit_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        std::fs::write(&path, line(1) + "\n").unwrap();
        let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
        let ms = modified.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
        let page = Backlog::open(&path, 0, 1).unwrap().next_page(5).unwrap();
        assert_eq!(page[0].committed_ms, ms);
    }
}
