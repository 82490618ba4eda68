//! `GET /v1/hot-keys`: the instance's hot keys (`crate::hot`) as an operator reads them,
//! and the fleet's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::FleetView;
use crate::family::Families;
use crate::hot::HotKeys;
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
    /// What a hot key of its family leads to: `observe` (detected and reported only: a family
    /// with no `split` table, or `split.mode = "observe"`) or `split` (split automatically).
    pub policy: &'static str,
    /// Whether its family's `split` table would split it now (hot, at or above
    /// `split.threshold`), whatever the mode: what an `observe` family reports it would split.
    pub would_split: bool,
    /// Where it is in the split protocol (`writing`, `reading`, `leaving`, `draining`), when it
    /// has copies of its own; null: unsplit.
    pub split_phase: Option<&'static str>,
}

/// The instance's detector and its last window.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotKeysView {
    /// Whether reads are sampled (`hot_keys.enabled`).
    pub enabled: bool,
    /// One read in this many is sampled now (it follows the read rate: see
    /// `hot_keys.samples_per_s`).
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
    /// Keys hot now that are not listed (cooling, below the listed ones, or found hot in the
    /// window still open).
    pub other_hot: Vec<String>,
}

/// `GET /v1/hot-keys`: this instance's detector, and the fleet's hot keys summed from every
/// instance's published figures.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct HotKeysAnswer {
    /// This instance's last window, live.
    pub instance: HotKeysView,
    /// Every instance's most read keys, summed.
    pub fleet: FleetHotKeys,
}

/// The fleet's hot keys: each instance publishes its 5 most read keys with its figures every
/// `fleet.heartbeat_interval` (the status record beside its registry entry), and any instance
/// sums them per key, so a key is seen fleet-wide within one heartbeat of an instance seeing it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema, Default)]
pub struct FleetHotKeys {
    /// Instances the registry lists (this one always).
    pub instances: usize,
    /// Of those, the ones whose figures carry hot keys (older releases publish none).
    pub reporting: usize,
    /// Keys by their summed rate, most first (at most `hot_keys.list`).
    pub keys: Vec<FleetHotKey>,
}

/// One key over the fleet.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema, PartialEq)]
pub struct FleetHotKey {
    /// The key.
    pub key: String,
    /// Reads per second asked, summed over the instances that list it.
    pub rate: f64,
    /// Of those, reads per second that reached Redis.
    pub store_rate: f64,
    /// The instances that list it among their most read keys.
    pub instances: Vec<String>,
    /// The instances where it is hot.
    pub hot_on: Vec<String>,
}

impl FleetHotKey {
    /// `key`, listed and hot nowhere yet.
    fn none(key: &str) -> FleetHotKey {
        FleetHotKey {
            key: key.to_owned(),
            rate: 0.0,
            store_rate: 0.0,
            instances: Vec::new(),
            hot_on: Vec::new(),
        }
    }
}

impl FleetHotKeys {
    /// Sums the hot keys of every member of `fleet` that published some, at most `list` keys.
    pub fn of(fleet: &FleetView, list: usize) -> FleetHotKeys {
        let mut keys: BTreeMap<String, FleetHotKey> = BTreeMap::new();
        let mut reporting = 0;
        for member in &fleet.instances {
            let Some(listed) = member
                .status
                .as_ref()
                .and_then(|status| status.get("hot_keys"))
                .and_then(|hot| hot.get("keys"))
                .and_then(Value::as_array)
            else {
                continue;
            };
            reporting += 1;
            for entry in listed {
                let Some(key) = entry.get("key").and_then(Value::as_str) else {
                    continue;
                };
                let number = |field: &str| entry.get(field).and_then(Value::as_f64).unwrap_or(0.0);
                let summed = keys
                    .entry(key.to_owned())
                    .or_insert_with(|| FleetHotKey::none(key));
                summed.rate += number("rate");
                summed.store_rate += number("store_rate");
                summed.instances.push(member.instance.id.clone());
                if entry.get("hot").and_then(Value::as_bool) == Some(true) {
                    summed.hot_on.push(member.instance.id.clone());
                }
            }
            // Hot there but not among its listed keys: cooling, or found hot in its open window.
            let other_hot = member
                .status
                .as_ref()
                .and_then(|status| status.pointer("/hot_keys/other_hot"))
                .and_then(Value::as_array);
            for key in other_hot.into_iter().flatten().filter_map(Value::as_str) {
                let summed = keys
                    .entry(key.to_owned())
                    .or_insert_with(|| FleetHotKey::none(key));
                if !summed.hot_on.contains(&member.instance.id) {
                    summed.hot_on.push(member.instance.id.clone());
                }
            }
        }
        let mut keys: Vec<FleetHotKey> = keys.into_values().collect();
        // Keys hot somewhere first (one found hot in an instance's open window has no rate
        // listed yet), then by summed rate.
        keys.sort_by(|a, b| {
            a.hot_on
                .is_empty()
                .cmp(&b.hot_on.is_empty())
                .then_with(|| b.rate.total_cmp(&a.rate))
                .then_with(|| a.key.cmp(&b.key))
        });
        keys.truncate(list);
        FleetHotKeys {
            instances: fleet.instances.len(),
            reporting,
            keys,
        }
    }
}

impl HotKeysView {
    /// The view of an instance whose reads feed no detector.
    pub fn off() -> HotKeysView {
        let config = crate::hot::HotKeysConfig::default();
        HotKeysView {
            enabled: false,
            sample_every: config.sample_every,
            window_ms: u64::try_from(config.window.as_millis()).unwrap_or(u64::MAX),
            threshold: config.threshold,
            closed_at_ms: 0,
            reads_per_s: 0.0,
            keys: Vec::new(),
            other_hot: Vec::new(),
        }
    }

    /// The view of `hot`, each key's family and copies from `families`, and its split from
    /// `layouts` (`None`: no per-key layouts known).
    pub fn of(
        hot: &HotKeys,
        families: &Families,
        layouts: Option<&crate::layout::Layouts>,
    ) -> HotKeysView {
        let config = hot.config();
        let window = hot.last_window();
        let keys = window
            .keys
            .into_iter()
            .map(|rate| {
                let family = Key::parse(&rate.key).ok().map(|key| families.resolve(&key));
                let name = family.map_or("default", |f| f.name());
                let configured = family.map_or(1, |f| f.copies);
                let record = layouts.and_then(|layouts| layouts.splits().record(name, &rate.key));
                let policy = layouts.and_then(|layouts| layouts.splits().policy(name));
                HotKeyView {
                    family: name.to_owned(),
                    copies: record
                        .filter(|record| record.phase.reads())
                        .map_or(configured, |record| record.copies.max(configured)),
                    policy: match family.and_then(|f| f.split) {
                        Some(crate::split::SplitMode::Split) => "split",
                        _ => "observe",
                    },
                    would_split: policy
                        .is_some_and(|policy| rate.hot && rate.rate >= policy.threshold),
                    split_phase: record.map(|record| record.phase.as_str()),
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
            sample_every: hot.sample_every(),
            window_ms: u64::try_from(config.window.as_millis()).unwrap_or(u64::MAX),
            threshold: config.threshold,
            closed_at_ms: window.closed_at_ms,
            reads_per_s: window.reads_per_s,
            keys,
            other_hot: window.other_hot,
        }
    }
}
