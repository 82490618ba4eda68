use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

fn detector(config: HotKeysConfig) -> Arc<HotKeys> {
    HotKeys::new(config, &Metrics::new())
}

#[test]
fn one_read_in_sample_every_is_sampled() {
    let draws = 1_600_000;
    let hits = (0..draws).filter(|_| sampled(16)).count();
    let expected = draws / 16;
    assert!(
        hits.abs_diff(expected) < expected / 20,
        "{hits} sampled of {draws}, expected about {expected}"
    );
    assert!((0..1000).all(|_| sampled(1)));
}

/// The moving hotspot (Slizen's `moving-flash`): 99% of a window's reads on one key that
/// changes every window, the rest uniform over 100,000 keys. Each window's hot key is listed
/// first and found hot when its window closes; the one before cools once its cool-down passed.
#[test]
fn a_moving_hotspot_is_found_within_one_window_and_the_last_one_cools() {
    let hot = detector(HotKeysConfig {
        cool_down: Duration::from_secs(1),
        ..HotKeysConfig::default()
    });
    let mut rng = StdRng::seed_from_u64(7);
    let start = Instant::now();
    let mut cooled = Vec::new();
    for window in 0..4u32 {
        let flash = format!("flash:{window}");
        // 50,000 reads in a one-second window: 49,500 on the flash key (49,500 reads/s).
        for _ in 0..50_000 {
            if rng.random_range(0..100) == 0 {
                hot.observe(&format!("cold:{}", rng.random_range(0..100_000)), true);
            } else {
                hot.observe(&flash, false);
            }
        }
        let changes = hot.close_window(start + Duration::from_secs(u64::from(window) + 1));
        assert!(
            changes
                .iter()
                .any(|change| matches!(change, Change::Hot(key, _) if *key == flash)),
            "window {window}: {changes:?}"
        );
        let last = hot.last_window();
        assert_eq!(last.keys[0].key, flash);
        assert!(last.keys[0].hot);
        assert!(
            (last.keys[0].share - 0.99).abs() < 0.02,
            "share {}",
            last.keys[0].share
        );
        assert!(
            (last.keys[0].rate - 49_500.0).abs() < 49_500.0 * 0.1,
            "rate {}",
            last.keys[0].rate
        );
        // No cold key is hot: each is read about 0.005 times a second.
        assert!(last.keys.iter().skip(1).all(|key| !key.hot), "{last:?}");
        cooled.extend(changes.into_iter().filter_map(|change| match change {
            Change::Cooled(key) => Some(key),
            Change::Hot(..) => None,
        }));
    }
    // flash:0 and flash:1 had a full second below the cooling rate before the last close.
    assert_eq!(cooled, vec!["flash:0".to_owned(), "flash:1".to_owned()]);
    assert!(hot.is_hot("flash:3"));
    assert!(hot.is_hot("flash:2"), "cooling, not cooled yet");
}

/// Precision and recall of the hot set against the true rates: keys truly above the threshold
/// are hot, keys truly far below it are not (a Zipf-like mix of 2,000 keys; the sampler's
/// noise stays within the margin around the threshold that is left out).
#[test]
fn the_hot_set_matches_the_true_rates() {
    let hot = detector(HotKeysConfig {
        threshold: 2_000.0,
        ..HotKeysConfig::default()
    });
    let mut rng = StdRng::seed_from_u64(11);
    // Key k is read with weight 1 / (k + 1): 300,000 reads.
    let weights: Vec<f64> = (0..2000).map(|k| 1.0 / f64::from(k + 1)).collect();
    let sum: f64 = weights.iter().sum();
    let mut truth = vec![0u64; weights.len()];
    for _ in 0..300_000 {
        let mut pick = rng.random::<f64>() * sum;
        let mut key = 0;
        while key + 1 < weights.len() && pick >= weights[key] {
            pick -= weights[key];
            key += 1;
        }
        truth[key] += 1;
        hot.observe(&format!("zipf:{key}"), false);
    }
    hot.close_window(Instant::now());
    let window = hot.last_window();
    // The window lasted as long as the reads took: the true rates are over that time.
    let truth: Vec<f64> = truth.iter().map(|&n| n as f64 / window.seconds).collect();
    let found: Vec<usize> = window
        .keys
        .iter()
        .filter(|key| key.hot)
        .map(|key| key.key.as_str())
        .chain(window.other_hot.iter().map(String::as_str))
        .map(|key| key["zipf:".len()..].parse().unwrap())
        .collect();
    // The sampler's standard error at 2,000 reads/s and 1 in 16 is about 9%: judge keys
    // outside ±30% of the threshold.
    let clearly_hot: Vec<usize> = (0..truth.len())
        .filter(|&k| truth[k] >= 2_000.0 * 1.3)
        .collect();
    let clearly_cold = |k: usize| truth[k] < 2_000.0 * 0.7;
    for key in &clearly_hot {
        assert!(
            found.contains(key),
            "zipf:{key} ({} reads/s) missed: {found:?}",
            truth[*key]
        );
    }
    assert!(
        found.iter().all(|&key| !clearly_cold(key)),
        "a cold key found hot: {found:?}"
    );
    assert!(
        clearly_hot.len() >= 3,
        "the mix has hot keys to find: {clearly_hot:?}"
    );
}

#[test]
fn a_disabled_detector_counts_nothing() {
    let hot = detector(HotKeysConfig {
        enabled: false,
        ..HotKeysConfig::default()
    });
    for _ in 0..10_000 {
        hot.observe("k", false);
    }
    hot.close_window(Instant::now() + Duration::from_secs(1));
    assert!(hot.last_window().keys.is_empty());
}

#[test]
fn a_bad_config_names_its_field() {
    for (config, field) in [
        (
            HotKeysConfig {
                sample_every: 0,
                ..HotKeysConfig::default()
            },
            "hot_keys.sample_every",
        ),
        (
            HotKeysConfig {
                threshold: -1.0,
                ..HotKeysConfig::default()
            },
            "hot_keys.threshold",
        ),
        (
            HotKeysConfig {
                list: 1000,
                ..HotKeysConfig::default()
            },
            "hot_keys.list",
        ),
    ] {
        let err = config.validate().unwrap_err().to_string();
        assert!(err.contains(field), "{err}");
    }
}
