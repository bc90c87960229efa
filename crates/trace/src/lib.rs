//! The farmem page-access trace: a compact, versioned binary format.
//!
//! # Format (version 1, all integers little-endian)
//!
//! ```text
//! header, 32 bytes:
//!   0  magic        8 bytes  "FARMEMTR"
//!   8  version      u16      1
//!  10  header_len   u16      32
//!  12  flags        u32      0 (no flags are defined; others are rejected)
//!  16  record_count u64      u64::MAX while the writer is still open
//!  24  checksum     u64      FNV-1a 64 of all record bytes
//! records, `record_count` of them, each:
//!   kind         1 byte   0 = read, 1 = write
//!   time delta   varint   zigzag(time_ns - previous time_ns), first relative to 0
//!   page delta   varint   zigzag(page - previous page), first relative to 0
//!   thread       varint   thread id (≤ u32::MAX)
//! ```
//!
//! Varints are LEB128 (7 bits per byte, low first, at most 10 bytes). A sequential scan costs
//! about 5 bytes per access. The reader checks the magic, version, flags, that the writer
//! finished, every record's encoding, the record count, the checksum and that nothing follows
//! the last record; each failure is its own [`TraceError`] variant.
//!
//! # Limitations
//!
//! The count and checksum are written when the writer finishes (it seeks back to the header),
//! so the output must be seekable (a file, not a pipe), and a writer killed before
//! [`TraceWriter::finish`] (or its drop) leaves a trace the reader refuses as unfinished.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The 8 bytes every trace starts with.
pub const MAGIC: [u8; 8] = *b"FARMEMTR";
/// The format version this code writes and reads.
pub const VERSION: u16 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 32;
const UNFINISHED: u64 = u64::MAX;

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessKind {
    /// A load.
    Read,
    /// A store.
    Write,
}

/// One page access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// When, in nanoseconds from the start of the trace.
    pub time_ns: u64,
    /// Page number (far address space offset / 4096).
    pub page: u64,
    /// Id of the accessing thread.
    pub thread: u32,
    /// Read or write.
    pub kind: AccessKind,
}

/// Errors reading or writing a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace file could not be opened.
    #[error("cannot open trace {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The trace file could not be created (or an existing path is not this user's regular
    /// file: see [`farmem_fds::files::create_stream`]).
    #[error("cannot create trace {path}: {source}")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        source: farmem_fds::files::FileError,
    },
    /// Reading failed for a reason other than the end of the file.
    #[error("cannot read the trace")]
    Read(#[source] std::io::Error),
    /// Writing failed.
    #[error("cannot write the trace (disk full?)")]
    Write(#[source] std::io::Error),
    /// The file is shorter than the header.
    #[error(
        "not a farmem trace: the file is {len} bytes, shorter than the {HEADER_LEN}-byte header"
    )]
    ShortHeader {
        /// Bytes present.
        len: usize,
    },
    /// The file does not start with the magic bytes.
    #[error("not a farmem trace: it starts with {found:?} instead of \"FARMEMTR\"")]
    BadMagic {
        /// The first 8 bytes, lossily decoded.
        found: String,
    },
    /// The version is not one this build reads.
    #[error("trace format version {found} is not supported: this farmem reads version {VERSION}; use the farmem that wrote it")]
    UnsupportedVersion {
        /// Version in the file.
        found: u16,
    },
    /// The header length or flags are not those of the version.
    #[error("corrupt trace header: {0}")]
    BadHeader(String),
    /// The writer never finished (crashed or was killed).
    #[error("the trace was never finished: its writer stopped before writing the record count (crash?); record it again")]
    Unfinished,
    /// The file ends before the records the header announces.
    #[error("truncated trace: the header announces {expected} records but the file ends after {read} (and {partial_bytes} bytes of the next)")]
    Truncated {
        /// Records announced.
        expected: u64,
        /// Complete records read.
        read: u64,
        /// Bytes of an incomplete record at the end.
        partial_bytes: usize,
    },
    /// A record is not validly encoded.
    #[error("corrupt trace: record {index}: {reason}")]
    Corrupt {
        /// Index of the record (from 0).
        index: u64,
        /// What is wrong.
        reason: String,
    },
    /// The records do not match the checksum in the header.
    #[error(
        "corrupt trace: checksum of the records is {found:#018x}, the header says {expected:#018x}"
    )]
    Checksum {
        /// From the header.
        expected: u64,
        /// Computed.
        found: u64,
    },
    /// Bytes follow the last record.
    #[error("corrupt trace: {extra} unexpected byte(s) after the {records} records the header announces")]
    TrailingBytes {
        /// Records announced (and read).
        records: u64,
        /// At least this many extra bytes.
        extra: usize,
    },
    /// The writer was already finished.
    #[error("the trace writer is already finished")]
    Finished,
}

/// FNV-1a, 64 bits.
#[derive(Debug, Clone, Copy)]
struct Fnv(u64);

impl Fnv {
    const fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Streaming, buffered trace writer. Records are written as they come; [`finish`](Self::finish)
/// (or dropping the writer, which ignores errors) writes the count and checksum into the header.
#[derive(Debug)]
pub struct TraceWriter<W: Write + Seek> {
    out: Option<BufWriter<W>>,
    /// Position of the header in the inner writer.
    start: u64,
    count: u64,
    checksum: Fnv,
    prev_time: u64,
    prev_page: u64,
    scratch: Vec<u8>,
}

impl TraceWriter<File> {
    /// Creates (or truncates) the file at `path` and writes the header. A link at `path` is
    /// never followed, and an existing path must be this user's regular file; a new file has
    /// mode 0600 ([`farmem_fds::files::create_stream`]).
    pub fn create(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = farmem_fds::files::create_stream(path).map_err(|source| TraceError::Create {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(file)
    }
}

impl<W: Write + Seek> TraceWriter<W> {
    /// Starts a trace on `inner` (at its current position, normally 0).
    pub fn new(mut inner: W) -> Result<Self, TraceError> {
        let start = inner.stream_position().map_err(TraceError::Write)?;
        let mut out = BufWriter::with_capacity(64 * 1024, inner);
        out.write_all(&header(UNFINISHED, 0))
            .map_err(TraceError::Write)?;
        Ok(Self {
            out: Some(out),
            start,
            count: 0,
            checksum: Fnv::new(),
            prev_time: 0,
            prev_page: 0,
            scratch: Vec::with_capacity(32),
        })
    }

    /// Appends one record.
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        let out = self.out.as_mut().ok_or(TraceError::Finished)?;
        let buf = &mut self.scratch;
        buf.clear();
        buf.push(match rec.kind {
            AccessKind::Read => 0,
            AccessKind::Write => 1,
        });
        put_varint(buf, zigzag(rec.time_ns.wrapping_sub(self.prev_time) as i64));
        put_varint(buf, zigzag(rec.page.wrapping_sub(self.prev_page) as i64));
        put_varint(buf, u64::from(rec.thread));
        out.write_all(buf).map_err(TraceError::Write)?;
        self.checksum.update(buf);
        self.prev_time = rec.time_ns;
        self.prev_page = rec.page;
        self.count += 1;
        Ok(())
    }

    /// Records written so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Flushes, writes the count and checksum into the header, and returns the inner writer
    /// (positioned at the end of the trace).
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<W, TraceError> {
        let out = self.out.take().ok_or(TraceError::Finished)?;
        let mut inner = out
            .into_inner()
            .map_err(|e| TraceError::Write(e.into_error()))?;
        let end = inner.stream_position().map_err(TraceError::Write)?;
        inner
            .seek(SeekFrom::Start(self.start))
            .map_err(TraceError::Write)?;
        inner
            .write_all(&header(self.count, self.checksum.0))
            .map_err(TraceError::Write)?;
        inner
            .seek(SeekFrom::Start(end))
            .map_err(TraceError::Write)?;
        inner.flush().map_err(TraceError::Write)?;
        Ok(inner)
    }
}

impl<W: Write + Seek> Drop for TraceWriter<W> {
    fn drop(&mut self) {
        if self.out.is_some() {
            let _ = self.finish_inner();
        }
    }
}

fn header(count: u64, checksum: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_le_bytes());
    h[10..12].copy_from_slice(&(HEADER_LEN as u16).to_le_bytes());
    h[12..16].copy_from_slice(&0u32.to_le_bytes());
    h[16..24].copy_from_slice(&count.to_le_bytes());
    h[24..32].copy_from_slice(&checksum.to_le_bytes());
    h
}

/// Streaming trace reader: validates the header on construction, then yields records; the
/// count, checksum and end of file are checked when the last record has been read, so a caller
/// that needs a fully valid trace before using it calls [`read_all`](Self::read_all).
#[derive(Debug)]
pub struct TraceReader<R: Read> {
    input: R,
    expected: u64,
    checksum_expected: u64,
    read: u64,
    checksum: Fnv,
    prev_time: u64,
    prev_page: u64,
    done: bool,
}

impl TraceReader<BufReader<File>> {
    /// Opens the trace at `path` and checks its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| TraceError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Self::new(BufReader::with_capacity(64 * 1024, file))
    }
}

/// Reads until `buf` is full or the input ends; returns the bytes read.
fn read_full(input: &mut impl Read, buf: &mut [u8]) -> Result<usize, TraceError> {
    let mut n = 0;
    while n < buf.len() {
        match input.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(TraceError::Read(e)),
        }
    }
    Ok(n)
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header from `input`.
    pub fn new(mut input: R) -> Result<Self, TraceError> {
        let mut h = [0u8; HEADER_LEN];
        let n = read_full(&mut input, &mut h)?;
        if n >= 8 && h[0..8] != MAGIC {
            return Err(TraceError::BadMagic {
                found: String::from_utf8_lossy(&h[0..8]).into_owned(),
            });
        }
        if n < HEADER_LEN {
            return Err(TraceError::ShortHeader { len: n });
        }
        let u16_at = |i: usize| u16::from_le_bytes([h[i], h[i + 1]]);
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&h[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let version = u16_at(8);
        if version != VERSION {
            return Err(TraceError::UnsupportedVersion { found: version });
        }
        let header_len = u16_at(10);
        if usize::from(header_len) != HEADER_LEN {
            return Err(TraceError::BadHeader(format!(
                "header length is {header_len}, version {VERSION} uses {HEADER_LEN}"
            )));
        }
        let flags = u32::from_le_bytes([h[12], h[13], h[14], h[15]]);
        if flags != 0 {
            return Err(TraceError::BadHeader(format!("unknown flags {flags:#x}")));
        }
        let expected = u64_at(16);
        if expected == UNFINISHED {
            return Err(TraceError::Unfinished);
        }
        Ok(Self {
            input,
            expected,
            checksum_expected: u64_at(24),
            read: 0,
            checksum: Fnv::new(),
            prev_time: 0,
            prev_page: 0,
            done: false,
        })
    }

    /// Number of records the header announces.
    pub fn len(&self) -> u64 {
        self.expected
    }

    /// Whether the header announces no records.
    pub fn is_empty(&self) -> bool {
        self.expected == 0
    }

    fn byte(&mut self, partial: &mut usize) -> Result<u8, TraceError> {
        let mut b = [0u8; 1];
        if read_full(&mut self.input, &mut b)? == 0 {
            return Err(TraceError::Truncated {
                expected: self.expected,
                read: self.read,
                partial_bytes: *partial,
            });
        }
        *partial += 1;
        self.checksum.update(&b);
        Ok(b[0])
    }

    fn varint(&mut self, partial: &mut usize, what: &str) -> Result<u64, TraceError> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.byte(partial)?;
            let bits = u64::from(b & 0x7f);
            if i == 9 && bits > 1 {
                break;
            }
            v |= bits << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(TraceError::Corrupt {
            index: self.read,
            reason: format!("the {what} varint is longer than 64 bits"),
        })
    }

    /// The next record, `Ok(None)` after the last one (once the end checks passed).
    pub fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        if self.done {
            return Ok(None);
        }
        if self.read == self.expected {
            self.done = true;
            let mut extra = [0u8; 64];
            let n = read_full(&mut self.input, &mut extra)?;
            if n > 0 {
                return Err(TraceError::TrailingBytes {
                    records: self.expected,
                    extra: n,
                });
            }
            if self.checksum.0 != self.checksum_expected {
                return Err(TraceError::Checksum {
                    expected: self.checksum_expected,
                    found: self.checksum.0,
                });
            }
            return Ok(None);
        }
        let mut partial = 0usize;
        let kind = match self.byte(&mut partial)? {
            0 => AccessKind::Read,
            1 => AccessKind::Write,
            other => {
                return Err(TraceError::Corrupt {
                    index: self.read,
                    reason: format!("access kind byte is {other}, expected 0 (read) or 1 (write)"),
                })
            }
        };
        let dt = unzigzag(self.varint(&mut partial, "time")?);
        let dp = unzigzag(self.varint(&mut partial, "page")?);
        let thread = self.varint(&mut partial, "thread")?;
        let thread = u32::try_from(thread).map_err(|_| TraceError::Corrupt {
            index: self.read,
            reason: format!("thread id {thread} does not fit in 32 bits"),
        })?;
        let rec = Record {
            time_ns: self.prev_time.wrapping_add(dt as u64),
            page: self.prev_page.wrapping_add(dp as u64),
            thread,
            kind,
        };
        self.prev_time = rec.time_ns;
        self.prev_page = rec.page;
        self.read += 1;
        Ok(Some(rec))
    }

    /// Reads every record and runs the end checks; returns the records only if the whole trace
    /// is valid.
    pub fn read_all(mut self) -> Result<Vec<Record>, TraceError> {
        // The count comes from the file: reserve only a little up front (a 32-byte file claiming
        // 2^60 records must not reserve hundreds of MiB); the vector grows with what is read.
        let mut out = Vec::with_capacity(self.expected.min(1 << 16) as usize);
        while let Some(r) = self.next_record()? {
            out.push(r);
        }
        Ok(out)
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// Reads and validates the whole trace at `path`.
pub fn read_trace(path: impl AsRef<Path>) -> Result<Vec<Record>, TraceError> {
    TraceReader::open(path)?.read_all()
}

/// Writes `records` as a complete trace at `path`.
pub fn write_trace(path: impl AsRef<Path>, records: &[Record]) -> Result<(), TraceError> {
    let mut w = TraceWriter::create(path)?;
    for r in records {
        w.write(r)?;
    }
    w.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn sample() -> Vec<Record> {
        vec![
            Record {
                time_ns: 5,
                page: 100,
                thread: 0,
                kind: AccessKind::Read,
            },
            Record {
                time_ns: 1005,
                page: 101,
                thread: 3,
                kind: AccessKind::Write,
            },
            Record {
                time_ns: 900,
                page: 7,
                thread: u32::MAX,
                kind: AccessKind::Read,
            },
            Record {
                time_ns: u64::MAX,
                page: u64::MAX,
                thread: 1,
                kind: AccessKind::Read,
            },
            Record {
                time_ns: 0,
                page: 0,
                thread: 0,
                kind: AccessKind::Write,
            },
        ]
    }

    fn encode(records: &[Record]) -> Vec<u8> {
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        for r in records {
            w.write(r).unwrap();
        }
        w.finish().unwrap().into_inner()
    }

    fn decode(bytes: &[u8]) -> Result<Vec<Record>, TraceError> {
        TraceReader::new(bytes)?.read_all()
    }

    #[test]
    fn round_trip_including_extremes_and_backwards_time() {
        let bytes = encode(&sample());
        assert_eq!(&bytes[0..8], b"FARMEMTR");
        assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 5);
        assert_eq!(decode(&bytes).unwrap(), sample());
    }

    #[test]
    fn sequential_scans_are_compact() {
        let recs: Vec<Record> = (0..1000u64)
            .map(|i| Record {
                time_ns: i * 1000,
                page: i,
                thread: 0,
                kind: AccessKind::Read,
            })
            .collect();
        let bytes = encode(&recs);
        // kind 1 + time delta 2 + page delta 1 + thread 1 = 5 bytes per record (4 for the
        // first, whose time delta is 0).
        assert_eq!(bytes.len(), HEADER_LEN + 4 + 5 * 999);
    }

    #[test]
    fn writer_can_start_mid_stream_and_drop_finishes() {
        let mut cur = Cursor::new(b"prefix".to_vec());
        cur.seek(SeekFrom::End(0)).unwrap();
        {
            let mut w = TraceWriter::new(&mut cur).unwrap();
            w.write(&sample()[0]).unwrap();
            assert_eq!(w.count(), 1);
        } // dropped without finish: header patched anyway
        let bytes = cur.into_inner();
        assert_eq!(&bytes[..6], b"prefix");
        assert_eq!(decode(&bytes[6..]).unwrap(), vec![sample()[0]]);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            let err = decode(&bytes[..len]).expect_err("a truncated trace must be rejected");
            match (len, &err) {
                (0..=31, TraceError::ShortHeader { len: l }) => assert_eq!(*l, len),
                (
                    32..,
                    TraceError::Truncated {
                        expected: 5, read, ..
                    },
                ) => assert!(*read < 5),
                _ => panic!("length {len}: unexpected error {err}"),
            }
        }
    }

    #[test]
    fn every_single_byte_corruption_of_the_records_is_rejected() {
        let bytes = encode(&sample());
        for i in HEADER_LEN..bytes.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= flip;
                assert!(decode(&b).is_err(), "byte {i} ^ {flip:#x} went unnoticed");
            }
        }
    }

    #[test]
    fn header_errors_say_what_is_wrong() {
        let good = encode(&sample());
        let mut b = good.clone();
        b[0..8].copy_from_slice(b"GIF89a\0\0");
        assert!(matches!(decode(&b), Err(TraceError::BadMagic { .. })));
        let mut b = good.clone();
        b[8] = 2;
        let e = decode(&b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "trace format version 2 is not supported: this farmem reads version 1; use the farmem that wrote it"
        );
        let mut b = good.clone();
        b[12] = 1;
        assert!(matches!(decode(&b), Err(TraceError::BadHeader(_))));
        let mut b = good.clone();
        b[10] = 40;
        assert!(matches!(decode(&b), Err(TraceError::BadHeader(_))));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(TraceError::Unfinished)));
        let mut b = good.clone();
        b[16..24].copy_from_slice(&4u64.to_le_bytes());
        assert!(matches!(
            decode(&b),
            Err(TraceError::TrailingBytes { records: 4, .. })
        ));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(
            decode(&b),
            Err(TraceError::TrailingBytes {
                records: 5,
                extra: 1
            })
        ));
        let mut b = good;
        b[24] ^= 1;
        assert!(matches!(decode(&b), Err(TraceError::Checksum { .. })));
    }

    #[test]
    fn record_encoding_errors() {
        // A bad kind byte.
        let mut b = encode(&sample()[..1]);
        b[HEADER_LEN] = 7;
        let e = decode(&b).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt trace: record 0: access kind byte is 7, expected 0 (read) or 1 (write)"
        );
        // An over-long varint (11 continuation bytes).
        let mut b = header(1, 0).to_vec();
        b.push(0);
        b.extend([0xff; 11]);
        assert!(matches!(
            decode(&b),
            Err(TraceError::Corrupt { index: 0, .. })
        ));
        // A thread id above u32::MAX.
        let mut b = header(1, 0).to_vec();
        let mut rec = vec![0u8, 0, 0];
        put_varint(&mut rec, 1 << 33);
        b.extend(&rec);
        let e = decode(&b).unwrap_err();
        assert!(e.to_string().contains("does not fit in 32 bits"), "{e}");
    }

    #[test]
    fn iterator_stops_after_an_error_and_writer_refuses_after_finish() {
        let bytes = encode(&sample());
        let items: Vec<_> = TraceReader::new(&bytes[..bytes.len() - 1])
            .unwrap()
            .collect();
        assert!(items.last().unwrap().is_err());
        assert_eq!(items.iter().filter(|r| r.is_ok()).count(), 4);
        let mut w = TraceWriter::new(Cursor::new(Vec::new())).unwrap();
        let _ = w.finish_inner().unwrap();
        assert!(matches!(w.write(&sample()[0]), Err(TraceError::Finished)));
    }

    #[test]
    fn random_bytes_after_a_valid_header_never_panic_and_never_pass() {
        let mut state = 42u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        };
        for case in 0..2000u64 {
            let count = case % 7 + 1;
            let mut b = header(count, 0x1234_5678).to_vec();
            let len = (case % 40) as usize;
            b.extend((0..len).map(|_| next()));
            assert!(decode(&b).is_err(), "case {case}: garbage accepted");
        }
    }
}
