//! Request deadlines: one instant per request that bounds every store call the request makes.
//!
//! The HTTP edge gives each request a [`Deadline`] `server.request_deadline` after it arrived,
//! and the read path ([`crate::read`]) and the publish path ([`crate::publish`]) bound their
//! store calls with it, so a paused node costs a caller at most the deadline, whatever the
//! store's command timeout. A read past it fails with [`ErrorKind::DeadlineExceeded`]. A
//! publish stops waiting for copy writes earlier, at [`Deadline::copy_writes_until`]: a write
//! already sent may still land, so the copies that have not answered are queued durably (which
//! waits for the spool's `fdatasync`) and reported `queued`, and the margin is the time kept
//! for that.

use std::future::Future;
use std::time::Duration;

use futures_util::future::{Either, FutureExt};
use tokio::time::Instant;

use crate::error::{Error, ErrorKind, Result};

/// The share of the budget a publish keeps for queueing the copies that did not answer: it
/// stops waiting for them after nine tenths of the budget…
const QUEUE_MARGIN_DIVISOR: u32 = 10;

/// …but keeps at most this much: a group commit of the spool takes about a millisecond on a
/// healthy disk, so a longer margin would only cut copy writes short.
const MAX_QUEUE_MARGIN: Duration = Duration::from_millis(250);

/// The longest budget a deadline accepts (`server.request_deadline` is validated against it),
/// so that adding it to an instant cannot overflow.
pub const MAX_BUDGET: Duration = Duration::from_secs(3600);

/// When a request must be answered. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// When the request must be answered.
    at: Instant,
    /// When a publish stops waiting for copy writes (`at` minus the queueing margin).
    copy_writes_until: Instant,
}

impl Deadline {
    /// A deadline `budget` from now (at most [`MAX_BUDGET`]).
    pub fn after(budget: Duration) -> Deadline {
        Deadline::starting_at(Instant::now(), budget)
    }

    /// A deadline `budget` (at most [`MAX_BUDGET`]) after `start`.
    pub fn starting_at(start: Instant, budget: Duration) -> Deadline {
        let budget = budget.min(MAX_BUDGET);
        let margin = (budget / QUEUE_MARGIN_DIVISOR).min(MAX_QUEUE_MARGIN);
        Deadline {
            at: start + budget,
            copy_writes_until: start + (budget - margin),
        }
    }

    /// When the request must be answered.
    pub fn at(&self) -> Instant {
        self.at
    }

    /// When a publish stops waiting for its copy writes, leaving time to queue the copies that
    /// did not answer before [`Deadline::at`].
    pub fn copy_writes_until(&self) -> Instant {
        self.copy_writes_until
    }

    /// Runs `future` until the deadline. Not an `async fn`: the future is put into the timer's
    /// future where it is made, not moved there on the first poll (a read's store future is
    /// kilobytes).
    ///
    /// # Errors
    /// [`ErrorKind::DeadlineExceeded`] when the deadline passes first (the future is dropped).
    pub fn bound<F: Future>(self, future: F) -> impl Future<Output = Result<F::Output>> {
        tokio::time::timeout_at(self.at, future).map(|answer| answer.map_err(|_| exceeded()))
    }
}

/// Runs `future` (a fallible store call) until `deadline` ([`Deadline::bound`]), or with no
/// bound of its own when there is none; like `bound`, not an `async fn`.
///
/// # Errors
/// The future's own error, or [`ErrorKind::DeadlineExceeded`] when the deadline passes first.
pub fn within<T, F>(deadline: Option<Deadline>, future: F) -> impl Future<Output = Result<T>>
where
    F: Future<Output = Result<T>>,
{
    match deadline {
        Some(deadline) => Either::Left(deadline.bound(future).map(|answer| answer?)),
        None => Either::Right(future),
    }
}

/// The error of a request whose deadline passed before the store answered.
pub fn exceeded() -> Error {
    Error::new(
        ErrorKind::DeadlineExceeded,
        "the request deadline passed before the store answered",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_keeps_a_tenth_of_the_budget_and_at_most_250_ms_for_queueing() {
        let start = Instant::now();
        let short = Deadline::starting_at(start, Duration::from_millis(500));
        assert_eq!(short.at() - start, Duration::from_millis(500));
        assert_eq!(
            short.copy_writes_until() - start,
            Duration::from_millis(450)
        );
        let long = Deadline::starting_at(start, Duration::from_secs(5));
        assert_eq!(
            long.copy_writes_until() - start,
            Duration::from_millis(4750)
        );
        let huge = Deadline::starting_at(start, Duration::from_secs(u64::MAX));
        assert_eq!(huge.at() - start, MAX_BUDGET);
    }

    #[tokio::test]
    async fn a_future_past_the_deadline_is_cut_and_one_within_it_is_not() {
        let deadline = Deadline::after(Duration::from_millis(20));
        let cut = deadline
            .bound(tokio::time::sleep(Duration::from_secs(30)))
            .await;
        assert_eq!(cut.unwrap_err().kind(), ErrorKind::DeadlineExceeded);
        let deadline = Deadline::after(Duration::from_millis(100));
        assert_eq!(deadline.bound(async { 7 }).await, Ok(7));
    }

    #[tokio::test]
    async fn within_answers_the_futures_own_result_or_exceeded() {
        let failing = || async { Err::<u8, _>(Error::new(ErrorKind::Timeout, "node timed out")) };
        let soon = Some(Deadline::after(Duration::from_millis(50)));
        assert_eq!(within(soon, async { Ok(7) }).await, Ok(7));
        let failed = within(soon, failing()).await.unwrap_err();
        assert_eq!(failed.kind(), ErrorKind::Timeout, "the future's own error");
        let cut = within(soon, std::future::pending::<Result<u8>>()).await;
        assert_eq!(cut.unwrap_err().kind(), ErrorKind::DeadlineExceeded);
        assert_eq!(within(None, async { Ok(8) }).await, Ok(8));
        let failed = within(None, failing()).await.unwrap_err();
        assert_eq!(failed.kind(), ErrorKind::Timeout);
    }
}
