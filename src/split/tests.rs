//! The split state machine and the index, without a store.

use std::time::Duration;

use super::record::{decide, Facts, Phase, SplitRecord, Step};
use super::{SplitConfig, SplitIndex, SplitMode};

const COOL: Duration = Duration::from_secs(60);

fn facts(hot: bool, settled: bool, now_ms: u64) -> Facts {
    Facts {
        hot,
        may_start: true,
        settled,
        all_aware: true,
        now_ms,
        cool_down: COOL,
        max_copies: 16,
    }
}

fn record(phase: Phase, since_ms: u64, seen_ms: u64) -> SplitRecord {
    SplitRecord {
        copies: 16,
        phase,
        since_ms,
        seen_ms,
    }
}

#[test]
fn a_record_reads_back_and_anything_else_is_refused() {
    let written = record(Phase::Reading, 5, 7);
    assert_eq!(written.encode(), "16:r:5:7");
    assert_eq!(SplitRecord::decode(&written.encode()), Some(written));
    for bad in [
        "",
        "16:r:5",
        "16:x:5:7",
        "1:r:5:7",
        "16:r:5:7:9",
        "a:r:5:7",
        "2000:w:1:1",
    ] {
        assert_eq!(SplitRecord::decode(bad), None, "{bad:?}");
    }
}

#[test]
fn a_hot_key_splits_writers_first_and_readers_only_after_the_settle_time() {
    let Step::Record(created) = decide(None, &facts(true, false, 100)) else {
        panic!("a hot key starts a split");
    };
    assert_eq!(created.phase, Phase::Writing);
    assert!(created.phase.writes() && !created.phase.reads());
    // Not settled: nothing moves (the seen time is fresh).
    assert_eq!(decide(Some(&created), &facts(true, false, 200)), Step::Stay);
    // Settled: fill, then readers.
    let Step::FillThenRecord(next) = decide(Some(&created), &facts(true, true, 300)) else {
        panic!("a settled split fills and admits readers");
    };
    assert_eq!(next.phase, Phase::Reading);
    assert!(next.phase.reads() && next.phase.writes());
    assert!(next.since_ms > created.since_ms);
}

#[test]
fn a_key_not_hot_or_over_the_caps_does_not_split() {
    assert_eq!(decide(None, &facts(false, false, 1)), Step::Stay);
    let capped = Facts {
        may_start: false,
        ..facts(true, false, 1)
    };
    assert_eq!(decide(None, &capped), Step::Stay);
}

#[test]
fn a_cooled_key_merges_readers_first_then_writers_then_its_copies_go() {
    let reading = record(Phase::Reading, 10, 10);
    // Within the cool-down after it was last seen hot: it stays.
    assert_eq!(
        decide(Some(&reading), &facts(false, true, 10 + 59_999)),
        Step::Stay
    );
    let Step::Record(leaving) = decide(Some(&reading), &facts(false, true, 10 + 60_000)) else {
        panic!("a cooled key merges");
    };
    assert_eq!(leaving.phase, Phase::Leaving);
    assert!(leaving.phase.writes() && !leaving.phase.reads());
    assert_eq!(
        decide(Some(&leaving), &facts(false, false, 70_000)),
        Step::Stay
    );
    let Step::Record(draining) = decide(Some(&leaving), &facts(false, true, 80_000)) else {
        panic!("writers leave after the settle time");
    };
    assert_eq!(draining.phase, Phase::Draining);
    assert!(!draining.phase.writes() && !draining.phase.reads());
    assert_eq!(
        decide(Some(&draining), &facts(false, false, 90_000)),
        Step::Stay
    );
    assert_eq!(
        decide(Some(&draining), &facts(false, true, 90_000)),
        Step::DeleteThenRemove
    );
}

#[test]
fn a_key_hot_again_while_merging_starts_over_from_writing() {
    for phase in [Phase::Leaving, Phase::Draining] {
        let merging = record(phase, 10, 10);
        let Step::Record(again) = decide(Some(&merging), &facts(true, false, 500)) else {
            panic!("hot again while {phase:?}");
        };
        assert_eq!(again.phase, Phase::Writing, "{phase:?}");
        assert_eq!(again.seen_ms, 500);
        // A new stage: the settle time and the fill start over.
        assert_ne!(again.stage(), merging.stage());
    }
}

#[test]
fn an_instance_that_sees_the_key_hot_refreshes_its_seen_time_without_a_new_stage() {
    let reading = record(Phase::Reading, 10, 10);
    let Step::Record(touched) = decide(Some(&reading), &facts(true, false, 10 + 15_000)) else {
        panic!("seen hot a quarter of the cool-down later");
    };
    assert_eq!(touched.seen_ms, 10 + 15_000);
    assert_eq!(touched.stage(), reading.stage());
    assert_eq!(
        decide(Some(&reading), &facts(true, false, 10 + 14_000)),
        Step::Stay
    );
}

#[test]
fn the_index_reads_split_copies_only_while_reading_and_writes_them_until_draining() {
    let index = SplitIndex::default();
    assert_eq!(index.read_copies("p:", "p:a"), None);
    for (phase, reads, writes) in [
        (Phase::Writing, None, Some(16)),
        (Phase::Reading, Some(16), Some(16)),
        (Phase::Leaving, None, Some(16)),
        (Phase::Draining, None, None),
    ] {
        index.set("p:", "p:a", Some(record(phase, 1, 1)));
        assert_eq!(index.read_copies("p:", "p:a"), reads, "{phase:?}");
        assert_eq!(index.write_copies("p:", "p:a"), writes, "{phase:?}");
        assert_eq!(index.read_copies("p:", "p:b"), None);
        assert_eq!(index.count("p:"), 1);
    }
    index.set("p:", "p:a", None);
    assert_eq!(index.count("p:"), 0);
    assert_eq!(index.write_copies("p:", "p:a"), None);
}

#[test]
fn split_copies_are_named_to_the_scrub_only_from_a_recent_read_of_the_records() {
    let index = SplitIndex::default();
    let before = std::time::Instant::now();
    let read_at = before + Duration::from_millis(10);
    let records = |phase| [("p:a".to_owned(), record(phase, 1, 1))].into();
    // Known only from this instance's own move: no read of the records says so yet.
    index.set("p:", "p:a", Some(record(Phase::Reading, 1, 1)));
    assert_eq!(index.write_copies_read_since("p:", "p:a", before), None);
    index.load("p:", records(Phase::Leaving), read_at);
    assert_eq!(index.write_copies_read_since("p:", "p:a", before), Some(16));
    assert_eq!(
        index.write_copies_read_since("p:", "p:a", read_at),
        Some(16)
    );
    // A read older than asked for (a refresh that keeps failing) names nothing.
    let later = read_at + Duration::from_millis(1);
    assert_eq!(index.write_copies_read_since("p:", "p:a", later), None);
    // Draining: publishes no longer write the split copies.
    index.load("p:", records(Phase::Draining), later);
    assert_eq!(index.write_copies_read_since("p:", "p:a", before), None);
    assert_eq!(index.write_copies_read_since("p:", "p:b", before), None);
}

#[test]
fn every_split_field_is_checked_by_name() {
    let good = SplitConfig {
        mode: SplitMode::Split,
        max_copies: 16,
        threshold: 10.0,
        cool_down: COOL,
        max_split_keys: 64,
        max_splits_per_minute: 10,
    };
    assert!(good.validate("family[0].split", 1).is_ok());
    let cases = [
        (
            SplitConfig {
                max_copies: 1,
                ..good.clone()
            },
            "family[0].split.max_copies",
        ),
        (
            SplitConfig {
                max_copies: 2000,
                ..good.clone()
            },
            "family[0].split.max_copies",
        ),
        (
            SplitConfig {
                threshold: f64::NAN,
                ..good.clone()
            },
            "family[0].split.threshold",
        ),
        (
            SplitConfig {
                threshold: -1.0,
                ..good.clone()
            },
            "family[0].split.threshold",
        ),
        (
            SplitConfig {
                cool_down: Duration::ZERO,
                ..good.clone()
            },
            "family[0].split.cool_down",
        ),
        (
            SplitConfig {
                max_split_keys: 0,
                ..good.clone()
            },
            "family[0].split.max_split_keys",
        ),
        (
            SplitConfig {
                max_split_keys: 5000,
                ..good.clone()
            },
            "family[0].split.max_split_keys",
        ),
        (
            SplitConfig {
                max_splits_per_minute: 0,
                ..good.clone()
            },
            "family[0].split.max_splits_per_minute",
        ),
    ];
    for (config, field) in cases {
        let err = config.validate("family[0].split", 1).unwrap_err();
        assert!(err.to_string().contains(field), "{err} names {field}");
    }
}

#[test]
fn while_a_live_instance_knows_no_per_key_layouts_no_split_admits_readers_and_readers_leave() {
    let unaware = |hot, settled, now| Facts {
        all_aware: false,
        ..facts(hot, settled, now)
    };
    // Writing, settled: it would move to Reading, but it stays while an instance is unaware.
    let writing = record(Phase::Writing, 10, 10);
    assert_eq!(
        decide(Some(&writing), &unaware(false, true, 20)),
        Step::Stay
    );
    assert!(matches!(
        decide(Some(&writing), &facts(false, true, 20)),
        Step::FillThenRecord(next) if next.phase == Phase::Reading
    ));
    // Reading: readers leave at once, hot or not, settled or not, with a later `since`.
    let reading = record(Phase::Reading, 10, 10);
    for (hot, settled) in [(true, true), (true, false), (false, false)] {
        let Step::Record(next) = decide(Some(&reading), &unaware(hot, settled, 10)) else {
            panic!("readers must leave");
        };
        assert_eq!(next.phase, Phase::Leaving);
        assert!(next.since_ms > reading.since_ms);
        assert_eq!(
            (next.copies, next.seen_ms),
            (reading.copies, reading.seen_ms)
        );
    }
    // No split starts.
    assert_eq!(decide(None, &unaware(true, false, 5)), Step::Stay);
    assert!(matches!(
        decide(None, &facts(true, false, 5)),
        Step::Record(next) if next.phase == Phase::Writing
    ));
}
