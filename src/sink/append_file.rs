//! An append-only file that keeps what it could not write.
//!
//! Bytes handed to it are written in full or stay queued: a short write
//! (ENOSPC part-way through a record) resumes where it stopped, so a retry
//! never duplicates a record. After a failure the file is opened again by
//! path on the next attempt, so a sink pointed at a path that is fixed
//! while geogate runs (a freed disk, a directory made writable) recovers
//! without a restart. (If the path is re-pointed to another file between a
//! short write and its retry, the record's two halves land in the two
//! files; readers skip a torn line.)

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// What [`AppendFile::change`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileChange {
    Same,
    /// The path is gone, or names another file.
    Moved,
    /// The same file, shorter than what was written to it.
    Shrunk {
        expected: u64,
        found: u64,
    },
}

pub struct AppendFile {
    path: PathBuf,
    /// `None` after a failure: reopened by path on the next attempt.
    file: Option<File>,
    /// Accepted, not yet written, in order.
    unwritten: Vec<u8>,
    /// Bytes in the file as last known (for rotation decisions).
    len: u64,
}

fn open_append(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl AppendFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = open_append(path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok(Self {
            path: path.to_owned(),
            file: Some(file),
            unwritten: Vec::new(),
            len,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes in the file, as far as this writer knows.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn has_unwritten(&self) -> bool {
        !self.unwritten.is_empty()
    }

    /// Bytes accepted and not yet written.
    pub fn unwritten_len(&self) -> u64 {
        self.unwritten.len() as u64
    }

    /// Queues `bytes` behind anything still unwritten.
    pub fn queue(&mut self, bytes: &[u8]) {
        self.unwritten.extend_from_slice(bytes);
    }

    /// Drops what could not be written (shutdown gave up on it: the
    /// messages behind it stay unacked and come back).
    pub fn discard_unwritten(&mut self) {
        self.unwritten.clear();
    }

    /// Writes everything queued; on error the rest stays queued.
    pub fn write_unwritten(&mut self) -> io::Result<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let result = self.write_queued();
        if result.is_err() {
            self.file = None;
        }
        result
    }

    fn write_queued(&mut self) -> io::Result<()> {
        self.file()?;
        let Some(file) = self.file.as_mut() else {
            return Err(io::Error::other("file not open"));
        };
        let mut written = 0;
        let result = loop {
            if written == self.unwritten.len() {
                break Ok(());
            }
            match file.write(&self.unwritten[written..]) {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        self.unwritten.drain(..written);
        self.len += written as u64;
        result
    }

    /// Forces written data to stable storage.
    pub fn sync_data(&mut self) -> io::Result<()> {
        let result = self.file()?.sync_data();
        if result.is_err() {
            self.file = None;
        }
        result
    }

    /// Cuts the file back to `len` bytes and drops what is queued, so that
    /// what was written past `len` can be written again without a second
    /// copy. Used after a failed sync: the kernel may have dropped those
    /// bytes' write-back while reads still show them. A file already
    /// shorter is left as it is.
    pub fn cut_back(&mut self, len: u64) -> io::Result<()> {
        self.file = None;
        let file = OpenOptions::new().write(true).open(&self.path)?;
        if file.metadata()?.len() > len {
            file.set_len(len)?;
        }
        self.unwritten.clear();
        self.len = len.min(file.metadata()?.len());
        Ok(())
    }

    /// Whether the path still names the file this writer has open, as it
    /// left it: another process may have renamed it away (a log rotator's
    /// `create` mode), or cut it shorter (`copytruncate`).
    #[cfg(unix)]
    pub fn change(&self) -> io::Result<FileChange> {
        use std::os::unix::fs::MetadataExt;
        let Some(file) = &self.file else {
            return Ok(FileChange::Same);
        };
        let open = file.metadata()?;
        let at_path = match std::fs::metadata(&self.path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(FileChange::Moved),
            Err(e) => return Err(e),
        };
        if (open.dev(), open.ino()) != (at_path.dev(), at_path.ino()) {
            return Ok(FileChange::Moved);
        }
        if at_path.len() < self.len {
            return Ok(FileChange::Shrunk {
                expected: self.len,
                found: at_path.len(),
            });
        }
        Ok(FileChange::Same)
    }

    /// Closes the open file and opens (or creates) the one at the path now.
    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = None;
        self.file().map(|_| ())
    }

    /// A second handle on the open file, for syncing it on another thread.
    pub fn sync_handle(&mut self) -> io::Result<File> {
        self.file()?.try_clone()
    }

    /// Moves the file to `to` and starts a new one at the path.
    pub fn rotate(&mut self, to: &Path) -> io::Result<()> {
        self.file()?.sync_all()?;
        std::fs::rename(&self.path, to)?;
        self.file = None;
        self.len = 0;
        self.file().map(|_| ())
    }

    fn file(&mut self) -> io::Result<&mut File> {
        if self.file.is_none() {
            let file = open_append(&self.path)?;
            self.len = file.metadata().map_or(0, |m| m.len());
            self.file = Some(file);
        }
        self.file
            .as_mut()
            .ok_or_else(|| io::Error::other("file not open"))
    }
}

/// Offset of the last `\n` before offset `before`, looking back at most
/// `limit` bytes. Read backwards in chunks that start small: a file that
/// ends cleanly, the usual case, is settled by its last few KiB however
/// large it has grown (the dead letter's fixed 1 MiB tail read was most
/// of the in-process bench's start:
/// docs/decisions/0011-dead-letter-start-and-writes.md).
pub fn last_newline(file: &mut File, before: u64, limit: u64) -> io::Result<Option<u64>> {
    const FIRST_CHUNK: u64 = 4 * 1024;
    const MAX_CHUNK: u64 = 64 * 1024;
    let floor = before.saturating_sub(limit);
    let (mut end, mut chunk, mut buf) = (before, FIRST_CHUNK, Vec::new());
    while end > floor {
        let start = end.saturating_sub(chunk).max(floor);
        buf.resize((end - start) as usize, 0);
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut buf)?;
        if let Some(i) = buf.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + i as u64));
        }
        end = start;
        chunk = (chunk * 2).min(MAX_CHUNK);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `last_newline` against a plain search of `bytes[floor..before]`.
    fn check_last_newline(bytes: &[u8], before: u64, limit: u64) -> Result<(), TestCaseError> {
        let floor = before.saturating_sub(limit) as usize;
        let expected = bytes[floor..before as usize]
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|i| (floor + i) as u64);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tail");
        std::fs::write(&path, bytes).unwrap();
        let mut file = File::open(&path).unwrap();
        prop_assert_eq!(last_newline(&mut file, before, limit).unwrap(), expected);
        Ok(())
    }

    /// One newline exactly on each place a chunked reader can get wrong:
    /// the last byte, either side of the chunk edges (4, 4+8 and 4+8+16
    /// KiB back), either side of the limit, and the first byte.
    #[test]
    fn last_newline_on_the_chunk_edges_and_the_limit() {
        const LEN: u64 = 100_000;
        const LIMIT: u64 = 50_000;
        let edges = [
            1,
            4096,
            4097,
            12_288,
            12_289,
            28_672,
            28_673,
            LIMIT,
            LIMIT + 1,
            LEN,
        ];
        for back in edges {
            let mut bytes = vec![b'x'; LEN as usize];
            bytes[(LEN - back) as usize] = b'\n';
            for limit in [LIMIT, u64::MAX] {
                check_last_newline(&bytes, LEN, limit).unwrap();
            }
        }
        check_last_newline(b"", 0, u64::MAX).unwrap();
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Against a plain search of the bytes in reach, newlines anywhere.
        #[test]
        fn last_newline_finds_what_a_plain_search_finds(
            len in 0usize..150_000,
            newlines in prop::collection::vec(0.0f64..1.0, 0..4),
            before in 0.0f64..=1.0,
            limit in prop::sample::select(vec![0u64, 1, 4096, 4097, 70_000, 1 << 20, u64::MAX]),
        ) {
            let mut bytes = vec![b'x'; len];
            for at in &newlines {
                if len > 0 {
                    bytes[((len - 1) as f64 * at) as usize] = b'\n';
                }
            }
            check_last_newline(&bytes, (len as f64 * before) as u64, limit)?;
        }
    }

    #[test]
    fn a_failed_write_keeps_its_bytes_and_a_reopened_path_takes_them() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("sink.ndjson");
        let real = dir.path().join("real.ndjson");
        std::os::unix::fs::symlink("/dev/full", &link).unwrap();
        let mut file = AppendFile::open(&link).unwrap();
        file.queue(b"one\n");
        let err = file.write_unwritten().unwrap_err();
        assert_eq!(err.raw_os_error(), Some(28), "ENOSPC from /dev/full: {err}");
        assert!(file.has_unwritten());
        file.queue(b"two\n");
        assert!(file.write_unwritten().is_err());
        // The path is fixed while the writer holds its bytes.
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        file.write_unwritten().unwrap();
        assert!(!file.has_unwritten());
        assert_eq!(std::fs::read_to_string(&real).unwrap(), "one\ntwo\n");
        assert_eq!(file.len(), 8);
    }
}
