//! A histogram of durations observed on the hit path, kept per thread and summed on scrape.
//!
//! prometheus-client's `Histogram` takes a write lock for every observation: on the near cache's
//! hit path (one observation per hit, from every worker thread) that lock, and the cache line
//! it lives on, passed between the threads on each hit. [`ShardedHistogram`] keeps a set of
//! counters per shard (a thread keeps to one shard, chosen once), each on its own cache lines,
//! and adds them up when `/metrics` is scraped: an observation is two relaxed atomic adds on
//! the thread's own lines. The exposition is the same as prometheus-client's histogram's (the
//! same bucket bounds, a `+Inf` bucket, `_sum` in seconds, `_count`).
//!
//! # Invariants
//! - The count is the sum of the bucket counts, read in one pass, so a scrape never shows a
//!   count that disagrees with its buckets; `_sum` may miss an observation made during the
//!   scrape (it is read in the same pass, after each shard's buckets).
//! - The sum is kept in whole nanoseconds (a `u64`: 584 years of summed durations).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// The shards of one histogram: more than the worker threads of any usual host, few enough to
/// sum on a scrape.
const SHARDS: usize = 16;

/// The most buckets (their bounds, and the `+Inf` bucket after them).
pub const MAX_BUCKETS: usize = 16;

/// A histogram of durations, in seconds, with at most [`MAX_BUCKETS`] − 1 finite bounds.
#[derive(Debug, Clone)]
pub struct ShardedHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// The finite upper bounds, in seconds (for the exposition).
    bounds: Box<[f64]>,
    /// The same bounds in nanoseconds (an observation's bucket is the first bound it is at most).
    bounds_nanos: Box<[u64]>,
    shards: Box<[Shard]>,
}

/// One shard's counters: the buckets (the last one `+Inf`) and the sum, on cache lines of their
/// own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    buckets: [AtomicU64; MAX_BUCKETS],
    sum_nanos: AtomicU64,
}

impl ShardedHistogram {
    /// A histogram with the finite upper bounds `bounds`, in seconds, ascending.
    ///
    /// # Panics
    /// When there are [`MAX_BUCKETS`] bounds or more: a programming error, not an input.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> ShardedHistogram {
        let bounds: Box<[f64]> = bounds.into_iter().collect();
        assert!(
            bounds.len() < MAX_BUCKETS,
            "a sharded histogram has at most {} finite bounds",
            MAX_BUCKETS - 1
        );
        let bounds_nanos = bounds
            .iter()
            .map(|bound| {
                Duration::from_secs_f64(*bound)
                    .as_nanos()
                    .try_into()
                    .unwrap_or(u64::MAX)
            })
            .collect();
        ShardedHistogram {
            inner: Arc::new(Inner {
                bounds,
                bounds_nanos,
                shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            }),
        }
    }

    /// Observes `duration`, on this thread's shard.
    pub fn observe(&self, duration: Duration) {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let inner = &*self.inner;
        let bucket = inner
            .bounds_nanos
            .iter()
            .position(|bound| nanos <= *bound)
            .unwrap_or(inner.bounds_nanos.len());
        let shard = &inner.shards[thread_shard()];
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The sum in seconds, the count, and each bucket's upper bound and count (not cumulative;
    /// the last bound `f64::MAX`, which the encoder writes as `+Inf`).
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let mut buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::MAX))
            .map(|bound| (bound, 0))
            .collect();
        let mut sum_nanos = 0u64;
        for shard in &inner.shards {
            for (bucket, count) in buckets.iter_mut().zip(&shard.buckets) {
                bucket.1 += count.load(Ordering::Relaxed);
            }
            sum_nanos = sum_nanos.saturating_add(shard.sum_nanos.load(Ordering::Relaxed));
        }
        let count = buckets.iter().map(|(_, count)| count).sum();
        (
            Duration::from_nanos(sum_nanos).as_secs_f64(),
            count,
            buckets,
        )
    }
}

/// This thread's shard: threads are given shards in turn, once each.
fn thread_shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SHARDS;
    }
    SHARD.with(|shard| *shard)
}

impl TypedMetric for ShardedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ShardedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    use prometheus_client::registry::{Registry, Unit};

    /// The exposition of one histogram registered alone as `age` (seconds).
    fn exposition(metric: impl prometheus_client::registry::Metric) -> String {
        let mut registry = Registry::default();
        registry.register_with_unit("age", "an age", Unit::Seconds, metric);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn it_exposes_what_prometheus_clients_histogram_exposes_for_the_same_observations() {
        let bounds = || exponential_buckets(0.000_5, 2.0, 14);
        let sharded = ShardedHistogram::new(bounds());
        let reference = Histogram::new(bounds());
        // On the bounds, between them, past the last, zero; from several threads.
        let ages_ms = [
            0.0, 0.5, 0.7, 1.0, 3.9, 4.0, 250.0, 4096.0, 4096.5, 60_000.0,
        ];
        std::thread::scope(|scope| {
            for chunk in ages_ms.chunks(3) {
                let sharded = &sharded;
                scope.spawn(move || {
                    for ms in chunk {
                        sharded.observe(Duration::from_secs_f64(ms / 1000.0));
                    }
                });
            }
        });
        for ms in ages_ms {
            reference.observe(Duration::from_secs_f64(ms / 1000.0).as_secs_f64());
        }
        let (sum, count, buckets) = sharded.snapshot();
        assert_eq!(count, ages_ms.len() as u64);
        assert_eq!(buckets.iter().map(|(_, count)| count).sum::<u64>(), count);
        assert!(
            (sum - ages_ms.iter().sum::<f64>() / 1000.0).abs() < 1e-6,
            "{sum}"
        );
        // The sums differ in their last digits (nanoseconds against f64 seconds): compare the
        // rest of the exposition line by line.
        let without_sum = |text: String| {
            text.lines()
                .filter(|line| !line.starts_with("age_seconds_sum"))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            without_sum(exposition(sharded)),
            without_sum(exposition(reference))
        );
    }

    #[test]
    #[should_panic(expected = "at most 15 finite bounds")]
    fn too_many_bounds_are_refused() {
        ShardedHistogram::new(exponential_buckets(1.0, 2.0, 16));
    }
}
