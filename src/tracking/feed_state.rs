//! What the invalidation feed (`crate::feed`) tells of itself: whether every primary's feed is
//! current. It lives beside the tracking table, which holds it, so the feed depends on the
//! table and not the other way round.

use serde::Serialize;

/// What the status views show of the feed.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct FeedView {
    /// Whether the feed runs (Redis, and `feed.disabled` unset).
    pub enabled: bool,
    /// Whether every primary's feed is current; leases are capped at `max_silence_ms` when not.
    pub up: bool,
    /// `feed.max_silence` in force, in ms.
    pub max_silence_ms: u64,
    /// Each primary's feed: its node and how old its last proof is, in ms (`None`: none yet or
    /// closed).
    pub primaries: Vec<(String, Option<u64>)>,
}

/// The feed's shared state: what the views and the lease cap read.
#[derive(Debug, Default)]
pub struct FeedState {
    /// The view, refreshed every tick.
    view: std::sync::Mutex<Option<FeedView>>,
}

impl FeedState {
    /// What `/v1/feed` and the status page show.
    pub fn view(&self) -> FeedView {
        self.view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
            .unwrap_or(FeedView {
                enabled: false,
                up: false,
                max_silence_ms: 0,
                primaries: Vec::new(),
            })
    }

    /// Stores `view`.
    pub fn set(&self, view: FeedView) {
        *self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(view);
    }
}
