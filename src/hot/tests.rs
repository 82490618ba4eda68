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
    // The window is closed one `window` (1 s) after it opened, however long the reads took
    // here: a key proves the threshold by its count within the window (`threshold x window`
    // reads), so the true rates are counts over that second, and a slow (loaded) machine
    // judges the same mix as a fast one.
    let opened = Instant::now();
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
    let window_length = HotKeysConfig::default().window;
    hot.close_window(opened + window_length);
    let window = hot.last_window();
    // The true rates, over the window's length.
    let truth: Vec<f64> = truth.iter().map(|&n| n as f64 / window.seconds).collect();
    let found: Vec<usize> = window
        .keys
        .iter()
        .filter(|key| key.hot)
        .map(|key| key.key.as_str())
        .chain(window.other_hot.iter().map(String::as_str))
        .map(|key| key["zipf:".len()..].parse().unwrap())
        .collect();
    // The reads come far faster than `samples_per_s`, so the sampling thins within the window
    // (to about one in 32 by its end): judge keys outside ±30% of the threshold.
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

/// A key is hot at the sampled read whose count proves the threshold over the window, not at
/// the window's close: listed in `other_hot` at once (or marked hot where the last window
/// lists it), and reported by the next close. One read short of it is not hot.
#[test]
fn a_key_is_found_hot_as_soon_as_its_count_proves_the_threshold() {
    let hot = detector(HotKeysConfig {
        threshold: 500.0,
        ..HotKeysConfig::default()
    });
    // Windows of exactly 1 s from here.
    let start = Instant::now();
    hot.close_window(start);
    // Below `samples_per_s` every read counts: 499 reads in a 1 s window prove 499 reads/s.
    for _ in 0..499 {
        hot.observe("rising", false);
    }
    hot.observe("listed", false);
    assert!(!hot.is_hot("rising"));
    let changes = hot.close_window(start + Duration::from_secs(1));
    assert!(changes.is_empty(), "{changes:?}");
    assert_eq!(hot.last_window().keys[0].key, "rising");
    assert!(!hot.last_window().keys[0].hot);
    // The next window: 500 reads of `listed` and of `rising` prove 500 reads/s each.
    for _ in 0..499 {
        hot.observe("listed", true);
        hot.observe("new", true);
    }
    assert!(!hot.is_hot("listed") && !hot.is_hot("new"));
    hot.observe("listed", true);
    hot.observe("new", true);
    assert!(hot.is_hot("listed") && hot.is_hot("new"));
    let window = hot.last_window();
    assert_eq!(window.other_hot, vec!["new".to_owned()], "{window:?}");
    let listed = window.keys.iter().find(|key| key.key == "listed").unwrap();
    assert!(listed.hot && listed.hot_since_ms.is_some(), "{listed:?}");
    // Found once: more reads in the same window change nothing.
    for _ in 0..100 {
        hot.observe("new", true);
    }
    let changes = hot.close_window(start + Duration::from_secs(2));
    let found: Vec<&str> = changes
        .iter()
        .map(|change| match change {
            Change::Hot(key, rate) => {
                assert!(*rate >= 500.0, "{change:?}");
                key.as_str()
            }
            Change::Cooled(key) => panic!("{key} cooled"),
        })
        .collect();
    assert_eq!(found, vec!["listed", "new"]);
    let window = hot.last_window();
    assert_eq!(window.keys[0].key, "new");
    assert!(window.keys.iter().take(2).all(|key| key.hot), "{window:?}");
    assert!(window.other_hot.is_empty(), "{window:?}");
}

/// Below `samples_per_s` every read counts, so a window's top is its true top, ties of one read
/// included; above it the sampling thins (within the window once it has sampled twice its
/// share, and at the close to the window's rate), the estimates stay near the truth, and the
/// sampling comes back to every read when the rate falls.
#[test]
fn the_sampling_follows_the_read_rate_and_counts_every_read_below_samples_per_s() {
    let hot = detector(HotKeysConfig {
        samples_per_s: 1_000,
        list: 12,
        ..HotKeysConfig::default()
    });
    // Windows of exactly 1 s from here.
    let start = Instant::now();
    hot.close_window(start);
    // 500 reads: one key 400 times, then 100 keys once each.
    for _ in 0..400 {
        hot.observe("top", false);
    }
    for n in 0..100 {
        hot.observe(&format!("once:{n}"), false);
    }
    assert_eq!(hot.sample_every(), 1);
    hot.close_window(start + Duration::from_secs(1));
    let window = hot.last_window();
    assert_eq!(window.reads_per_s, 500.0);
    assert_eq!(window.keys[0].rate, 400.0);
    assert!(
        window
            .keys
            .iter()
            .skip(1)
            .all(|key| key.rate == 1.0 && key.rate_error == 0.0),
        "{window:?}"
    );
    assert_eq!(window.keys.len(), 12);
    // A surge: 200,000 reads in the next window. Past 2,000 samples the sampling thins.
    let mut rng = StdRng::seed_from_u64(3);
    for _ in 0..200_000 {
        if rng.random_range(0..4) == 0 {
            hot.observe(&format!("cold:{}", rng.random_range(0..1000)), false);
        } else {
            hot.observe("surge", false);
        }
    }
    let thinned = hot.sample_every();
    assert!(thinned >= 16, "one in {thinned}");
    hot.close_window(start + Duration::from_secs(2));
    let window = hot.last_window();
    assert!(
        (window.reads_per_s - 200_000.0).abs() < 200_000.0 * 0.1,
        "{}",
        window.reads_per_s
    );
    assert_eq!(window.keys[0].key, "surge");
    assert!(
        (window.keys[0].rate - 150_000.0).abs() < 150_000.0 * 0.1,
        "{:?}",
        window.keys[0]
    );
    // At the close: about one in 200,000 / 1,000.
    assert!(
        (190..=210).contains(&hot.sample_every()),
        "{}",
        hot.sample_every()
    );
    // A quiet window brings it back to every read.
    hot.observe("top", false);
    hot.close_window(start + Duration::from_secs(3));
    assert_eq!(hot.sample_every(), 1);
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
                sample_every: 1 << 20,
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
