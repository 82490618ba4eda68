//! The spool file's format: the header, the keyed frames of format 1, format 0's frames, and
//! the [`Record`]s they carry, encoded with bincode 2. This is the only module that uses
//! bincode; the format itself is described in the parent module's documentation.

use std::hash::Hasher;

use bytes::Bytes;
use rand::RngCore;
use siphasher::sip::SipHasher24;

use crate::error::{Error, ErrorKind, Result};

/// The first bytes of every format-1 and format-2 file.
pub(super) const MAGIC: &[u8; 8] = b"HOTSPOOL";
/// The format this version writes.
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The oldest headed format this version reads (format 0 has no header).
pub(crate) const OLDEST_HEADED_FORMAT: u32 = 1;
/// A queued copy's placement code in [`Record::EnqueuePlaced`]: named `K#i`.
pub(crate) const PLACED_SUFFIX: u8 = 0;
/// A queued copy's placement code in [`Record::EnqueuePlaced`]: named `K#i{t}` (`spread`).
pub(crate) const PLACED_SPREAD: u8 = 1;
/// The header's size: magic, version, reserved, key.
pub(crate) const HEADER_LEN: u64 = 32;
/// The frame header's size: length, head tag, body tag.
pub(super) const FRAME_HEADER_LEN: usize = 16;
/// Format 0's checksum size at the start of every frame body.
pub(super) const FORMAT0_CHECKSUM_LEN: usize = 8;
/// The largest payload either format can frame: its length field is a u32. Recovery bounds a
/// frame by this, never by today's `server.max_value_bytes`: a record acknowledged under a
/// larger limit is intact, and the keyed tags (not its length) tell an intact frame from
/// damage.
pub(crate) const MAX_FRAME: usize = u32::MAX as usize;

/// One spool record. Variants are encoded by position: a new one is only ever appended.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub(crate) enum Record {
    /// Failed copy writes of one edit were queued, each named `K#i` (formats 0 and 1; format 2
    /// writes [`Record::EnqueuePlaced`] instead, and keeps these when it rewrites an older
    /// file).
    Enqueue {
        /// The user key.
        key: String,
        /// The edit's version.
        version: u64,
        /// Whether the edit is a tombstone.
        tombstone: bool,
        /// The value (empty for a tombstone), held once for every queued copy.
        value: Vec<u8>,
        /// The queued copies: (copy index, absolute expiry in Unix milliseconds).
        copies: Vec<(u32, u64)>,
    },
    /// A copy no longer needs the entry of this version (it landed, or a newer one did).
    Complete {
        /// The copy's stored name, `K#i` or `K#i{t}`.
        copy_key: String,
        /// The version that is no longer pending (entries at or below it are done).
        version: u64,
        /// Whether the completed entry was a tombstone.
        tombstone: bool,
    },
    /// Failed copy writes of one edit were queued, each with the placement its name follows
    /// (format 2), so a spread copy is healed under its tagged name.
    EnqueuePlaced {
        /// The user key.
        key: String,
        /// The edit's version.
        version: u64,
        /// Whether the edit is a tombstone.
        tombstone: bool,
        /// The value (empty for a tombstone), held once for every queued copy.
        value: Vec<u8>,
        /// The queued copies: (copy index, absolute expiry in Unix milliseconds, placement
        /// code: [`PLACED_SUFFIX`] or [`PLACED_SPREAD`]).
        copies: Vec<(u32, u64, u8)>,
    },
}

/// The borrowed twin of [`Record::EnqueuePlaced`]: encodes to the same bytes without copying
/// the value. Its unit variants stand in for the positions of the owned enum's earlier ones.
#[derive(bincode::Encode)]
pub(super) enum RecordRef<'a> {
    /// Never encoded: the position of [`Record::Enqueue`].
    _Enqueue,
    /// Never encoded: the position of [`Record::Complete`].
    _Complete,
    EnqueuePlaced {
        key: &'a str,
        version: u64,
        tombstone: bool,
        value: &'a [u8],
        copies: &'a [(u32, u64, u8)],
    },
}

pub(super) fn encode_error(err: bincode::error::EncodeError) -> Error {
    Error::new(
        ErrorKind::Io,
        format!("cannot encode a spool record: {err}"),
    )
}

/// Encodes an enqueue record's payload (a [`Record::EnqueuePlaced`]) without copying `value`;
/// `copies` are (index, expiry, placement code).
pub(crate) fn encode_enqueue(
    key: &str,
    version: u64,
    tombstone: bool,
    value: &[u8],
    copies: &[(u32, u64, u8)],
) -> Result<Bytes> {
    let record = RecordRef::EnqueuePlaced {
        key,
        version,
        tombstone,
        value,
        copies,
    };
    bincode::encode_to_vec(record, bincode::config::standard())
        .map(Bytes::from)
        .map_err(encode_error)
}

/// Encodes any record's payload.
pub(crate) fn encode(record: &Record) -> Result<Bytes> {
    bincode::encode_to_vec(record, bincode::config::standard())
        .map(Bytes::from)
        .map_err(encode_error)
}

/// Decodes a whole payload as one record.
pub(super) fn decode_record(payload: &[u8]) -> Option<Record> {
    let (record, used) =
        bincode::decode_from_slice::<Record, _>(payload, bincode::config::standard()).ok()?;
    (used == payload.len()).then_some(record)
}

/// A spool file's secret: the key of its frame tags.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileKey(pub(super) [u8; 16]);

impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileKey(..)")
    }
}

impl FileKey {
    /// A fresh random key.
    pub(super) fn random() -> FileKey {
        let mut key = [0u8; 16];
        rand::rng().fill_bytes(&mut key);
        FileKey(key)
    }

    /// Keyed SipHash-2-4 (the `siphasher` crate: the same output as std's deprecated
    /// `SipHasher`, so every spool file an earlier release wrote still verifies).
    pub(super) fn hasher(&self) -> SipHasher24 {
        let (k0, k1) = self.0.split_at(8);
        let word = |bytes: &[u8]| {
            let mut word = [0u8; 8];
            word.copy_from_slice(bytes);
            u64::from_le_bytes(word)
        };
        SipHasher24::new_with_keys(word(k0), word(k1))
    }

    pub(super) fn head_tag(&self, len: u32) -> u32 {
        let mut hasher = self.hasher();
        hasher.write(b"H");
        hasher.write(&len.to_le_bytes());
        hasher.finish() as u32
    }

    pub(super) fn body_tag(&self, payload: &[u8]) -> u64 {
        let mut hasher = self.hasher();
        hasher.write(b"B");
        hasher.write(&(payload.len() as u32).to_le_bytes());
        hasher.write(payload);
        hasher.finish()
    }

    /// The 32-byte header of a file with this key, in the format this version writes.
    pub(super) fn header(&self) -> [u8; HEADER_LEN as usize] {
        self.header_of(FORMAT_VERSION)
    }

    /// The 32-byte header of a file with this key in format `version` (1 or 2).
    pub(super) fn header_of(&self, version: u32) -> [u8; HEADER_LEN as usize] {
        let mut header = [0u8; HEADER_LEN as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&version.to_le_bytes());
        header[16..].copy_from_slice(&self.0);
        header
    }

    /// Appends one frame holding `payload` to `out`.
    pub(crate) fn frame_into(&self, payload: &[u8], out: &mut Vec<u8>) {
        let len = payload.len() as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.head_tag(len).to_le_bytes());
        out.extend_from_slice(&self.body_tag(payload).to_le_bytes());
        out.extend_from_slice(payload);
    }
}

/// What recovery found wrong in a file.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Damage {
    /// Damaged stretches skipped (each held at least one record, or part of one).
    pub(crate) regions: u64,
    /// Bytes skipped in them.
    pub(crate) skipped_bytes: u64,
}

/// The records read from a file, and what was wrong with it.
#[derive(Debug, Default)]
pub(crate) struct Parsed {
    /// The format the file was written in (0, 1 or 2; [`FORMAT_VERSION`] for a new file).
    pub(crate) format: u32,
    /// The intact records, in order.
    pub(crate) records: Vec<Record>,
    /// Damaged stretches, if any.
    pub(crate) damage: Damage,
    /// Bytes of a torn final frame (a crash during an append).
    pub(crate) torn_bytes: u64,
    /// The file's key (formats 1 and 2).
    pub(super) key: Option<FileKey>,
}

/// Reads a whole spool file's bytes. Every intact frame is replayed, whatever its size (up to
/// [`MAX_FRAME`]).
///
/// # Errors
/// [`ErrorKind::Io`] when the header names a format this version does not read.
pub(crate) fn parse(raw: &[u8]) -> Result<Parsed> {
    if raw.is_empty() {
        return Ok(Parsed {
            format: FORMAT_VERSION,
            ..Parsed::default()
        });
    }
    if raw.len() >= MAGIC.len() && &raw[..MAGIC.len()] == MAGIC {
        if raw.len() < HEADER_LEN as usize {
            // A header torn while the file was created: nothing was ever acknowledged in it.
            return Ok(Parsed {
                format: FORMAT_VERSION,
                torn_bytes: raw.len() as u64,
                ..Parsed::default()
            });
        }
        let version = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
        if !(OLDEST_HEADED_FORMAT..=FORMAT_VERSION).contains(&version) {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "spool.log has format version {version}; this hotsplit reads formats 0 to {FORMAT_VERSION}: run the hotsplit that wrote it until its queue drains, or move the file away"
                ),
            ));
        }
        let mut key = [0u8; 16];
        key.copy_from_slice(&raw[16..32]);
        // Formats 1 and 2 frame records alike; format 2 adds a record variant.
        let mut parsed = parse_v1(raw, FileKey(key));
        parsed.format = version;
        return Ok(parsed);
    }
    Ok(parse_v0(raw))
}

/// What one format-1 frame at an offset is.
pub(super) enum FrameAt {
    /// An intact frame: its record and its total size.
    Intact(Record, usize),
    /// A frame whose head tag matches but whose payload runs past the end of the file.
    Torn,
    /// Anything else.
    Bad,
}

pub(super) fn frame_at(raw: &[u8], at: usize, key: FileKey) -> FrameAt {
    let Some(head) = raw.get(at..at + FRAME_HEADER_LEN) else {
        return FrameAt::Torn;
    };
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let head_tag = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len as usize > MAX_FRAME || key.head_tag(len) != head_tag {
        return FrameAt::Bad;
    }
    let start = at + FRAME_HEADER_LEN;
    let Some(payload) = start
        .checked_add(len as usize)
        .and_then(|end| raw.get(start..end))
    else {
        return FrameAt::Torn;
    };
    let mut body_tag = [0u8; 8];
    body_tag.copy_from_slice(&head[8..16]);
    if key.body_tag(payload) != u64::from_le_bytes(body_tag) {
        return FrameAt::Bad;
    }
    match decode_record(payload) {
        Some(record) => FrameAt::Intact(record, FRAME_HEADER_LEN + len as usize),
        None => FrameAt::Bad,
    }
}

pub(super) fn parse_v1(raw: &[u8], key: FileKey) -> Parsed {
    let mut parsed = Parsed {
        format: FORMAT_VERSION,
        key: Some(key),
        ..Parsed::default()
    };
    let mut at = HEADER_LEN as usize;
    // Where the damaged stretch being skipped began, if one is.
    let mut damaged_since: Option<usize> = None;
    while at < raw.len() {
        match frame_at(raw, at, key) {
            FrameAt::Intact(record, size) => {
                if let Some(since) = damaged_since.take() {
                    parsed.damage.regions += 1;
                    parsed.damage.skipped_bytes += (at - since) as u64;
                }
                parsed.records.push(record);
                at += size;
            }
            FrameAt::Torn if damaged_since.is_none() => {
                parsed.torn_bytes = (raw.len() - at) as u64;
                at = raw.len();
            }
            FrameAt::Torn | FrameAt::Bad => {
                damaged_since.get_or_insert(at);
                at += 1;
            }
        }
    }
    if let Some(since) = damaged_since {
        parsed.damage.regions += 1;
        parsed.damage.skipped_bytes += (raw.len() - since) as u64;
    }
    parsed
}

pub(super) fn parse_v0(raw: &[u8]) -> Parsed {
    let mut parsed = Parsed::default();
    let mut at = 0usize;
    while at < raw.len() {
        let Some(head) = raw.get(at..at + 4) else {
            parsed.torn_bytes = (raw.len() - at) as u64;
            break;
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let body = if len > MAX_FRAME {
            None
        } else {
            match (at + 4)
                .checked_add(len)
                .and_then(|end| raw.get(at + 4..end))
            {
                Some(body) => Some(body),
                None => {
                    parsed.torn_bytes = (raw.len() - at) as u64;
                    break;
                }
            }
        };
        let record = body
            .filter(|body| body.len() >= FORMAT0_CHECKSUM_LEN)
            .and_then(|body| {
                let (checksum, rest) = body.split_at(FORMAT0_CHECKSUM_LEN);
                let mut expected = [0u8; 8];
                expected.copy_from_slice(checksum);
                (xxhash_rust::xxh3::xxh3_64(rest) == u64::from_le_bytes(expected))
                    .then(|| decode_record(rest))
                    .flatten()
            });
        match record {
            Some(record) => {
                parsed.records.push(record);
                at += 4 + len;
            }
            None => {
                // An unkeyed checksum cannot tell a frame from a value that looks like one:
                // everything from here on is kept aside, not replayed.
                parsed.damage.regions = 1;
                parsed.damage.skipped_bytes = (raw.len() - at) as u64;
                break;
            }
        }
    }
    parsed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of the golden spool file, in order.
    fn golden_records() -> Vec<Record> {
        vec![
            Record::Enqueue {
                key: "post:9".to_owned(),
                version: 42,
                tombstone: false,
                value: b"a value written before the SipHash crate".to_vec(),
                copies: vec![(0, 4_102_444_800_000), (3, 4_102_444_800_123)],
            },
            Record::Enqueue {
                key: "gone".to_owned(),
                version: 18_446_744_073_709_551_615,
                tombstone: true,
                value: Vec::new(),
                copies: vec![(1, 4_102_444_800_000)],
            },
            Record::Complete {
                copy_key: "post:9#3".to_owned(),
                version: 42,
                tombstone: false,
            },
        ]
    }

    /// The golden file's key.
    const GOLDEN_KEY: FileKey = FileKey(*b"0123456789abcdef");

    fn golden_bytes() -> Vec<u8> {
        let mut out = GOLDEN_KEY.header_of(1).to_vec();
        for record in golden_records() {
            GOLDEN_KEY.frame_into(&encode(&record).unwrap(), &mut out);
        }
        out
    }

    /// The records of the format-2 golden file: a copy of a `spread` family (tagged name) and
    /// one of a `suffix` family, a format-1 enqueue kept by a rewrite, and a completion of the
    /// tagged copy.
    fn golden2_records() -> Vec<Record> {
        vec![
            Record::EnqueuePlaced {
                key: "split16:share".to_owned(),
                version: 42,
                tombstone: false,
                value: b"a value of a spread family".to_vec(),
                copies: vec![
                    (0, 4_102_444_800_000, PLACED_SUFFIX),
                    (5, 4_102_444_800_123, PLACED_SPREAD),
                ],
            },
            Record::EnqueuePlaced {
                key: "post:9".to_owned(),
                version: 7,
                tombstone: true,
                value: Vec::new(),
                copies: vec![(3, 4_102_444_800_000, PLACED_SUFFIX)],
            },
            Record::Enqueue {
                key: "gone".to_owned(),
                version: 18_446_744_073_709_551_615,
                tombstone: true,
                value: Vec::new(),
                copies: vec![(1, 4_102_444_800_000)],
            },
            Record::Complete {
                // The name `spread` gives copy 5 (`key::tests` checks the naming itself).
                copy_key: "split16:share#5{cg7}".to_owned(),
                version: 42,
                tombstone: false,
            },
        ]
    }

    fn golden2_bytes() -> Vec<u8> {
        let mut out = GOLDEN_KEY.header_of(2).to_vec();
        for record in golden2_records() {
            GOLDEN_KEY.frame_into(&encode(&record).unwrap(), &mut out);
        }
        out
    }

    /// `tests/fixtures/spool-format2.bin` was written by the first release with format 2: this
    /// build reads it whole and writes the same bytes.
    #[test]
    fn a_format_2_spool_file_reads_back_whole() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/spool-format2.bin"
        );
        let golden = std::fs::read(path).unwrap();
        let parsed = parse(&golden).unwrap();
        assert_eq!(parsed.format, 2);
        assert_eq!(parsed.records, golden2_records());
        assert_eq!(parsed.damage, Damage::default());
        assert_eq!(parsed.torn_bytes, 0);
        assert_eq!(golden2_bytes(), golden);
    }

    /// `tests/fixtures/spool-format1.bin` was written by the release before the SipHash and
    /// base64 crates replaced hotsplit's own code (21c9641): this build reads it whole and
    /// writes the same bytes, so no spool on disk changes format.
    #[test]
    fn a_spool_file_written_by_the_earlier_release_reads_back_whole() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/spool-format1.bin"
        );
        let golden = std::fs::read(path).unwrap();
        let parsed = parse(&golden).unwrap();
        assert_eq!(parsed.format, 1);
        assert_eq!(parsed.records, golden_records());
        assert_eq!(parsed.damage, Damage::default());
        assert_eq!(parsed.torn_bytes, 0);
        assert_eq!(golden_bytes(), golden);
    }
}
