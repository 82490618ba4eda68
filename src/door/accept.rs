//! What both accept loops (the HTTP listener, `http::listener`, and the Redis-protocol one,
//! `resp::listener`) share: which accept errors concern one connection only, and a throttle for
//! warnings that repeat.

use std::time::Duration;

use tokio::time::Instant;

/// How often a repeated warning (a refused connection, an accept error) is logged at most.
pub const WARNING_INTERVAL: Duration = Duration::from_secs(1);

/// Accept errors that concern one connection only (it was reset before it was accepted); the
/// next accept may well succeed.
pub fn is_connection_error(err: &std::io::Error) -> bool {
    use std::io::ErrorKind;
    matches!(
        err.kind(),
        ErrorKind::ConnectionRefused | ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
    )
}

/// Lets a repeated warning through at most once per [`WARNING_INTERVAL`], counting the ones it
/// held back.
#[derive(Debug, Default)]
pub struct Throttle {
    /// When a warning was last let through.
    last: Option<Instant>,
    /// Warnings held back since.
    suppressed: u64,
}

impl Throttle {
    /// `Some(held back since the last one)` when a warning may be logged now.
    pub fn due(&mut self) -> Option<u64> {
        self.due_at(Instant::now())
    }

    /// [`Throttle::due`] at `now`.
    fn due_at(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|last| now.duration_since(last) < WARNING_INTERVAL)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_throttle_lets_one_warning_a_second_through() {
        let mut throttle = Throttle::default();
        let start = Instant::now();
        assert_eq!(throttle.due_at(start), Some(0));
        assert_eq!(throttle.due_at(start), None);
        assert_eq!(throttle.due_at(start + WARNING_INTERVAL / 2), None);
        assert_eq!(throttle.due_at(start + WARNING_INTERVAL), Some(2));
    }
}
