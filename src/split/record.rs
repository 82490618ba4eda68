//! A split key's record, as the store keeps it (`<copies>:<phase>:<since_ms>:<seen_ms>`), and
//! the state machine that moves it ([`decide`]).

use std::time::Duration;

/// Where a split key is in the grow order (split) or its mirror (merge).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Writers write the split copies; readers still read the family's copies. The copies are
    /// filled, and readers admitted, once the record has settled.
    Writing,
    /// Writers write and readers read the split copies.
    Reading,
    /// Readers have left (they read the family's copies); writers still write the split copies.
    Leaving,
    /// Writers have left too; once settled the split copies are deleted and the record goes.
    Draining,
}

impl Phase {
    /// The letter in the record.
    fn code(self) -> char {
        match self {
            Phase::Writing => 'w',
            Phase::Reading => 'r',
            Phase::Leaving => 'm',
            Phase::Draining => 'd',
        }
    }

    /// The phase's name, as `/v1/hot-keys` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Writing => "writing",
            Phase::Reading => "reading",
            Phase::Leaving => "leaving",
            Phase::Draining => "draining",
        }
    }

    /// Whether publishes write the split copies in this phase.
    pub fn writes(self) -> bool {
        !matches!(self, Phase::Draining)
    }

    /// Whether reads use the split copies in this phase.
    pub fn reads(self) -> bool {
        matches!(self, Phase::Reading)
    }
}

/// One split key's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitRecord {
    /// The key's copies while split.
    pub copies: u32,
    /// Where it is in the protocol.
    pub phase: Phase,
    /// When the phase began, Unix ms (by the clock of the instance that moved it; shown, and it
    /// makes every move's text new, so a compare-and-set never mistakes one move for another).
    pub since_ms: u64,
    /// When an instance last saw the key hot, Unix ms (merges wait `cool_down` after it).
    pub seen_ms: u64,
}

impl SplitRecord {
    /// The stored text.
    pub fn encode(&self) -> String {
        format!(
            "{}:{}:{}:{}",
            self.copies,
            self.phase.code(),
            self.since_ms,
            self.seen_ms
        )
    }

    /// Parses a stored text; `None` when it is not a record.
    pub fn decode(text: &str) -> Option<SplitRecord> {
        let mut parts = text.split(':');
        let copies: u32 = parts.next()?.parse().ok()?;
        let phase = match parts.next()? {
            "w" => Phase::Writing,
            "r" => Phase::Reading,
            "m" => Phase::Leaving,
            "d" => Phase::Draining,
            _ => return None,
        };
        let since_ms = parts.next()?.parse().ok()?;
        let seen_ms = parts.next()?.parse().ok()?;
        if parts.next().is_some() || !(2..=crate::key::MAX_COPIES).contains(&copies) {
            return None;
        }
        Some(SplitRecord {
            copies,
            phase,
            since_ms,
            seen_ms,
        })
    }

    /// What identifies the phase this record is in: the settle time is counted from the first
    /// time an instance saw it (a refresh of `seen_ms` does not restart it).
    pub fn stage(&self) -> (u32, Phase, u64) {
        (self.copies, self.phase, self.since_ms)
    }

    fn moved(&self, phase: Phase, now_ms: u64) -> SplitRecord {
        SplitRecord {
            phase,
            since_ms: now_ms.max(self.since_ms + 1),
            ..*self
        }
    }
}

/// What one instance knows of one key on one tick of the split driver.
#[derive(Debug, Clone, Copy)]
pub struct Facts {
    /// Whether this instance's detector calls the key hot at the family's split threshold
    /// (and the family's mode is `split`).
    pub hot: bool,
    /// Whether a new split may start (under `max_split_keys` and `max_splits_per_minute`).
    pub may_start: bool,
    /// Whether this instance has seen the record's current stage for the settle time.
    pub settled: bool,
    /// Whether every live instance of the family knows of per-key layouts (is in its split
    /// set). While one does not (an older release), it writes only the family's copies: no
    /// split starts or admits readers, and readers of a split key leave at once.
    pub all_aware: bool,
    /// Now, Unix ms.
    pub now_ms: u64,
    /// The family's `split.cool_down`.
    pub cool_down: Duration,
    /// The family's `split.max_copies`.
    pub max_copies: u32,
}

/// What the driver does for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing.
    Stay,
    /// Write this record (a new split, a re-split, a merge step, or a refresh of `seen_ms`) by
    /// compare-and-set from the one read.
    Record(SplitRecord),
    /// Fill the split copies from the family's copies, then record this (`Reading`) record.
    FillThenRecord(SplitRecord),
    /// Delete the split copies beyond the family's, then remove the record.
    DeleteThenRemove,
}

/// How often an instance that sees a split key hot refreshes its `seen_ms`: a quarter of the
/// cool-down, so a key hot anywhere never merges.
fn touch_every(cool_down: Duration) -> u64 {
    (crate::duration::millis(cool_down) / 4).max(1)
}

/// The state machine of one key (the module doc of [`crate::split`] says why each move is safe).
pub fn decide(record: Option<&SplitRecord>, facts: &Facts) -> Step {
    let now = facts.now_ms;
    let Some(record) = record else {
        return if facts.hot && facts.may_start && facts.all_aware {
            Step::Record(SplitRecord {
                copies: facts.max_copies,
                phase: Phase::Writing,
                since_ms: now,
                seen_ms: now,
            })
        } else {
            Step::Stay
        };
    };
    let stale_seen = now.saturating_sub(record.seen_ms) >= touch_every(facts.cool_down);
    let cooled = !facts.hot
        && now.saturating_sub(record.seen_ms) >= crate::duration::millis(facts.cool_down);
    match record.phase {
        Phase::Reading if !facts.all_aware => Step::Record(record.moved(Phase::Leaving, now)),
        Phase::Writing if facts.settled && facts.all_aware => {
            let mut next = record.moved(Phase::Reading, now);
            if facts.hot {
                next.seen_ms = now;
            }
            Step::FillThenRecord(next)
        }
        Phase::Writing | Phase::Reading if facts.hot && stale_seen => Step::Record(SplitRecord {
            seen_ms: now,
            ..*record
        }),
        Phase::Reading if cooled => Step::Record(record.moved(Phase::Leaving, now)),
        Phase::Leaving | Phase::Draining if facts.hot => {
            let mut next = record.moved(Phase::Writing, now);
            next.seen_ms = now;
            Step::Record(next)
        }
        Phase::Leaving if facts.settled => Step::Record(record.moved(Phase::Draining, now)),
        Phase::Draining if facts.settled => Step::DeleteThenRemove,
        _ => Step::Stay,
    }
}
