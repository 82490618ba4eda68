//! Micro-benchmarks of the per-request CPU work on the read path that does not touch Redis:
//! choosing the affine copy (`affinity::copy_index`: xxh3-64 of the client id, then jump
//! consistent hash) and validating a key (`Key::parse`).
//!
//! Target: under 100 ns per call for each. Run with `cargo bench --bench affinity`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hotsplit::affinity;
use hotsplit::key::Key;

/// How many distinct client ids a benchmark cycles through, so the hash does not run on one
/// input the branch predictor has memorised.
const CLIENT_IDS: usize = 1024;

/// Client ids shaped like real ones: 21 bytes, a prefix and 14 hex digits.
fn client_ids() -> Vec<String> {
    (0..CLIENT_IDS as u64)
        .map(|i| format!("client-{:014x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 8))
        .collect()
}

fn copy_index(c: &mut Criterion) {
    let ids = client_ids();
    let mut group = c.benchmark_group("copy_index");
    group.throughput(Throughput::Elements(1));
    for copies in [8u32, 1024] {
        group.bench_with_input(
            BenchmarkId::from_parameter(copies),
            &copies,
            |b, &copies| {
                let mut next = 0usize;
                b.iter(|| {
                    let id = &ids[next];
                    next = (next + 1) % CLIENT_IDS;
                    affinity::copy_index(black_box(id.as_str()), black_box(copies))
                });
            },
        );
    }
    group.finish();
}

fn key_parse(c: &mut Criterion) {
    let keys: Vec<String> = (0..CLIENT_IDS)
        .map(|i| format!("post:hot:{i:08}"))
        .collect();
    let mut group = c.benchmark_group("key_parse");
    group.throughput(Throughput::Elements(1));
    group.bench_function("17_bytes", |b| {
        let mut next = 0usize;
        b.iter(|| {
            let key = &keys[next];
            next = (next + 1) % CLIENT_IDS;
            Key::parse(black_box(key.as_str()))
        });
    });
    group.finish();
}

criterion_group!(benches, copy_index, key_parse);
criterion_main!(benches);
