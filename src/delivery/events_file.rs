//! Where the events file says the relay stopped.
//!
//! The file, not the store, is the truth for what it holds: a crash between
//! writing lines and recording the cursor leaves the store behind the file,
//! so at start the relay resumes after the seq on the file's last line. A
//! line torn by a crash mid-write is cut off first (its transition is still
//! in the outbox, since the cursor only moves after a whole write), but only
//! once the state file's lock is held: a second geogate started by mistake
//! must not cut the line the first one is writing.

use crate::sink::append_file::last_newline;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

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

/// Reads where the events file ends, without changing anything: its tail,
/// or when it holds no line with a seq (just rotated, or gone), the tail
/// of the newest file rotated away from it ([`rotated_files`]). A missing
/// file is an empty one.
pub fn read(path: &Path) -> io::Result<Tail> {
    let current = read_one(path)?;
    if current.last_seq.is_some() {
        return Ok(current);
    }
    match rotated_files(path)?.pop() {
        Some(newest) => Ok(Tail {
            last_seq: read_one(&newest.path)?.last_seq.or(Some(newest.last)),
            has_lines: true,
            ..current
        }),
        None => Ok(current),
    }
}

/// The seq on the first line of `path`, if it has one.
pub fn first_seq(path: &Path) -> io::Result<Option<u64>> {
    use std::io::BufRead;
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut line = Vec::new();
    io::BufReader::new(file.take(1 << 20)).read_until(b'\n', &mut line)?;
    Ok(serde_json::from_slice::<serde_json::Value>(&line)
        .ok()
        .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64)))
}

/// A file rotated away from the events file: `<path>.<first>-<last>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rotated {
    pub first: u64,
    pub last: u64,
    pub path: PathBuf,
}

/// Where the lines `first..=last` go when the file at `path` is rotated:
/// the seqs zero-padded, so that the names sort in seq order.
pub fn rotated_path(path: &Path, first: u64, last: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{first:012}-{last:012}"));
    PathBuf::from(name)
}

/// The files rotated away from `path`, oldest first. Only names of the
/// form [`rotated_path`] gives count: a copy someone else made is not one.
pub fn rotated_files(path: &Path) -> io::Result<Vec<Rotated>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let Some(base) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(range) = name
            .to_str()
            .and_then(|n| n.strip_prefix(base))
            .and_then(|n| n.strip_prefix('.'))
        else {
            continue;
        };
        let Some((first, last)) = range.split_once('-') else {
            continue;
        };
        let digits = |s: &str| s.len() == 12 && s.bytes().all(|b| b.is_ascii_digit());
        if let (true, true, Ok(first), Ok(last)) = (
            digits(first),
            digits(last),
            first.parse::<u64>(),
            last.parse::<u64>(),
        ) {
            found.push(Rotated {
                first,
                last,
                path: entry.path(),
            });
        }
    }
    found.sort_by_key(|r| r.last);
    Ok(found)
}

/// Takes `<path>.lock` for this process's life: one geogate writes an
/// events file, whatever its state backend. Refused at once if another
/// holds it.
pub fn lock(path: &Path) -> io::Result<File> {
    let mut name = path.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "another geogate writes this events file (it holds {}); give each instance an events file of its own",
                lock_path.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(e),
    }
}

fn read_one(path: &Path) -> io::Result<Tail> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Tail::default()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let Some(end) = last_newline(&mut file, len, u64::MAX)? else {
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
/// Reads backwards in chunks, each byte once (a line longer than a chunk
/// is put together across chunks).
fn each_line_backwards(
    file: &mut File,
    end: u64,
    n: usize,
    mut visit: impl FnMut(&[u8]) -> bool,
) -> io::Result<()> {
    const CHUNK: u64 = 64 * 1024;
    let mut buf = vec![0; CHUNK as usize];
    // The part of the current line already read (from later chunks).
    let mut carry: Vec<u8> = Vec::new();
    let mut visited = 0;
    let mut chunk_end = end;
    loop {
        let start = chunk_end.saturating_sub(CHUNK);
        let chunk = &mut buf[..(chunk_end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        let mut line_end = chunk.len();
        while let Some(nl) = chunk[..line_end].iter().rposition(|&b| b == b'\n') {
            if visited == n {
                return Ok(());
            }
            visited += 1;
            let more = if carry.is_empty() {
                visit(&chunk[nl + 1..line_end])
            } else {
                let mut line = chunk[nl + 1..line_end].to_vec();
                line.append(&mut carry);
                visit(&line)
            };
            if !more {
                return Ok(());
            }
            line_end = nl;
        }
        let mut head = chunk[..line_end].to_vec();
        head.append(&mut carry);
        carry = head;
        if start == 0 {
            // The file's first line.
            if visited < n {
                visit(&carry);
            }
            return Ok(());
        }
        chunk_end = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`each_line_backwards`] over the complete lines of the file at `path`
    /// (a missing file has none).
    fn each_complete_line_backwards(
        path: &Path,
        n: usize,
        visit: impl FnMut(&[u8]) -> bool,
    ) -> io::Result<()> {
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        match last_newline(&mut file, len, u64::MAX)? {
            Some(end) => each_line_backwards(&mut file, end, n, visit),
            None => Ok(()),
        }
    }

    #[test]
    fn lines_are_read_backwards_whole_across_chunk_edges() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.ndjson");
        // Short lines, an empty one, and lines longer than a read chunk.
        let lines: Vec<Vec<u8>> = (0..400)
            .map(|i: usize| match i % 97 {
                0 => vec![b'a' + (i % 26) as u8; 150_000 + i],
                5 => Vec::new(),
                _ => format!("{{\"seq\":{i}}}").into_bytes(),
            })
            .collect();
        let mut content = lines.join(&b'\n');
        content.extend_from_slice(b"\ntorn");
        std::fs::write(&path, &content).unwrap();
        let mut seen = Vec::new();
        each_complete_line_backwards(&path, usize::MAX, |line| {
            seen.push(line.to_vec());
            true
        })
        .unwrap();
        seen.reverse();
        assert_eq!(seen, lines);
        let mut last_three = Vec::new();
        each_complete_line_backwards(&path, 3, |line| {
            last_three.push(line.to_vec());
            true
        })
        .unwrap();
        assert_eq!(
            last_three,
            [lines[399].clone(), lines[398].clone(), lines[397].clone()]
        );
    }

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
