//! `GET /v1/hot-keys`: the instance's hot keys as an operator reads them.

use serde::Serialize;

use super::HotKeys;
use crate::family::Families;
use crate::key::Key;

/// One listed key.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotKeyView {
    /// The key.
    pub key: String,
    /// Reads per second asked of this instance over the last window (estimated from the
    /// samples; may over-state by `rate_error`).
    pub rate: f64,
    /// Of those, reads per second that reached Redis (near-cache hits do not).
    pub store_rate: f64,
    /// The most `rate` over-states.
    pub rate_error: f64,
    /// Its share of the window's reads, 0.0..=1.0.
    pub share: f64,
    /// Whether it is hot now (its rate reached `hot_keys.threshold` and it has not cooled).
    pub hot: bool,
    /// Since when it is hot, Unix ms.
    pub hot_since_ms: Option<u64>,
    /// Its family (prefix, or `default`).
    pub family: String,
    /// Its copies now.
    pub copies: u32,
    /// What a hot key of its family leads to: `observe` (detected and reported only).
    pub policy: &'static str,
}

/// The instance's detector and its last window.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotKeysView {
    /// Whether reads are sampled (`hot_keys.enabled`).
    pub enabled: bool,
    /// One read in this many is sampled.
    pub sample_every: u32,
    /// The window, ms.
    pub window_ms: u64,
    /// The hot rate, reads per second.
    pub threshold: f64,
    /// When the last window closed, Unix ms (0: none yet).
    pub closed_at_ms: u64,
    /// Reads per second this instance answered in it, estimated from the samples.
    pub reads_per_s: f64,
    /// The most read keys of the last window, most read first (at most `hot_keys.list`).
    pub keys: Vec<HotKeyView>,
    /// Keys hot now that are not listed (cooling, or below the listed ones).
    pub other_hot: Vec<String>,
}

impl HotKeysView {
    /// The view of `hot`, each key's family and copies from `families`.
    pub fn of(hot: &HotKeys, families: &Families) -> HotKeysView {
        let config = hot.config();
        let window = hot.last_window();
        let keys = window
            .keys
            .into_iter()
            .map(|rate| {
                let family = Key::parse(&rate.key).ok().map(|key| families.resolve(&key));
                HotKeyView {
                    family: family.map_or_else(|| "default".into(), |f| f.name().to_owned()),
                    copies: family.map_or(1, |f| f.copies),
                    policy: "observe",
                    key: rate.key,
                    rate: rate.rate,
                    store_rate: rate.store_rate,
                    rate_error: rate.rate_error,
                    share: rate.share,
                    hot: rate.hot,
                    hot_since_ms: rate.hot_since_ms,
                }
            })
            .collect();
        HotKeysView {
            enabled: config.enabled,
            sample_every: config.sample_every,
            window_ms: u64::try_from(config.window.as_millis()).unwrap_or(u64::MAX),
            threshold: config.threshold,
            closed_at_ms: window.closed_at_ms,
            reads_per_s: window.reads_per_s,
            keys,
            other_hot: window.other_hot,
        }
    }
}
