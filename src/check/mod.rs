//! Consistency experiments: the history of a run and the checkers that judge it.
//!
//! [`history`] is the record of every operation a run made (JSON lines); [`checkers`] are pure
//! functions over a history that count what the hotsplit claims forbid: a session's reads going
//! back in time, a writer not seeing its own write, copies that do not converge or that regress,
//! and how stale advisory reads were. They are shared by `hotsplit check` (a seeded experiment on
//! a throwaway cluster) and by unit tests over hand-written histories, which show that each
//! checker catches what it claims.

pub mod checkers;
pub mod history;
pub mod run;
