//! The retry spool: an append-only file that makes accepted queue entries survive a crash.
//!
//! This is the only module that knows the on-disk format (and the only user of bincode).
//!
//! # Format
//! `spool.log` is a sequence of length-delimited frames (tokio-util's [`LengthDelimitedCodec`]:
//! a 4-byte big-endian length, then the frame). Each frame is an 8-byte little-endian xxh3-64
//! checksum of the rest, then one bincode 2 [`Record`] (standard config). A frame longer than
//! the cap, a checksum mismatch or a record that does not decode ends the valid prefix: the
//! tail after it is truncated with a warning, never a crash.
//!
//! # Durability
//! One writer thread owns the file. It takes every record waiting in its channel as one batch,
//! writes them, calls `fdatasync` once (group commit) and only then acknowledges the batch. A
//! publish answers `queued` only after its batch is acknowledged, so an acknowledged entry
//! survives a process crash *and* a power loss (as far as the disk honours `fdatasync`).
//! Completions are appended without waiting: losing one only repeats a harmless retry.
//!
//! Compaction writes the live entries to `spool.log.tmp`, fsyncs it, renames it over
//! `spool.log` and fsyncs the directory, so a crash at any point leaves either the old or the
//! new file. A `LOCK` file held with `flock` makes sure one process owns the directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

use crate::error::{Error, ErrorKind, Result};

/// The spool file's name inside the spool directory.
const LOG_FILE: &str = "spool.log";
/// The name a compacted file is written under before it is renamed.
const TMP_FILE: &str = "spool.log.tmp";
/// The lock file's name.
const LOCK_FILE: &str = "LOCK";
/// The checksum's size at the start of every frame.
const CHECKSUM_LEN: usize = 8;
/// The most commands one group commit takes from the channel.
const MAX_BATCH: usize = 8192;

/// One spool record.
#[derive(Debug, Clone, PartialEq, Eq, bincode::Encode, bincode::Decode)]
pub(crate) enum Record {
    /// Failed copy writes of one edit were queued.
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
        /// The copy key, `K#i`.
        copy_key: String,
        /// The version that is no longer pending (entries at or below it are done).
        version: u64,
        /// Whether the completed entry was a tombstone.
        tombstone: bool,
    },
}

/// The borrowed twin of [`Record::Enqueue`]: encodes to the same bytes without copying the value.
#[derive(bincode::Encode)]
enum RecordRef<'a> {
    Enqueue {
        key: &'a str,
        version: u64,
        tombstone: bool,
        value: &'a [u8],
        copies: &'a [(u32, u64)],
    },
}

/// Encodes one frame body (checksum + record) ready for the length-delimited codec.
fn frame_body(encoded: Vec<u8>) -> Bytes {
    let mut body = BytesMut::with_capacity(CHECKSUM_LEN + encoded.len());
    body.put_u64_le(xxhash_rust::xxh3::xxh3_64(&encoded));
    body.put_slice(&encoded);
    body.freeze()
}

/// Encodes an enqueue record without copying `value`.
pub(crate) fn encode_enqueue(
    key: &str,
    version: u64,
    tombstone: bool,
    value: &[u8],
    copies: &[(u32, u64)],
) -> Result<Bytes> {
    let record = RecordRef::Enqueue {
        key,
        version,
        tombstone,
        value,
        copies,
    };
    bincode::encode_to_vec(record, bincode::config::standard())
        .map(frame_body)
        .map_err(|err| {
            Error::new(
                ErrorKind::Io,
                format!("cannot encode a spool record: {err}"),
            )
        })
}

/// Encodes any record.
pub(crate) fn encode(record: &Record) -> Result<Bytes> {
    bincode::encode_to_vec(record, bincode::config::standard())
        .map(frame_body)
        .map_err(|err| {
            Error::new(
                ErrorKind::Io,
                format!("cannot encode a spool record: {err}"),
            )
        })
}

/// Decodes one frame body; `None` when the checksum or the record is wrong.
fn decode_body(mut body: BytesMut) -> Option<Record> {
    if body.len() < CHECKSUM_LEN {
        return None;
    }
    let checksum = body.get_u64_le();
    if xxhash_rust::xxh3::xxh3_64(&body) != checksum {
        return None;
    }
    let (record, used) =
        bincode::decode_from_slice::<Record, _>(&body, bincode::config::standard()).ok()?;
    (used == body.len()).then_some(record)
}

/// A command for the writer thread.
enum Command {
    /// Append a frame body; acknowledge after the batch's fsync when `ack` is set.
    Append {
        body: Bytes,
        ack: Option<oneshot::Sender<std::result::Result<(), String>>>,
    },
    /// Replace the file with exactly these frame bodies (the live entries).
    Compact { bodies: Vec<Bytes> },
    /// Sync, release the lock and stop; acknowledged once the lock is released.
    Close { ack: oneshot::Sender<()> },
}

/// A handle to the spool's writer thread. Dropping every handle lets the thread finish its
/// last batch, release the lock and exit.
#[derive(Debug, Clone)]
pub struct Spool {
    /// The writer thread's channel.
    commands: mpsc::UnboundedSender<Command>,
    /// The spool file's size in bytes, kept by the writer.
    size: Arc<AtomicU64>,
    /// The directory, for messages.
    dir: PathBuf,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Append { body, .. } => write!(f, "Append({} bytes)", body.len()),
            Command::Compact { bodies } => write!(f, "Compact({} records)", bodies.len()),
            Command::Close { .. } => f.write_str("Close"),
        }
    }
}

/// What [`Spool::open`] found in an existing spool.
#[derive(Debug)]
pub(crate) struct Replay {
    /// The valid records, in order.
    pub(crate) records: Vec<Record>,
    /// Bytes cut from a torn or corrupt tail.
    pub(crate) truncated_bytes: u64,
}

impl Spool {
    /// Opens (creating it if needed) the spool in `dir`, takes its lock, reads every valid
    /// record, truncates a torn or corrupt tail (with a warning) and starts the writer thread.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the directory cannot be created or read, or when another process
    /// holds the lock (the message says so).
    pub(crate) fn open(dir: &Path, max_frame: usize) -> Result<(Spool, Replay)> {
        let io_error = |what: &str, err: io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("spool {}: {what}: {err}", dir.display()),
            )
        };
        std::fs::create_dir_all(dir).map_err(|err| io_error("cannot create the directory", err))?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(LOCK_FILE))
            .map_err(|err| io_error("cannot open the lock file", err))?;
        // An exclusive, non-blocking lock (flock on Linux), held as long as `lock` lives.
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "spool {} is locked by another process (heal.spool_dir must not be shared)",
                        dir.display()
                    ),
                ))
            }
            Err(TryLockError::Error(err)) => {
                return Err(io_error("cannot lock the lock file", err))
            }
        }

        let path = dir.join(LOG_FILE);
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|err| io_error("cannot open spool.log", err))?;
        let mut raw = Vec::new();
        file.read_to_end(&mut raw)
            .map_err(|err| io_error("cannot read spool.log", err))?;
        let total = raw.len() as u64;
        let mut buffer = BytesMut::from(&raw[..]);
        drop(raw);
        let mut decoder = codec(max_frame);
        let mut records = Vec::new();
        let mut valid = 0u64;
        loop {
            let before = buffer.len();
            match decoder.decode(&mut buffer) {
                Ok(Some(body)) => match decode_body(body) {
                    Some(record) => {
                        records.push(record);
                        valid += (before - buffer.len()) as u64;
                    }
                    None => break,
                },
                Ok(None) | Err(_) => break,
            }
        }
        let truncated_bytes = total - valid;
        if truncated_bytes > 0 {
            tracing::warn!(spool = %path.display(), valid_bytes = valid, truncated_bytes, records = records.len(), "the spool has a torn or corrupt tail: truncating it");
            file.set_len(valid)
                .and_then(|()| file.sync_all())
                .map_err(|err| io_error("cannot truncate spool.log", err))?;
        }
        file.seek(SeekFrom::End(0))
            .map_err(|err| io_error("cannot seek spool.log", err))?;

        let size = Arc::new(AtomicU64::new(valid));
        let (commands, receiver) = mpsc::unbounded_channel();
        let writer = Writer {
            dir: dir.to_owned(),
            file,
            codec: codec(max_frame),
            size: size.clone(),
            _lock: lock,
        };
        std::thread::Builder::new()
            .name("hotsplit-spool".into())
            .spawn(move || writer.run(receiver))
            .map_err(|err| io_error("cannot start the writer thread", err))?;
        Ok((
            Spool {
                commands,
                size,
                dir: dir.to_owned(),
            },
            Replay {
                records,
                truncated_bytes,
            },
        ))
    }

    /// Appends a frame body; the returned receiver resolves after the batch holding it was
    /// fsynced (or with the error that prevented it).
    pub(crate) fn append_durable(
        &self,
        body: Bytes,
    ) -> oneshot::Receiver<std::result::Result<(), String>> {
        let (ack, done) = oneshot::channel();
        if let Err(mpsc::error::SendError(Command::Append { ack: Some(ack), .. })) =
            self.commands.send(Command::Append {
                body,
                ack: Some(ack),
            })
        {
            let _ = ack.send(Err("the spool writer has stopped".into()));
        }
        done
    }

    /// Appends a frame body without waiting for it to reach the disk.
    pub(crate) fn append(&self, body: Bytes) {
        if self
            .commands
            .send(Command::Append { body, ack: None })
            .is_err()
        {
            tracing::warn!(spool = %self.dir.display(), "the spool writer has stopped; a completion was not recorded");
        }
    }

    /// Replaces the file with these frame bodies, after every record sent before.
    pub(crate) fn compact(&self, bodies: Vec<Bytes>) {
        let _ = self.commands.send(Command::Compact { bodies });
    }

    /// Writes everything sent before, syncs, releases the directory's lock and stops the
    /// writer; later appends fail. Resolves once the lock is released.
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.commands.send(Command::Close { ack }).is_ok() {
            let _ = done.await;
        }
    }

    /// The spool file's size in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }
}

fn codec(max_frame: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(max_frame)
        .new_codec()
}

/// The writer thread's state.
struct Writer {
    /// The spool directory.
    dir: PathBuf,
    /// `spool.log`, positioned at its end.
    file: File,
    /// The framing.
    codec: LengthDelimitedCodec,
    /// The file's size, shared with [`Spool::size_bytes`].
    size: Arc<AtomicU64>,
    /// The locked lock file; held until the thread exits.
    _lock: File,
}

impl Writer {
    fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Command>) {
        let mut batch = Vec::new();
        while let Some(first) = receiver.blocking_recv() {
            batch.clear();
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(command) => batch.push(command),
                    Err(_) => break,
                }
            }
            let mut acks = Vec::new();
            let mut buffer = BytesMut::new();
            let mut failure: Option<String> = None;
            let mut close: Option<oneshot::Sender<()>> = None;
            for command in batch.drain(..) {
                if close.is_some() {
                    // Commands after a close are refused: their acks are dropped unanswered.
                    continue;
                }
                match command {
                    Command::Append { body, ack } => {
                        if let Err(err) = self.codec.encode(body, &mut buffer) {
                            if let Some(ack) = ack {
                                let _ = ack.send(Err(format!("record too large: {err}")));
                            }
                            continue;
                        }
                        acks.extend(ack);
                    }
                    Command::Close { ack } => close = Some(ack),
                    Command::Compact { bodies } => {
                        if let Err(err) = self.write_all(&buffer) {
                            failure = Some(err.to_string());
                        }
                        buffer.clear();
                        if let Err(err) = self.compact(bodies) {
                            tracing::warn!(spool = %self.dir.display(), error = %err, "spool compaction failed; appending to the old file");
                        }
                    }
                }
            }
            if failure.is_none() {
                if let Err(err) = self.write_all(&buffer).and_then(|()| self.file.sync_data()) {
                    failure = Some(err.to_string());
                }
            }
            if let Some(err) = &failure {
                tracing::error!(spool = %self.dir.display(), error = %err, "spool write failed");
            }
            for ack in acks {
                let _ = ack.send(match &failure {
                    None => Ok(()),
                    Some(err) => Err(format!("spool write failed: {err}")),
                });
            }
            if let Some(ack) = close {
                receiver.close();
                // Dropping the writer closes the file and releases the lock before the ack.
                drop(self);
                let _ = ack.send(());
                return;
            }
        }
        if let Err(err) = self.file.sync_data() {
            tracing::warn!(spool = %self.dir.display(), error = %err, "final spool sync failed");
        }
    }

    fn write_all(&mut self, buffer: &[u8]) -> io::Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        self.file.write_all(buffer)?;
        self.size.fetch_add(buffer.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `bodies` to a new file, fsyncs it, renames it over the log and fsyncs the directory.
    fn compact(&mut self, bodies: Vec<Bytes>) -> io::Result<()> {
        let tmp = self.dir.join(TMP_FILE);
        let mut buffer = BytesMut::new();
        for body in bodies {
            self.codec
                .encode(body, &mut buffer)
                .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err.to_string()))?;
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .read(true)
            .open(&tmp)?;
        file.write_all(&buffer)?;
        file.sync_all()?;
        std::fs::rename(&tmp, self.dir.join(LOG_FILE))?;
        File::open(&self.dir)?.sync_all()?;
        file.seek(SeekFrom::End(0))?;
        self.file = file;
        self.size.store(buffer.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enqueue(n: u64) -> Record {
        Record::Enqueue {
            key: format!("k:{n}"),
            version: n,
            tombstone: false,
            value: vec![b'x'; 10],
            copies: vec![(0, 1_000), (3, 2_000)],
        }
    }

    async fn write(spool: &Spool, record: &Record) {
        spool
            .append_durable(encode(record).unwrap())
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn records_replay_and_the_borrowed_encoding_matches() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, replay) = Spool::open(dir.path(), 1 << 20).unwrap();
            assert!(replay.records.is_empty());
            write(&spool, &enqueue(1)).await;
            let borrowed =
                encode_enqueue("k:2", 2, false, &[b'x'; 10], &[(0, 1_000), (3, 2_000)]).unwrap();
            assert_eq!(borrowed, encode(&enqueue(2)).unwrap());
            spool.append_durable(borrowed).await.unwrap().unwrap();
            let complete = Record::Complete {
                copy_key: "k:1#0".into(),
                version: 1,
                tombstone: false,
            };
            write(&spool, &complete).await;
        }
        // The writer thread releases the lock when it exits; reopen until it has.
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records.len(), 3);
        assert_eq!(replay.records[1], enqueue(2));
        assert_eq!(replay.truncated_bytes, 0);
    }

    async fn reopen(dir: &Path) -> Replay {
        for _ in 0..200 {
            if let Ok((_, replay)) = Spool::open(dir, 1 << 20) {
                return replay;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        panic!("the spool stayed locked");
    }

    #[tokio::test]
    async fn a_torn_or_garbage_tail_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            write(&spool, &enqueue(1)).await;
            write(&spool, &enqueue(2)).await;
        }
        let path = dir.path().join(LOG_FILE);
        let good = std::fs::metadata(&path).unwrap().len();
        for tail in [
            &[0u8, 0, 0, 40, 1, 2, 3][..],            // a torn frame
            &[0xff, 0xff, 0xff, 0xff, 9, 9][..],      // a length above the cap
            &[0, 0, 0, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9], // a checksum mismatch
        ] {
            let mut file = OpenOptions::new().append(true).open(&path).unwrap();
            file.write_all(tail).unwrap();
            drop(file);
            let replay = reopen(dir.path()).await;
            assert_eq!(replay.records.len(), 2);
            assert_eq!(replay.truncated_bytes, tail.len() as u64);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
        }
    }

    #[tokio::test]
    async fn a_second_owner_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
        let err = Spool::open(dir.path(), 1 << 20).unwrap_err();
        assert!(err.message().contains("locked by another process"), "{err}");
    }

    #[tokio::test]
    async fn compaction_replaces_the_file_atomically() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20).unwrap();
            for n in 1..=10 {
                write(&spool, &enqueue(n)).await;
            }
            spool.compact(vec![encode(&enqueue(10)).unwrap()]);
            write(&spool, &enqueue(11)).await;
            assert!(spool.size_bytes() > 0);
        }
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records, vec![enqueue(10), enqueue(11)]);
        assert!(!dir.path().join(TMP_FILE).exists());
    }
}
