//! The retry spool: an append-only file that makes accepted queue entries survive a crash.
//!
//! This is the only module that knows the on-disk format; its child `format` holds the frames
//! and records (and is the only user of bincode).
//!
//! # Format 2 (written by this version)
//! Format 1's header and frames, with the version field `2`, and one more record:
//! [`Record::EnqueuePlaced`] keeps, for each queued copy, its index, its expiry and the
//! placement its name follows (`0`: `K#i`, `1`: `K#i{t}`, see [`crate::placement`]), so a copy of
//! a `spread` family is healed under its tagged name after a restart and by `spool drain`.
//! Enqueues are written as `EnqueuePlaced` only; the `Enqueue` records of an older file (which
//! mean `K#i`) are kept as they are when the file is rewritten. Format 1 and 0 files are read and
//! rewritten as format 2; a release that reads only format 1 refuses a format-2 file with an
//! error that names its version (so it never heals a tagged copy under an untagged name).
//!
//! # Format 1 (written before format 2)
//! `spool.log` starts with a 32-byte header: the magic `HOTSPOOL`, the format version (u32
//! little-endian, `1`), four reserved zero bytes and a 16-byte key drawn at random when the
//! file is created. Frames follow, each a 16-byte frame header and a payload:
//!
//! | bytes | field |
//! |-------|-------|
//! | 4 | payload length, u32 little-endian |
//! | 4 | head tag: the low 32 bits of SipHash-2-4(key, `H` ‖ length) |
//! | 8 | body tag: SipHash-2-4(key, `B` ‖ length ‖ payload) |
//! | n | one bincode 2 [`Record`] (standard config) |
//!
//! Recovery reads frames in order. A frame whose tags do not match or whose payload does not
//! decode is damage (its length is bounded only by the format's own u32, never by today's
//! `server.max_value_bytes`: a record acknowledged under a larger limit is replayed): recovery then looks for the next frame at
//! every later byte offset, and accepts one only when both tags match. The tags are keyed by
//! the file's secret key, so a published value that contains bytes shaped like a frame (made
//! with any other key, or with no key) is never taken for one: forging a frame means guessing
//! a 64-bit SipHash of an unknown 128-bit key. The cheap head tag keeps that scan linear.
//! A frame whose head tag matches but whose payload runs past the end of the file is a torn
//! tail (a crash during an append): it was never acknowledged and is dropped without comment.
//!
//! A file with damage is kept aside, hard-linked as `spool.log.damaged-<unix ms>`, and the
//! intact records are rewritten into a fresh file that replaces `spool.log` atomically; nothing
//! is ever cut in place. The damaged stretches are logged and counted
//! (`hotsplit_spool_damaged_regions_total`, `hotsplit_spool_skipped_bytes_total`).
//!
//! # Format 0 (written before format 1)
//! A file that does not start with the magic is format 0: length-delimited frames (a 4-byte
//! big-endian length), each an unkeyed xxh3-64 checksum and the same bincode record. It is
//! replayed up to its first bad frame (an unkeyed checksum cannot resynchronise safely: the
//! rest is kept aside as damage) and rewritten as format 2. A header with an unknown version
//! stops startup with an error that says so; the file is left untouched.
//!
//! # Durability
//! One writer thread owns the file. It takes every record waiting in its channel as one batch,
//! writes them, calls `fdatasync` once (group commit) and only then reports the batch done to
//! each record's callback. A failed write or sync rolls the file back to the end of the last
//! good batch (`set_len`), so no partial frame is ever followed by later frames. Completions
//! are appended without waiting: losing one only repeats a harmless retry.
//!
//! Compaction writes the live entries to `spool.log.tmp` (removed again if anything fails),
//! fsyncs it, renames it over `spool.log` and fsyncs the directory, so a crash at any point
//! leaves either the old or the new file. A reset (the queue drained) truncates the file to
//! its header in place, which needs no free space. A `LOCK` file held with `File::try_lock`
//! (`flock` on Linux) makes sure one process owns the directory.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;

use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, ErrorKind, Result};

mod format;

use format::*;
pub(crate) use format::{
    encode, encode_enqueue, parse, Damage, FileKey, Record, FORMAT_VERSION, HEADER_LEN,
    PLACED_SPREAD, PLACED_SUFFIX,
};

/// The spool file's name inside the spool directory.
const LOG_FILE: &str = "spool.log";
/// The name a compacted file is written under before it is renamed.
const TMP_FILE: &str = "spool.log.tmp";
/// The lock file's name.
const LOCK_FILE: &str = "LOCK";
/// The most commands one group commit takes from the channel.
const MAX_BATCH: usize = 8192;

/// Reports the end of one durable append: `Ok` once its batch is synced, or the error that
/// prevented it. Called on the writer thread.
pub(crate) type Done = Box<dyn FnOnce(std::result::Result<(), String>) + Send>;

/// A command for the writer thread.
enum Command {
    /// Append a record's payload; call `done` after the batch's sync when set.
    Append { payload: Bytes, done: Option<Done> },
    /// Replace the file with exactly these payloads (the live entries).
    Compact { payloads: Vec<Bytes> },
    /// The queue drained: truncate the file to its header in place.
    Reset,
    /// Sync, release the lock and stop; acknowledged once the lock is released.
    Close { ack: oneshot::Sender<()> },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Append { payload, .. } => write!(f, "Append({} bytes)", payload.len()),
            Command::Compact { payloads } => write!(f, "Compact({} records)", payloads.len()),
            Command::Reset => f.write_str("Reset"),
            Command::Close { .. } => f.write_str("Close"),
        }
    }
}

/// Whether another process holds the lock of the spool in `dir` now (a live instance owns
/// it). A directory without a lock file is not locked. The answer can change at once; opening
/// the spool takes the lock for real.
pub fn locked_by_another_process(dir: &Path) -> bool {
    match File::open(dir.join(LOCK_FILE)) {
        Ok(lock) => matches!(lock.try_lock(), Err(TryLockError::WouldBlock)),
        Err(_) => false,
    }
}

/// Whether `dir` holds a spool file.
pub fn exists(dir: &Path) -> bool {
    dir.join(LOG_FILE).is_file()
}

/// A handle to the spool's writer thread. Dropping every handle lets the thread finish its
/// last batch, release the lock and exit.
#[derive(Debug, Clone)]
pub struct Spool {
    /// The writer thread's channel.
    commands: mpsc::UnboundedSender<Command>,
    /// The spool file's size in bytes (the end of its last good batch), kept by the writer.
    size: Arc<AtomicU64>,
    /// The group commits' syncs, counted by the writer (`hotsplit_spool_syncs_total`); read
    /// by tests.
    #[cfg(test)]
    syncs: Counter,
    /// The directory, for messages.
    dir: PathBuf,
}

/// What [`Spool::open`] found in an existing spool.
#[derive(Debug)]
pub(crate) struct Replay {
    /// The intact records, in order.
    pub(crate) records: Vec<Record>,
    /// The format the file was in.
    pub(crate) format: u32,
    /// Damaged stretches skipped.
    pub(crate) damage: Damage,
    /// Where the damaged file was kept, if it was damaged.
    pub(crate) kept_aside: Option<PathBuf>,
    /// Bytes of a torn final frame, dropped.
    pub(crate) torn_bytes: u64,
}

/// A test's hold on the writer: each batch waits for a [`Gate`] before it is written. The
/// channel is a rendezvous: a send returns once the writer has formed the batch it applies to.
#[cfg(test)]
pub(crate) type GateSender = std::sync::mpsc::SyncSender<Gate>;

/// What a held writer does with its next batch.
#[cfg(test)]
pub(crate) enum Gate {
    /// Write and sync it.
    Go,
    /// Stop at once, as a killed process would: nothing of the batch is written.
    Crash,
}

/// Creates `dir` and takes its lock file's exclusive, non-blocking lock (flock on Linux), held
/// as long as the returned file lives.
///
/// # Errors
/// [`ErrorKind::Io`] naming the directory when it cannot be made or locked, or another process
/// holds the lock.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
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
    // An exclusive, non-blocking lock (flock on Linux), held as long as `lock` lives. A lock
    // found held is tried again for a moment: a previous owner may be closing it (a restart),
    // and a child process forked anywhere in the process while the lock was open holds a copy
    // of its descriptor until it execs (Rust opens files close-on-exec).
    let waited_until = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match lock.try_lock() {
            Ok(()) => return Ok(lock),
            Err(TryLockError::WouldBlock) if std::time::Instant::now() < waited_until => {
                std::thread::sleep(LOCK_RETRY);
            }
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
    }
}

/// How long opening a spool tries a held lock again before it says another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// How long it waits between tries.
const LOCK_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

impl Spool {
    /// Opens (creating it if needed) the spool in `dir`, takes its lock, reads every intact
    /// record, and starts the writer thread. A damaged, torn or format-0 file is first
    /// rewritten (atomically) as a clean format-1 file of its intact records; a damaged one
    /// is kept aside as `spool.log.damaged-<unix ms>`. Every sync of a batch of appends (a
    /// group commit) is counted in `syncs`.
    ///
    /// # Errors
    /// [`ErrorKind::Io`] when the directory cannot be created or read, when another process
    /// holds the lock (still held after 2 s of tries; the message says so), when the file has an unknown format version, or
    /// when a damaged file cannot be rewritten.
    pub(crate) fn open(dir: &Path, max_frame: usize, syncs: Counter) -> Result<(Spool, Replay)> {
        Self::open_with(dir, max_frame, syncs, None)
    }

    /// [`Spool::open`] with a writer that waits for the test's word before each batch.
    #[cfg(test)]
    pub(crate) fn open_held(dir: &Path, max_frame: usize) -> Result<(Spool, Replay, GateSender)> {
        let (gate, held) = std::sync::mpsc::sync_channel(0);
        let (spool, replay) = Self::open_with(dir, max_frame, Counter::default(), Some(held))?;
        Ok((spool, replay, gate))
    }

    fn open_with(
        dir: &Path,
        max_frame: usize,
        syncs: Counter,
        #[cfg(test)] gate: Option<std::sync::mpsc::Receiver<Gate>>,
        #[cfg(not(test))] _gate: Option<std::convert::Infallible>,
    ) -> Result<(Spool, Replay)> {
        let io_error = |what: &str, err: io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("spool {}: {what}: {err}", dir.display()),
            )
        };
        let lock = lock_dir(dir)?;
        // A compaction interrupted by a crash leaves its temporary file behind.
        let _ = std::fs::remove_file(dir.join(TMP_FILE));

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
        let parsed = parse(&raw)?;
        drop(raw);
        let damaged = parsed.damage != Damage::default();
        let mut kept_aside = None;
        let (file, key, size) = match parsed.key {
            Some(key) if !damaged && parsed.torn_bytes == 0 => {
                let size = file
                    .seek(SeekFrom::End(0))
                    .map_err(|err| io_error("cannot seek spool.log", err))?;
                (file, key, size)
            }
            _ => {
                if damaged {
                    let aside = dir.join(format!(
                        "{LOG_FILE}.damaged-{}",
                        crate::store::now_unix_ms()
                    ));
                    std::fs::hard_link(&path, &aside)
                        .map_err(|err| io_error("cannot keep the damaged spool.log aside", err))?;
                    tracing::error!(spool = %path.display(), kept_aside = %aside.display(), format = parsed.format, regions = parsed.damage.regions, skipped_bytes = parsed.damage.skipped_bytes, records = parsed.records.len(), "the spool is damaged: replaying every intact record; the damaged file is kept aside");
                    kept_aside = Some(aside);
                } else if parsed.torn_bytes > 0 {
                    tracing::warn!(spool = %path.display(), torn_bytes = parsed.torn_bytes, records = parsed.records.len(), "the spool ends in a torn frame (a crash during an append); dropping it");
                }
                if parsed.format != FORMAT_VERSION {
                    tracing::info!(spool = %path.display(), from = parsed.format, to = FORMAT_VERSION, records = parsed.records.len(), "upgrading the spool's format");
                }
                let key = FileKey::random();
                let mut payloads = Vec::with_capacity(parsed.records.len());
                for record in &parsed.records {
                    payloads.push(encode(record)?);
                }
                let (file, size) = write_fresh(dir, key, &payloads)
                    .map_err(|err| io_error("cannot rewrite spool.log", err))?;
                (file, key, size)
            }
        };

        let size = Arc::new(AtomicU64::new(size));
        let (commands, receiver) = mpsc::unbounded_channel();
        let writer = Writer {
            dir: dir.to_owned(),
            file,
            key,
            max_frame,
            size: size.clone(),
            #[cfg(test)]
            syncs: syncs.clone(),
            #[cfg(not(test))]
            syncs,
            dirty: false,
            _lock: lock,
            #[cfg(test)]
            gate,
        };
        std::thread::Builder::new()
            .name("hotsplit-spool".into())
            .spawn(move || writer.run(receiver))
            .map_err(|err| io_error("cannot start the writer thread", err))?;
        Ok((
            Spool {
                commands,
                size,
                #[cfg(test)]
                syncs,
                dir: dir.to_owned(),
            },
            Replay {
                records: parsed.records,
                format: parsed.format,
                damage: parsed.damage,
                kept_aside,
                torn_bytes: parsed.torn_bytes,
            },
        ))
    }

    /// Appends a record's payload; `done` is called on the writer thread once the batch holding
    /// it was synced (or with the error that prevented it).
    ///
    /// # Errors
    /// Gives `done` back, uncalled, when the writer has stopped.
    pub(crate) fn append_durable(
        &self,
        payload: Bytes,
        done: Done,
    ) -> std::result::Result<(), Done> {
        match self.commands.send(Command::Append {
            payload,
            done: Some(done),
        }) {
            Ok(()) => Ok(()),
            Err(mpsc::error::SendError(Command::Append {
                done: Some(done), ..
            })) => Err(done),
            // The channel gives back the command it was given.
            Err(_) => Ok(()),
        }
    }

    /// Appends a record's payload without waiting for it to reach the disk.
    pub(crate) fn append(&self, payload: Bytes) {
        if self
            .commands
            .send(Command::Append {
                payload,
                done: None,
            })
            .is_err()
        {
            tracing::warn!(spool = %self.dir.display(), "the spool writer has stopped; a completion was not recorded");
        }
    }

    /// Replaces the file with these payloads, after every record sent before.
    pub(crate) fn compact(&self, payloads: Vec<Bytes>) {
        let _ = self.commands.send(Command::Compact { payloads });
    }

    /// Truncates the file to its header in place, after every record sent before: the queue
    /// holds nothing (needs no free space, unlike a compaction).
    pub(crate) fn reset(&self) {
        let _ = self.commands.send(Command::Reset);
    }

    /// Writes everything sent before, syncs, releases the directory's lock and stops the
    /// writer; later appends fail. Resolves once the lock is released.
    pub(crate) async fn close(&self) {
        let (ack, done) = oneshot::channel();
        if self.commands.send(Command::Close { ack }).is_ok() {
            let _ = done.await;
        }
    }

    /// The shared size counter behind [`Spool::size_bytes`], for a gauge.
    pub(crate) fn size_handle(&self) -> Arc<AtomicU64> {
        self.size.clone()
    }

    /// The spool file's size in bytes: the end of its last good batch.
    pub fn size_bytes(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    /// How many batches of appends were synced so far (one `fdatasync` each).
    #[cfg(test)]
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.get()
    }
}

/// Writes a new format-1 file holding `payloads` as `spool.log.tmp`, syncs it, renames it over
/// `spool.log` and syncs the directory; returns it positioned at its end, with its size. The
/// temporary file is removed when any step fails.
fn write_fresh(dir: &Path, key: FileKey, payloads: &[Bytes]) -> io::Result<(File, u64)> {
    let tmp = dir.join(TMP_FILE);
    let written = (|| {
        let mut buffer = Vec::with_capacity(
            HEADER_LEN as usize
                + payloads
                    .iter()
                    .map(|payload| payload.len() + FRAME_HEADER_LEN)
                    .sum::<usize>(),
        );
        buffer.extend_from_slice(&key.header());
        for payload in payloads {
            key.frame_into(payload, &mut buffer);
        }
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .read(true)
            .open(&tmp)?;
        file.write_all(&buffer)?;
        file.sync_all()?;
        std::fs::rename(&tmp, dir.join(LOG_FILE))?;
        File::open(dir)?.sync_all()?;
        let size = file.seek(SeekFrom::End(0))?;
        Ok((file, size))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The writer thread's state.
struct Writer {
    /// The spool directory.
    dir: PathBuf,
    /// `spool.log` (format 1), positioned at `size`.
    file: File,
    /// The file's key.
    key: FileKey,
    /// The largest payload an append may write (from `server.max_value_bytes`); recovery reads
    /// any intact frame, whatever this is.
    max_frame: usize,
    /// The end of the last good batch, shared with [`Spool::size_bytes`].
    size: Arc<AtomicU64>,
    /// Counts each batch synced, shared with [`Spool::syncs`].
    syncs: Counter,
    /// Whether a rollback failed, so the file may hold bytes past `size` that the next write
    /// must cut first.
    dirty: bool,
    /// The locked lock file; held until the thread exits.
    _lock: File,
    /// A test's hold on each batch.
    #[cfg(test)]
    gate: Option<std::sync::mpsc::Receiver<Gate>>,
}

/// Frames gathered for one write, with the callbacks waiting for it.
#[derive(Default)]
struct Pending {
    /// The framed bytes.
    buffer: Vec<u8>,
    /// The callbacks of the durable appends among them.
    dones: Vec<Done>,
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
            #[cfg(test)]
            if let Some(gate) = &self.gate {
                if !matches!(gate.recv(), Ok(Gate::Go)) {
                    // A simulated crash: nothing of this batch reaches the file, and no
                    // callback is called (a killed process answers nobody).
                    drop(batch);
                    return;
                }
            }
            let mut pending = Pending::default();
            let mut close: Option<oneshot::Sender<()>> = None;
            for command in batch.drain(..) {
                if close.is_some() {
                    // Commands after a close are refused.
                    if let Command::Append {
                        done: Some(done), ..
                    } = command
                    {
                        done(Err("the spool is closed".into()));
                    }
                    continue;
                }
                match command {
                    Command::Append { payload, done } => {
                        if payload.len() > self.max_frame {
                            if let Some(done) = done {
                                done(Err(format!(
                                    "record too large: {} bytes, at most {}",
                                    payload.len(),
                                    self.max_frame
                                )));
                            }
                            continue;
                        }
                        self.key.frame_into(&payload, &mut pending.buffer);
                        pending.dones.extend(done);
                    }
                    Command::Close { ack } => close = Some(ack),
                    Command::Compact { payloads } => {
                        self.flush(std::mem::take(&mut pending));
                        self.compact(&payloads);
                    }
                    Command::Reset => {
                        self.flush(std::mem::take(&mut pending));
                        self.reset();
                    }
                }
            }
            self.flush(pending);
            if let Some(ack) = close {
                receiver.close();
                // Dropping the writer closes the file and releases the lock before the ack.
                drop(self);
                let _ = ack.send(());
                return;
            }
        }
    }

    /// Writes and syncs `pending` at the end of the last good batch, then tells its callbacks.
    /// On failure the file is cut back to that end, so no partial frame is left for later
    /// frames to follow.
    fn flush(&mut self, pending: Pending) {
        if pending.buffer.is_empty() {
            for done in pending.dones {
                done(Ok(()));
            }
            return;
        }
        let good = self.size.load(Ordering::Relaxed);
        if self.dirty {
            if let Err(err) = self.rollback(good) {
                tracing::error!(spool = %self.dir.display(), error = %err, "spool rollback failed again; refusing the batch");
                for done in pending.dones {
                    done(Err(format!("spool rollback failed: {err}")));
                }
                return;
            }
            self.dirty = false;
        }
        let written = self
            .file
            .write_all(&pending.buffer)
            .and_then(|()| self.file.sync_data());
        let outcome = match written {
            Ok(()) => {
                self.size
                    .store(good + pending.buffer.len() as u64, Ordering::Relaxed);
                self.syncs.inc();
                Ok(())
            }
            Err(err) => {
                tracing::error!(spool = %self.dir.display(), error = %err, records = pending.dones.len(), "spool write failed; rolling back to the last good batch");
                if let Err(rollback) = self.rollback(good) {
                    tracing::error!(spool = %self.dir.display(), error = %rollback, "spool rollback failed; the next write retries it first");
                    self.dirty = true;
                }
                Err(format!("spool write failed: {err}"))
            }
        };
        for done in pending.dones {
            done(outcome.clone());
        }
    }

    /// Cuts the file back to `good` bytes and positions it there.
    fn rollback(&mut self, good: u64) -> io::Result<()> {
        self.file.set_len(good)?;
        self.file.seek(SeekFrom::Start(good))?;
        self.file.sync_data()
    }

    /// Truncates the file to its header in place.
    fn reset(&mut self) {
        if let Err(err) = self.rollback(HEADER_LEN) {
            tracing::warn!(spool = %self.dir.display(), error = %err, "spool reset failed");
            self.dirty = true;
            return;
        }
        self.dirty = false;
        self.size.store(HEADER_LEN, Ordering::Relaxed);
    }

    /// Replaces the file with one holding `payloads` (under a fresh key).
    fn compact(&mut self, payloads: &[Bytes]) {
        let key = FileKey::random();
        match write_fresh(&self.dir, key, payloads) {
            Ok((file, size)) => {
                self.file = file;
                self.key = key;
                self.dirty = false;
                self.size.store(size, Ordering::Relaxed);
            }
            Err(err) => {
                tracing::warn!(spool = %self.dir.display(), error = %err, "spool compaction failed; appending to the old file");
                // The old file is positioned at its good end still; make sure of it.
                let good = self.size.load(Ordering::Relaxed);
                if let Err(err) = self.file.seek(SeekFrom::Start(good)) {
                    tracing::warn!(spool = %self.dir.display(), error = %err, "cannot seek spool.log");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enqueue(n: u64) -> Record {
        Record::EnqueuePlaced {
            key: format!("k:{n}"),
            version: n,
            tombstone: false,
            value: vec![b'x'; 10],
            copies: vec![(0, 1_000, PLACED_SUFFIX), (3, 2_000, PLACED_SPREAD)],
        }
    }

    async fn write(spool: &Spool, record: &Record) {
        let (tell, told) = oneshot::channel();
        let done: Done = Box::new(move |outcome| {
            let _ = tell.send(outcome);
        });
        assert!(spool.append_durable(encode(record).unwrap(), done).is_ok());
        told.await.unwrap().unwrap();
    }

    async fn reopen(dir: &Path) -> Replay {
        open(dir).await.1
    }

    /// Opens the spool once the previous writer thread has released the lock.
    async fn open(dir: &Path) -> (Spool, Replay) {
        for _ in 0..200 {
            match Spool::open(dir, 1 << 20, Counter::default()) {
                Ok(opened) => return opened,
                Err(err) if err.message().contains("locked") => {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await
                }
                Err(err) => panic!("{err}"),
            }
        }
        panic!("the spool stayed locked");
    }

    /// Writes `records` through a spool in `dir` and returns the file's bytes.
    async fn written(dir: &Path, records: &[Record]) -> Vec<u8> {
        {
            let (spool, _) = Spool::open(dir, 1 << 20, Counter::default()).unwrap();
            for record in records {
                write(&spool, record).await;
            }
            spool.close().await;
        }
        std::fs::read(dir.join(LOG_FILE)).unwrap()
    }

    #[tokio::test]
    async fn records_replay_and_the_borrowed_encoding_matches() {
        let dir = tempfile::tempdir().unwrap();
        let copies = [(0, 1_000, PLACED_SUFFIX), (3, 2_000, PLACED_SPREAD)];
        let borrowed = encode_enqueue("k:2", 2, false, &[b'x'; 10], &copies).unwrap();
        assert_eq!(borrowed, encode(&enqueue(2)).unwrap());
        let complete = Record::Complete {
            copy_key: "k:1#0".into(),
            version: 1,
            tombstone: false,
        };
        let raw = written(dir.path(), &[enqueue(1), enqueue(2), complete.clone()]).await;
        assert_eq!(&raw[..8], MAGIC);
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records, vec![enqueue(1), enqueue(2), complete]);
        assert_eq!(
            (replay.format, replay.damage, replay.torn_bytes),
            (FORMAT_VERSION, Damage::default(), 0)
        );
        assert!(replay.kept_aside.is_none());
    }

    /// Finding 3 of issue 21: a record acknowledged under a larger value limit is intact, and
    /// is replayed when the spool is opened with a smaller one.
    #[tokio::test]
    async fn a_record_larger_than_todays_limit_is_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let large = Record::Enqueue {
            key: "k:large".into(),
            version: 7,
            tombstone: false,
            value: vec![b'v'; 200_000],
            copies: vec![(0, 1_000)],
        };
        written(dir.path(), &[enqueue(1), large.clone(), enqueue(2)]).await;
        let (spool, replay) = Spool::open(dir.path(), 65_536, Counter::default()).unwrap();
        assert_eq!(replay.records, vec![enqueue(1), large, enqueue(2)]);
        assert_eq!((replay.damage, replay.torn_bytes), (Damage::default(), 0));
        assert!(replay.kept_aside.is_none());
        spool.close().await;
    }

    /// Finding 1 of issue 10: a flipped byte at every offset of a middle frame (its length, its
    /// tags, its payload) loses that frame only, and every later frame is replayed.
    #[tokio::test]
    async fn a_flipped_byte_anywhere_in_a_middle_frame_loses_only_that_frame() {
        let dir = tempfile::tempdir().unwrap();
        let records: Vec<Record> = (1..=5).map(enqueue).collect();
        let raw = written(dir.path(), &records).await;
        let frame_len = FRAME_HEADER_LEN + encode(&enqueue(1)).unwrap().len();
        let middle = HEADER_LEN as usize + 2 * frame_len;
        let survivors: Vec<Record> = records
            .iter()
            .filter(|record| **record != enqueue(3))
            .cloned()
            .collect();
        for offset in middle..middle + frame_len {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut damaged = raw.clone();
                damaged[offset] ^= flip;
                let parsed = parse(&damaged).unwrap();
                assert_eq!(parsed.records, survivors, "byte {offset} ^ {flip:#x}");
                assert_eq!(parsed.damage.regions, 1, "byte {offset} ^ {flip:#x}");
            }
        }
        // Through the real open: the damaged file is kept aside whole, the intact records are
        // replayed, and the rewritten file is clean.
        let mut damaged = raw.clone();
        damaged[middle] ^= 0x01;
        std::fs::write(dir.path().join(LOG_FILE), &damaged).unwrap();
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records, survivors);
        let aside = replay.kept_aside.expect("kept aside");
        assert_eq!(std::fs::read(&aside).unwrap(), damaged);
        let replay = reopen(dir.path()).await;
        assert_eq!(
            (replay.records, replay.damage),
            (survivors, Damage::default())
        );
    }

    /// A value holding bytes shaped like a frame (made with another file's key, or in format
    /// 0) is never taken for a record, even when recovery scans through it.
    #[tokio::test]
    async fn a_value_that_holds_a_frame_is_never_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let forged = Record::Enqueue {
            key: "victim".into(),
            version: 999,
            tombstone: false,
            value: b"forged".to_vec(),
            copies: vec![(0, u64::MAX)],
        };
        let forged_payload = encode(&forged).unwrap();
        let mut inner = Vec::new();
        FileKey::random().frame_into(&forged_payload, &mut inner);
        FileKey([0; 16]).frame_into(&forged_payload, &mut inner);
        let mut format0 = Vec::new();
        format0.extend_from_slice(&((forged_payload.len() + 8) as u32).to_be_bytes());
        format0.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&forged_payload).to_le_bytes());
        format0.extend_from_slice(&forged_payload);
        inner.extend_from_slice(&format0);
        let carrier = Record::Enqueue {
            key: "carrier".into(),
            version: 1,
            tombstone: false,
            value: inner,
            copies: vec![(0, 1_000)],
        };
        let records = vec![enqueue(1), carrier.clone(), enqueue(2)];
        let raw = written(dir.path(), &records).await;
        assert_eq!(parse(&raw).unwrap().records, records);
        // Damage the carrier's length so recovery scans through its value byte by byte.
        let carrier_at =
            HEADER_LEN as usize + FRAME_HEADER_LEN + encode(&enqueue(1)).unwrap().len();
        for offset in carrier_at..carrier_at + FRAME_HEADER_LEN {
            let mut damaged = raw.clone();
            damaged[offset] ^= 0x01;
            let parsed = parse(&damaged).unwrap();
            assert_eq!(
                parsed.records,
                vec![enqueue(1), enqueue(2)],
                "byte {offset}"
            );
        }
    }

    #[tokio::test]
    async fn a_torn_tail_is_dropped_and_the_file_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let raw = written(dir.path(), &[enqueue(1), enqueue(2)]).await;
        let third_len = FRAME_HEADER_LEN + encode(&enqueue(3)).unwrap().len();
        let mut frame = Vec::new();
        let key = {
            let mut key = [0u8; 16];
            key.copy_from_slice(&raw[16..32]);
            FileKey(key)
        };
        key.frame_into(&encode(&enqueue(3)).unwrap(), &mut frame);
        for cut in [1, FRAME_HEADER_LEN, third_len - 1] {
            let mut torn = raw.clone();
            torn.extend_from_slice(&frame[..cut]);
            std::fs::write(dir.path().join(LOG_FILE), &torn).unwrap();
            let replay = reopen(dir.path()).await;
            assert_eq!(replay.records, vec![enqueue(1), enqueue(2)], "cut {cut}");
            assert_eq!(replay.torn_bytes, cut as u64);
            assert!(replay.kept_aside.is_none());
        }
    }

    /// A spool written by the release before format 1 (headerless, format 0) is replayed and
    /// rewritten in the current format.
    #[tokio::test]
    async fn a_format_0_spool_is_replayed_and_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let mut raw = Vec::new();
        for record in [enqueue(1), enqueue(2)] {
            let payload = encode(&record).unwrap();
            raw.extend_from_slice(&((payload.len() + 8) as u32).to_be_bytes());
            raw.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
            raw.extend_from_slice(&payload);
        }
        std::fs::write(dir.path().join(LOG_FILE), &raw).unwrap();
        let replay = reopen(dir.path()).await;
        assert_eq!((replay.format, replay.records.len()), (0, 2));
        assert_eq!(
            &std::fs::read(dir.path().join(LOG_FILE)).unwrap()[..8],
            MAGIC
        );
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.format, FORMAT_VERSION);
        assert_eq!(replay.records, vec![enqueue(1), enqueue(2)]);
    }

    #[tokio::test]
    async fn an_unknown_format_version_stops_open_and_leaves_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut raw = FileKey::random().header().to_vec();
        raw[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
        raw.extend_from_slice(&[7; 40]);
        std::fs::write(dir.path().join(LOG_FILE), &raw).unwrap();
        let err = Spool::open(dir.path(), 1 << 20, Counter::default()).unwrap_err();
        let expected = format!("format version {}", FORMAT_VERSION + 1);
        assert!(err.message().contains(&expected), "{err}");
        assert_eq!(std::fs::read(dir.path().join(LOG_FILE)).unwrap(), raw);
    }

    /// Group commit: appends sent while the writer is busy share one `fdatasync`, and each is
    /// acknowledged only once its record is in the file. Fails if every append is synced alone,
    /// or if an acknowledgement comes before its record can be read back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appends_share_a_sync_and_each_is_durable_when_acknowledged() {
        const APPENDS: u64 = 64;
        let dir = tempfile::tempdir().unwrap();
        let (spool, _, gate) = Spool::open_held(dir.path(), 1 << 20).unwrap();
        let acknowledged = Arc::new(AtomicU64::new(0));
        let mut appenders = Vec::new();
        let mut answers = Vec::new();
        for n in 0..APPENDS {
            let (tell, told) = oneshot::channel();
            answers.push(told);
            let (spool, path, acknowledged) = (
                spool.clone(),
                dir.path().join(LOG_FILE),
                acknowledged.clone(),
            );
            appenders.push(tokio::spawn(async move {
                let record = enqueue(n);
                let expected = record.clone();
                let done: Done = Box::new(move |outcome| {
                    // On the writer thread, right after the sync: the record must be readable
                    // from the file by anyone who opens it now.
                    let on_disk = std::fs::read(&path).unwrap();
                    let durable = parse(&on_disk).unwrap().records.contains(&expected);
                    acknowledged.fetch_add(1, Ordering::SeqCst);
                    let _ = tell.send(outcome.map(|()| durable));
                });
                assert!(spool.append_durable(encode(&record).unwrap(), done).is_ok());
            }));
        }
        for appender in appenders {
            appender.await.unwrap();
        }
        // Every append is sent and the writer holds its first batch: nothing is written yet,
        // so nothing may be acknowledged.
        assert_eq!(acknowledged.load(Ordering::SeqCst), 0);
        assert_eq!(spool.syncs(), 0);
        let releaser = std::thread::spawn(move || while gate.send(Gate::Go).is_ok() {});
        for (n, answer) in answers.into_iter().enumerate() {
            assert_eq!(
                answer.await.unwrap(),
                Ok(true),
                "append {n} was acknowledged before its record was in the file"
            );
        }
        // The first batch is whatever reached the writer before it formed it; every later
        // append was waiting in the channel by then and joins the second.
        let syncs = spool.syncs();
        assert!(
            (1..=2).contains(&syncs),
            "{APPENDS} concurrent appends took {syncs} syncs"
        );
        spool.close().await;
        drop(spool);
        releaser.join().unwrap();
    }

    #[tokio::test]
    async fn a_lock_released_within_the_wait_is_taken() {
        let dir = tempfile::tempdir().unwrap();
        // A copy of the lock's descriptor, as a child forked while it was open holds one.
        let held = lock_dir(dir.path()).unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(held);
        });
        let opened = Spool::open(dir.path(), 1 << 20, Counter::default());
        releaser.join().unwrap();
        assert!(opened.is_ok(), "{:?}", opened.err());
    }

    #[tokio::test]
    async fn a_second_owner_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_spool, _) = Spool::open(dir.path(), 1 << 20, Counter::default()).unwrap();
        let err = Spool::open(dir.path(), 1 << 20, Counter::default()).unwrap_err();
        assert!(err.message().contains("locked by another process"), "{err}");
    }

    #[tokio::test]
    async fn compaction_and_reset_replace_the_content() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (spool, _) = Spool::open(dir.path(), 1 << 20, Counter::default()).unwrap();
            for n in 1..=10 {
                write(&spool, &enqueue(n)).await;
            }
            spool.compact(vec![encode(&enqueue(10)).unwrap()]);
            write(&spool, &enqueue(11)).await;
            spool.close().await;
        }
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records, vec![enqueue(10), enqueue(11)]);
        assert!(!dir.path().join(TMP_FILE).exists());
        {
            let (spool, _) = open(dir.path()).await;
            spool.reset();
            write(&spool, &enqueue(12)).await;
            spool.close().await;
        }
        let replay = reopen(dir.path()).await;
        assert_eq!(replay.records, vec![enqueue(12)]);
    }
}
