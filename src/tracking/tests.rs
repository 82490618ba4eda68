//! The table's rules, without a connection: leases, one-shot tracking, the in-flight rule,
//! `BCAST`, `NOLOOP`, `REDIRECT`, and the bounds that invalidate rather than forget.

use std::sync::Arc;
use std::time::Duration;

use super::*;

fn keys(outbox: &Outbox) -> Vec<String> {
    outbox
        .drain()
        .keys
        .iter()
        .map(|key| key.to_string())
        .collect()
}

fn tracking(limits: Limits) -> (Arc<Tracking>, Arc<Outbox>) {
    let tracking = Arc::new(Tracking::new(limits, None));
    let outbox = Outbox::new();
    tracking.open(1, &outbox);
    tracking.start(1, &outbox, Mode::default()).unwrap();
    (tracking, outbox)
}

#[test]
fn a_tracked_key_is_pushed_once_when_it_changes_and_not_again_until_read_again() {
    let (tracking, outbox) = tracking(Limits::default());
    let seq = tracking.begin(1, "post:9").unwrap();
    tracking.settle(1, "post:9", seq, Some(Duration::from_secs(10)));
    assert!(!outbox.is_ready());
    tracking.changed(["post:9", "other"]);
    assert_eq!(keys(&outbox), ["post:9"]);
    tracking.changed(["post:9"]);
    assert!(
        !outbox.is_ready(),
        "one-shot: not tracked after its invalidation"
    );
    assert_eq!(tracking.lock().tracked(), 0);
    assert_eq!(tracking.lock().bytes(), 0);
}

#[tokio::test]
async fn a_change_is_answered_once_the_connections_told_wrote_its_push() {
    let (tracking, outbox) = tracking(Limits::default());
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(10)));
    let written = tokio::spawn(tracking.changed(["k"]).written());
    tokio::task::yield_now().await;
    assert!(
        !written.is_finished(),
        "answered before the push was written"
    );
    assert_eq!(keys(&outbox), ["k"]);
    outbox.wrote();
    written.await.unwrap();
    // Nobody tracks it now: nothing to wait for.
    assert!(tracking.changed(["k"]).is_empty());
    // A change made by the tracking connection's own command: it writes the push before that
    // command's reply, so nothing waits for it (it could not write while waited for).
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(10)));
    let told = as_origin(1, async { tracking.changed(["k"]) }).await;
    assert!(told.is_empty());
    assert_eq!(keys(&outbox), ["k"]);
}

#[test]
fn a_change_while_the_read_runs_is_pushed_and_the_read_then_keeps_nothing() {
    let (tracking, outbox) = tracking(Limits::default());
    let seq = tracking.begin(1, "k").unwrap();
    tracking.changed(["k"]);
    assert_eq!(keys(&outbox), ["k"]);
    // The read that began before the change settles: nothing tracked, nothing more pushed.
    tracking.settle(1, "k", seq, Some(Duration::from_secs(10)));
    assert_eq!(tracking.lock().tracked(), 0);
    assert!(!outbox.is_ready());
}

#[test]
fn an_answer_without_a_lease_is_invalidated_at_once() {
    let (tracking, outbox) = tracking(Limits::default());
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, None);
    assert_eq!(keys(&outbox), ["k"]);
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::ZERO));
    assert_eq!(keys(&outbox), ["k"]);
    assert_eq!(tracking.lock().tracked(), 0);
}

#[tokio::test]
async fn the_clock_pushes_each_key_when_its_lease_ends_and_not_before() {
    let (tracking, outbox) = tracking(Limits::default());
    let shutdown = CancellationToken::new();
    let clock = tokio::spawn(tracking.clone().run_clock(shutdown.clone()));
    let start = tokio::time::Instant::now();
    for (key, ms) in [("late", 300), ("early", 100)] {
        let seq = tracking.begin(1, key).unwrap();
        tracking.settle(1, key, seq, Some(Duration::from_millis(ms)));
    }
    outbox.ready().await;
    assert_eq!(keys(&outbox), ["early"]);
    assert!(start.elapsed() >= Duration::from_millis(100));
    outbox.ready().await;
    assert_eq!(keys(&outbox), ["late"]);
    assert!(start.elapsed() >= Duration::from_millis(300));
    shutdown.cancel();
    clock.await.unwrap();
}

#[tokio::test]
async fn bcast_is_told_every_change_under_its_prefixes_and_noloop_not_its_own() {
    let tracking = Tracking::new(Limits::default(), None);
    let (all, some, quiet) = (Outbox::new(), Outbox::new(), Outbox::new());
    for (id, outbox) in [(1, &all), (2, &some), (3, &quiet)] {
        tracking.open(id, outbox);
    }
    let bcast = |prefixes: &[&str], noloop| Mode {
        bcast: true,
        prefixes: prefixes.iter().map(|p| p.as_bytes().to_vec()).collect(),
        noloop,
        redirect: 0,
    };
    tracking.start(1, &all, bcast(&[], false)).unwrap();
    tracking
        .start(2, &some, bcast(&["user:", "post:"], false))
        .unwrap();
    tracking.start(3, &quiet, bcast(&[], true)).unwrap();
    // A key a BCAST connection read is tracked too (its lease is kept), and told once.
    let seq = tracking.begin(2, "post:1").unwrap();
    tracking.settle(2, "post:1", seq, Some(Duration::from_secs(5)));
    tracking.changed(["post:1", "feed:2"]);
    assert_eq!(keys(&all), ["post:1", "feed:2"]);
    assert_eq!(keys(&some), ["post:1"]);
    assert_eq!(keys(&quiet), ["post:1", "feed:2"]);
    // Connection 3's own change is not pushed to it.
    as_origin(3, async { tracking.changed(["user:7"]) }).await;
    assert_eq!(keys(&all), ["user:7"]);
    assert_eq!(keys(&some), ["user:7"]);
    assert!(!quiet.is_ready());
}

#[test]
fn redirected_invalidations_reach_the_target_and_its_close_closes_the_source() {
    let tracking = Tracking::new(Limits::default(), None);
    let (source, target) = (Outbox::new(), Outbox::new());
    tracking.open(1, &source);
    tracking.open(2, &target);
    let redirect = |to| Mode {
        redirect: to,
        ..Mode::default()
    };
    assert_eq!(
        tracking.start(1, &source, redirect(9)),
        Err(Refused::NoSuchClient)
    );
    tracking.start(1, &source, redirect(2)).unwrap();
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(5)));
    tracking.changed(["k"]);
    assert_eq!(keys(&target), ["k"]);
    assert!(!source.is_ready());
    tracking.close(2);
    assert_eq!(source.drain().close, Some(Close::RedirectGone));
    assert!(!tracking.is_tracking(1));
}

#[test]
fn full_tables_invalidate_keys_to_make_room_and_never_forget_one() {
    let per_key = |key: &str| key.len() + table::ENTRY_OVERHEAD;
    let limits = Limits {
        max_bytes_per_connection: per_key("k:00") * 3,
        max_bytes: per_key("k:00") * 5,
        ..Limits::default()
    };
    let tracking = Tracking::new(limits, None);
    let (a, b) = (Outbox::new(), Outbox::new());
    for (id, outbox) in [(1, &a), (2, &b)] {
        tracking.open(id, outbox);
        tracking.start(id, outbox, Mode::default()).unwrap();
    }
    let mut pushed = 0;
    for n in 0..10 {
        for id in [1, 2] {
            let key = format!("k:{n:02}");
            let seq = tracking.begin(id, &key).unwrap();
            tracking.settle(id, &key, seq, Some(Duration::from_secs(60 + n)));
        }
        let table = tracking.lock();
        assert!(table.bytes() <= limits.max_bytes, "{}", table.bytes());
        drop(table);
        pushed += a.drain().keys.len() + b.drain().keys.len();
    }
    // 20 reads, at most 5 entries kept: every other one was pushed, none dropped silently.
    let kept = tracking.lock().tracked();
    assert_eq!(kept + pushed, 20, "kept {kept}, pushed {pushed}");
    assert!(kept <= 5);
}

#[test]
fn bcast_prefixes_are_bounded_and_stop_forgets_without_a_push() {
    let limits = Limits {
        max_prefixes: 2,
        ..Limits::default()
    };
    let (tracking, outbox) = tracking(limits);
    let many = Mode {
        bcast: true,
        prefixes: vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
        ..Mode::default()
    };
    assert_eq!(
        tracking.start(1, &outbox, many),
        Err(Refused::TooManyPrefixes(2))
    );
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(5)));
    tracking.stop(1);
    tracking.changed(["k"]);
    assert!(!outbox.is_ready());
    assert_eq!(tracking.lock().tracked(), 0);
    assert_eq!(tracking.begin(1, "k"), None);
}

/// A flush pushes every key every connection tracks, one push each (never the null
/// invalidation, which node-redis applies without invalidating its reads in flight), a read in
/// flight included: that read then keeps nothing, whatever lease it found.
#[test]
fn a_flush_pushes_every_tracked_key_a_read_in_flight_included() {
    let (tracking, outbox) = tracking(Limits::default());
    let other = Outbox::new();
    tracking.open(2, &other);
    tracking.start(2, &other, Mode::default()).unwrap();
    let idle = Outbox::new();
    tracking.open(3, &idle);
    tracking.start(3, &idle, Mode::default()).unwrap();
    for (id, key) in [(1, "a"), (1, "b"), (2, "a")] {
        let seq = tracking.begin(id, key).unwrap();
        tracking.settle(id, key, seq, Some(Duration::from_secs(5)));
    }
    let reading = tracking.begin(1, "reading").unwrap();
    assert_eq!(tracking.flush_all(), 2, "two connections tracked keys");
    let mut pushed = keys(&outbox);
    pushed.sort();
    assert_eq!(pushed, ["a", "b", "reading"]);
    assert_eq!(keys(&other), ["a"]);
    assert!(
        !idle.is_ready(),
        "nothing to push where nothing was tracked"
    );
    assert_eq!(tracking.lock().tracked(), 0);
    assert_eq!(tracking.lock().bytes(), 0);

    tracking.settle(1, "reading", reading, Some(Duration::from_secs(5)));
    assert!(!outbox.is_ready());
    assert_eq!(
        tracking.lock().tracked(),
        0,
        "the read in flight keeps nothing"
    );
}

#[test]
fn a_connection_past_its_push_bound_is_one_overflow_and_keeps_every_key_up_to_it() {
    let limits = Limits {
        max_push_bytes: 1024,
        ..Limits::default()
    };
    let mut table = table::Table::new(limits);
    let outbox = Outbox::new();
    table.open(1, &outbox);
    let bcast = Mode {
        bcast: true,
        ..Mode::default()
    };
    table.start(1, &outbox, bcast).unwrap();
    let keys: Vec<String> = (0..100).map(|n| format!("k:{n:048}")).collect();
    for key in &keys {
        table.changed(key, None);
    }
    // About 90 bytes a push: the bound passed at the 12th, one connection to close; every key
    // up to it kept, in order, none after it (the connection closes with no reply after).
    let sent = table.take_sent();
    assert_eq!(sent.overflowed, 1);
    assert_eq!(sent.by_cause[Cause::Change as usize], 100);
    let drained = outbox.drain();
    assert_eq!(drained.close, Some(Close::Overflow));
    let pushed: Vec<&str> = drained.keys.iter().map(|key| &**key).collect();
    assert_eq!(pushed, keys[..12]);
}

#[test]
fn maps_give_back_the_room_of_keys_no_longer_tracked() {
    let mut table = table::Table::new(Limits::default());
    let outbox = Outbox::new();
    table.open(1, &outbox);
    table.start(1, &outbox, Mode::default()).unwrap();
    let keys: Vec<String> = (0..10_000).map(|n| format!("k:{n}")).collect();
    for key in &keys {
        let seq = table.begin(1, key).unwrap();
        table.settle(1, key, seq, Some(Duration::from_secs(60)));
    }
    assert!(table.room() >= 20_000, "{}", table.room());
    for key in &keys[10..] {
        table.changed(key, None);
    }
    // Ten keys left: the maps hold room for a few dozen, not for 10,000.
    assert_eq!(table.tracked(), 10);
    assert!(table.room() <= 256, "room for {} entries", table.room());
}

#[tokio::test]
async fn a_connection_that_does_not_write_is_waited_for_once_then_skipped_until_it_catches_up() {
    use futures_util::FutureExt;
    let (tracking, outbox) = tracking(Limits::default());
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(10)));
    // The connection never writes: the first change waits out the bound and marks it.
    tracking.changed(["k"]).written().await;
    assert!(outbox.is_stalled());
    let seq = tracking.begin(1, "k").unwrap();
    tracking.settle(1, "k", seq, Some(Duration::from_secs(10)));
    assert_eq!(tracking.changed(["k"]).written().now_or_never(), Some(()));
    // Once it wrote everything it was given, changes wait for it again.
    outbox.drain();
    outbox.wrote();
    assert!(!outbox.is_stalled());
}
