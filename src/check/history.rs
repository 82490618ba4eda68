//! The history of an experiment: one [`Event`] per operation or fault, written as JSON lines.

use std::io::Write;

use serde::{Deserialize, Serialize};

use hotsplit::error::{Error, ErrorKind, Result};

/// What an event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A read through hotsplit (or a plain read of the source in the `delete` mode).
    Read,
    /// A publish of a version.
    Write,
    /// An invalidation (tombstone) at a version.
    Delete,
    /// A direct read of one copy from Redis, bypassing hotsplit (convergence and regression).
    Sample,
    /// A load from the source of truth after a miss (the `delete` mode's cost).
    SourceLoad,
    /// An injected fault starting or ending; `outcome` names it.
    Fault,
    /// A client-side cache's invalidation, when the reader processed it (`client-cache`
    /// mode): a push naming `key`, or with an empty key the null invalidation (flush
    /// everything); with an error outcome, the client's own flush when a connection dropped.
    Invalidation,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It succeeded; for a read, a value at `version` was returned.
    Ok,
    /// A read found no value (missing, expired or invalidated).
    NotFound,
    /// A read was answered "not modified" at `version`.
    NotModified,
    /// It failed with this problem code (or a transport error).
    Error(String),
}

/// One operation or fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The session (reader or writer) that made it; faults use `faults`.
    pub session: String,
    /// What it was.
    pub op: Op,
    /// The key, or empty for faults.
    pub key: String,
    /// The version read or written, when there is one; for a read answered 404, the
    /// tombstone's version when the answer named one.
    pub version: Option<u64>,
    /// The copy read or sampled, when known.
    pub copy: Option<u32>,
    /// `Hotsplit-Served-By`, or the node sampled.
    pub served_by: Option<String>,
    /// `Hotsplit-Route`, when the service sent one.
    pub route: Option<String>,
    /// Start, microseconds on the run's monotonic clock.
    pub start_us: u64,
    /// End, microseconds on the run's monotonic clock.
    pub end_us: u64,
    /// How it ended.
    pub outcome: Outcome,
}

impl Event {
    /// Whether this is a read that returned a version (a value or "not modified").
    pub fn read_version(&self) -> Option<u64> {
        match (self.op, &self.outcome) {
            (Op::Read, Outcome::Ok | Outcome::NotModified) => self.version,
            _ => None,
        }
    }

    /// The version a read showed its session: a value's or a "not modified" version, or a
    /// tombstone's (a 404 carrying `Hotsplit-Version`). A 404 without a version (the key held no
    /// record) shows none.
    pub fn observed_version(&self) -> Option<u64> {
        match (self.op, &self.outcome) {
            (Op::Read, Outcome::Ok | Outcome::NotModified | Outcome::NotFound) => self.version,
            _ => None,
        }
    }

    /// Whether this is a read answered 404 by a tombstone (one that carries its version).
    pub fn invalidated_read(&self) -> bool {
        self.op == Op::Read && self.outcome == Outcome::NotFound && self.version.is_some()
    }

    /// Whether this is a write or delete that was acknowledged, and at which version.
    pub fn acknowledged_version(&self) -> Option<u64> {
        match (self.op, &self.outcome) {
            (Op::Write | Op::Delete, Outcome::Ok) => self.version,
            _ => None,
        }
    }
}

/// Writes `events` as JSON lines.
///
/// # Errors
/// [`ErrorKind::Io`] when writing fails.
pub fn write_jsonl(out: &mut impl Write, events: &[Event]) -> Result<()> {
    for event in events {
        let line = serde_json::to_string(event)
            .map_err(|err| Error::new(ErrorKind::Io, format!("cannot encode an event: {err}")))?;
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// Reads JSON lines written by [`write_jsonl`]; blank lines are skipped.
///
/// The binary only writes histories; this reader is what the round-trip test below reads them
/// back with, so it is compiled for tests only.
///
/// # Errors
/// [`ErrorKind::InvalidParameter`] naming the line that does not parse; [`ErrorKind::Io`].
#[cfg(test)]
pub fn read_jsonl(input: impl std::io::BufRead) -> Result<Vec<Event>> {
    let mut events = Vec::new();
    for (at, line) in input.lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let event = serde_json::from_str(&line).map_err(|err| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!("history line {}: {err}", at + 1),
            )
        })?;
        events.push(event);
    }
    Ok(events)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_through_jsonl() {
        let events = vec![
            Event {
                session: "r1".into(),
                op: Op::Read,
                key: "hot:1".into(),
                version: Some(7),
                copy: Some(3),
                served_by: Some("127.0.0.1:7000;role=primary".into()),
                route: None,
                start_us: 10,
                end_us: 20,
                outcome: Outcome::Ok,
            },
            Event {
                session: "faults".into(),
                op: Op::Fault,
                key: String::new(),
                version: None,
                copy: None,
                served_by: Some("127.0.0.1:7001".into()),
                route: None,
                start_us: 30,
                end_us: 30,
                outcome: Outcome::Error("sigstop".into()),
            },
        ];
        let mut buffer = Vec::new();
        write_jsonl(&mut buffer, &events).unwrap();
        let text = String::from_utf8(buffer.clone()).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains(r#""op":"read""#), "{text}");
        assert_eq!(read_jsonl(buffer.as_slice()).unwrap(), events);
        let err = read_jsonl("{}\n".as_bytes()).unwrap_err();
        assert!(err.message().contains("line 1"), "{err}");
    }
}
