//! The capture file: what `record` writes, `synth` generates and `replay`
//! reads. One JSON object per line:
//!
//! `{"t_ns": <offset from capture start>, "topic": "...", "payload": "..."}`
//!
//! `payload` is the original payload as a string; a payload that is not
//! valid UTF-8 is stored as `payload_base64` instead. Files ending in `.gz`
//! are gzip-compressed transparently, both ways. Lines are in `t_ns` order.

use crate::sink::payload::text_or_base64;
use base64::Engine;
use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRecord {
    pub t_ns: u64,
    pub topic: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub payload_base64: Option<String>,
}

impl CaptureRecord {
    pub fn new(t_ns: u64, topic: impl Into<String>, payload: &[u8]) -> Self {
        let (payload, payload_base64) = text_or_base64(payload);
        Self {
            t_ns,
            topic: topic.into(),
            payload: payload.map(Cow::into_owned),
            payload_base64,
        }
    }

    /// The original payload bytes.
    pub fn payload_bytes(&self) -> Vec<u8> {
        match (&self.payload, &self.payload_base64) {
            (Some(s), _) => s.as_bytes().to_vec(),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .unwrap_or_default(),
            (None, None) => Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
    #[error("{path}:{line}: not a capture record: {message}")]
    Record {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{path}:{line}: t_ns goes backwards ({t} after {previous})")]
    OutOfOrder {
        path: String,
        line: usize,
        t: u64,
        previous: u64,
    },
}

fn is_gz(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// Reads a whole capture, checking every line.
pub fn read(path: &Path) -> Result<Vec<CaptureRecord>, CaptureError> {
    let p = path.display().to_string();
    let io_err = |source| CaptureError::Io {
        path: p.clone(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let reader: Box<dyn BufRead> = if is_gz(path) {
        Box::new(BufReader::new(MultiGzDecoder::new(file)))
    } else {
        Box::new(BufReader::new(file))
    };
    let mut records = Vec::new();
    let mut previous = 0;
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(io_err)?;
        if line.trim().is_empty() {
            continue;
        }
        let record: CaptureRecord =
            serde_json::from_str(&line).map_err(|e| CaptureError::Record {
                path: p.clone(),
                line: i + 1,
                message: e.to_string(),
            })?;
        if record.t_ns < previous {
            return Err(CaptureError::OutOfOrder {
                path: p.clone(),
                line: i + 1,
                t: record.t_ns,
                previous,
            });
        }
        previous = record.t_ns;
        records.push(record);
    }
    Ok(records)
}

/// Writes capture records, gzip when `path` ends in `.gz`.
pub struct CaptureWriter {
    out: Box<dyn Write + Send>,
}

impl CaptureWriter {
    pub fn create(path: &Path) -> io::Result<Self> {
        let file = BufWriter::new(File::create(path)?);
        let out: Box<dyn Write + Send> = if is_gz(path) {
            // Level 9 with the gzip header's mtime left at 0: the same
            // records always give the same bytes.
            Box::new(GzEncoder::new(file, Compression::best()))
        } else {
            Box::new(file)
        };
        Ok(Self { out })
    }

    pub fn write(&mut self, record: &CaptureRecord) -> io::Result<()> {
        serde_json::to_writer(&mut self.out, record)?;
        self.out.write_all(b"\n")
    }

    /// Flushes and finishes the gzip stream.
    pub fn finish(mut self) -> io::Result<()> {
        self.out.flush()?;
        drop(self.out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_plain_and_gzip_including_binary_payloads() {
        let dir = tempfile::tempdir().unwrap();
        let records = vec![
            CaptureRecord::new(0, "fleet/a/telemetry", b"{\"vehicle\":\"a\"}"),
            CaptureRecord::new(5, "fleet/b/telemetry", &[0xff, 0x01]),
        ];
        for name in ["c.ndjson", "c.ndjson.gz"] {
            let path = dir.path().join(name);
            let mut w = CaptureWriter::create(&path).unwrap();
            for r in &records {
                w.write(r).unwrap();
            }
            w.finish().unwrap();
            let back = read(&path).unwrap();
            assert_eq!(back, records);
            assert_eq!(back[1].payload_bytes(), vec![0xff, 0x01]);
        }
    }

    #[test]
    fn bad_lines_and_disorder_are_reported_with_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.ndjson");
        std::fs::write(
            &path,
            "{\"t_ns\":1,\"topic\":\"t\",\"payload\":\"x\"}\nnope\n",
        )
        .unwrap();
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .contains(":2: not a capture record")
        );
        std::fs::write(
            &path,
            "{\"t_ns\":9,\"topic\":\"t\"}\n{\"t_ns\":3,\"topic\":\"t\"}\n",
        )
        .unwrap();
        assert!(
            read(&path)
                .unwrap_err()
                .to_string()
                .contains("goes backwards")
        );
    }
}
