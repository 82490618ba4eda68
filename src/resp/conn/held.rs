//! The bytes a connection holds, counted where every connection's are summed: what its
//! commands being received hold (`hotsplit_resp_receiving_bytes`, which is also the
//! `resp.max_receiving_bytes` count) and its reply buffer while the client reads it
//! (`hotsplit_resp_writing_bytes`). Each is a guard that gives its count back when dropped,
//! however the connection or the write ends.

use super::super::metrics::RespMetrics;

/// One connection's share of the bytes every connection's commands being received hold
/// (the `hotsplit_resp_receiving_bytes` gauge, which is the `resp.max_receiving_bytes` count);
/// given back when the connection ends.
pub(super) struct Receiving {
    /// The gauge.
    metrics: RespMetrics,
    /// This connection's share.
    held: usize,
}

impl Receiving {
    /// No share yet.
    pub(super) fn new(metrics: RespMetrics) -> Receiving {
        Receiving { metrics, held: 0 }
    }

    /// Sets the share to `bytes`; false when the total then passes `bound`.
    pub(super) fn hold(&mut self, bytes: usize, bound: Option<usize>) -> bool {
        let delta =
            i64::try_from(bytes).unwrap_or(i64::MAX) - i64::try_from(self.held).unwrap_or(i64::MAX);
        self.held = bytes;
        if delta == 0 {
            return true;
        }
        let before = self.metrics.receiving().inc_by(delta);
        let total = usize::try_from(before.saturating_add(delta)).unwrap_or(0);
        bound.is_none_or(|bound| delta < 0 || total <= bound)
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.metrics
            .receiving()
            .dec_by(i64::try_from(self.held).unwrap_or(i64::MAX));
    }
}

/// One write's output buffer, counted in the `hotsplit_resp_writing_bytes` gauge until the
/// write ends (written, failed or timed out).
pub(super) struct Writing<'a> {
    /// The gauge's owner.
    metrics: &'a RespMetrics,
    /// The bytes counted.
    held: i64,
}

impl Writing<'_> {
    /// Counts `bytes` until the guard is dropped.
    pub(super) fn hold(metrics: &RespMetrics, bytes: usize) -> Writing<'_> {
        let held = i64::try_from(bytes).unwrap_or(i64::MAX);
        metrics.writing().inc_by(held);
        Writing { metrics, held }
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.metrics.writing().dec_by(self.held);
    }
}
