//! Where the events file says the relay stopped.
//!
//! The file, not the store, is the truth for what it holds: a crash between
//! writing lines and recording the cursor leaves the store behind the file,
//! so at start the relay resumes after the seq on the file's last line. A
//! line torn by a crash mid-write is cut off first (its transition is still
//! in the outbox, since the cursor only moves after a whole write), but only
//! once the state file's lock is held: a second geogate started by mistake
//! must not cut the line the first one is writing.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tail {
    /// Seq on the last complete line that has one, within the last
    /// [`LINES_SEARCHED`] lines (lines written before seqs existed have
    /// none).
    pub last_seq: Option<u64>,
    /// The file holds at least one complete line.
    pub has_lines: bool,
    /// Bytes of a torn last line that were cut off.
    pub torn_bytes: u64,
}

/// Lines looked at, from the end, for one that carries a seq.
const LINES_SEARCHED: usize = 1000;

/// Reads the tail of `path` without changing it. A missing file is an
/// empty one.
pub fn read(path: &Path) -> io::Result<Tail> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Tail::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let Some(end) = last_newline(&mut file, len)? else {
        // Not one complete line: all of it is torn.
        return Ok(Tail {
            torn_bytes: len,
            ..Tail::default()
        });
    };
    let torn_bytes = len - (end + 1);
    // The last line with a seq: a line someone else appended (or an empty
    // one) must not make the relay start again from seq 1.
    let mut last_seq = None;
    each_line_backwards(&mut file, end, LINES_SEARCHED, |line| {
        last_seq = serde_json::from_slice::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64));
        last_seq.is_none()
    })?;
    Ok(Tail {
        last_seq,
        has_lines: true,
        torn_bytes,
    })
}

/// The `id`s on the last `n` complete lines of `path` (a missing file has
/// none): what a consumer that may have written a transition just before a
/// crash checks before writing it again.
pub fn recent_ids(path: &Path, n: usize) -> io::Result<std::collections::HashSet<String>> {
    let mut ids = std::collections::HashSet::new();
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ids),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if let Some(end) = last_newline(&mut file, len)? {
        each_line_backwards(&mut file, end, n, |line| {
            if let Some(id) = serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(|id| id.as_str().map(str::to_owned)))
            {
                ids.insert(id);
            }
            true
        })?;
    }
    Ok(ids)
}

/// The lines after seq `after`, oldest first, as outbox entries: what a
/// publisher that had confirmed up to `after` still has to send. Read from
/// the end back to the first line at or before `after`, so the cost is what
/// is left to send.
pub fn entries_after(
    path: &Path,
    after: u64,
) -> io::Result<Vec<crate::state::outbox::OutboxEntry>> {
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        seq: u64,
        #[serde(borrow)]
        vehicle: std::borrow::Cow<'a, str>,
    }
    let mut entries = Vec::new();
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(entries),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    if let Some(end) = last_newline(&mut file, len)? {
        each_line_backwards(&mut file, end, usize::MAX, |line| {
            // A line without a seq (appended by someone else) is skipped.
            match serde_json::from_slice::<Head>(line) {
                Ok(head) if head.seq <= after => false,
                Ok(head) => {
                    entries.push(crate::state::outbox::OutboxEntry {
                        seq: head.seq,
                        vehicle: head.vehicle.as_ref().into(),
                        line: line.to_vec(),
                    });
                    true
                }
                Err(_) => true,
            }
        })?;
    }
    entries.reverse();
    Ok(entries)
}

/// Cuts off the torn last line [`read`] found. Only the process holding
/// the state file's lock may call it: the file is that process's.
pub fn cut_torn(path: &Path, tail: &Tail) -> io::Result<()> {
    if tail.torn_bytes == 0 {
        return Ok(());
    }
    let file = OpenOptions::new().write(true).open(path)?;
    let len = file.metadata()?.len();
    file.set_len(len.saturating_sub(tail.torn_bytes))?;
    file.sync_data()
}

/// Calls `visit` on up to `n` complete lines, the last first, the last one
/// ending at the newline at offset `end`, until `visit` returns false.
fn each_line_backwards(
    file: &mut File,
    end: u64,
    n: usize,
    mut visit: impl FnMut(&[u8]) -> bool,
) -> io::Result<()> {
    let mut line_end = Some(end);
    for _ in 0..n {
        let Some(end) = line_end else { break };
        let start = last_newline(file, end)?;
        let from = start.map_or(0, |s| s + 1);
        let mut line = vec![0; (end - from) as usize];
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut line)?;
        if !visit(&line) {
            break;
        }
        line_end = start;
    }
    Ok(())
}

/// Offset of the last `\n` before `before`, reading backwards in chunks.
fn last_newline(file: &mut File, before: u64) -> io::Result<Option<u64>> {
    const CHUNK: u64 = 64 * 1024;
    let mut end = before;
    let mut buf = vec![0; CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tail_of(content: &[u8]) -> (Tail, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        std::fs::write(&path, content).unwrap();
        let tail = read(&path).unwrap();
        cut_torn(&path, &tail).unwrap();
        (tail, std::fs::read(&path).unwrap())
    }

    #[test]
    fn resumes_after_the_last_whole_line_and_cuts_a_torn_one() {
        let whole = b"{\"seq\":1}\n{\"seq\":2}\n";
        let (tail, left) = tail_of(whole);
        assert_eq!(
            (tail.last_seq, tail.has_lines, tail.torn_bytes),
            (Some(2), true, 0)
        );
        assert_eq!(left, whole);

        let (tail, left) = tail_of(b"{\"seq\":1}\n{\"seq\":2}\n{\"se");
        assert_eq!((tail.last_seq, tail.torn_bytes), (Some(2), 4));
        assert_eq!(left, whole);

        let (tail, left) = tail_of(b"{\"se");
        assert_eq!(
            (tail.last_seq, tail.has_lines, tail.torn_bytes),
            (None, false, 4)
        );
        assert!(left.is_empty());

        // A line from before seqs: history without a seq.
        let (tail, _) = tail_of(b"{\"vehicle\":\"v\"}\n");
        assert_eq!((tail.last_seq, tail.has_lines), (None, true));

        // Something else appended after the last transition.
        let (tail, _) = tail_of(b"{\"seq\":7}\n\nnot json\n");
        assert_eq!(tail.last_seq, Some(7));

        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("none")).unwrap(), Tail::default());
    }

    #[test]
    fn finds_a_line_across_chunk_boundaries() {
        let mut content = Vec::new();
        content.extend_from_slice(b"{\"seq\":41}\n");
        content.extend_from_slice(
            format!("{{\"seq\":42,\"pad\":\"{}\"}}\n", "x".repeat(100_000)).as_bytes(),
        );
        let (tail, _) = tail_of(&content);
        assert_eq!(tail.last_seq, Some(42));
    }
}
