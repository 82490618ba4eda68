//! Clocks and keys: Unix ms, the keys the load reads ([`KeyId`]) and when the hotspot is where
//! ([`Schedule`]).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::SPLIT_KEY;

/// Now, Unix ms (the clock `/v1/hot-keys` speaks).
pub(crate) fn unix_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
        * 1000.0
}

/// A key as the load log holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum KeyId {
    /// `mv:cold:N`.
    Cold(u32),
    /// Part 1's `mv:hot:M`.
    Hot(u32),
    /// Part 2's [`SPLIT_KEY`].
    Split,
}

impl KeyId {
    pub(crate) fn name(self) -> String {
        match self {
            KeyId::Cold(n) => format!("mv:cold:{n}"),
            KeyId::Hot(m) => format!("mv:hot:{m}"),
            KeyId::Split => SPLIT_KEY.to_owned(),
        }
    }
}

/// When the hotspot is where: part 1 from `start` for `part1`, moving at `moves`; then part 2.
#[derive(Debug, Clone)]
pub(crate) struct Schedule {
    /// Part 1's start.
    pub(crate) start: Instant,
    /// The same moment, Unix ms.
    pub(crate) start_ms: f64,
    /// Part 1's length.
    pub(crate) part1: Duration,
    /// Each move's offset from `start` (the first is zero), [`Options::move_offsets`].
    pub(crate) moves: Vec<Duration>,
}

impl Schedule {
    /// The hot key at `now` and the instance its hot reads go to.
    pub(crate) fn hot_at(&self, now: Instant) -> (KeyId, usize) {
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed >= self.part1 {
            return (KeyId::Split, 0);
        }
        let m = self
            .moves
            .partition_point(|offset| *offset <= elapsed)
            .saturating_sub(1);
        (KeyId::Hot(m as u32), m % 2)
    }

    /// Move `m`'s time, Unix ms.
    pub(crate) fn move_ms(&self, m: usize) -> f64 {
        self.start_ms + self.moves[m].as_secs_f64() * 1000.0
    }

    /// Part 2's start (the move to [`SPLIT_KEY`]), Unix ms.
    pub(crate) fn part2_ms(&self) -> f64 {
        self.start_ms + self.part1.as_secs_f64() * 1000.0
    }
}
