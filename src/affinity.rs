//! Client affinity: which copy a client reads.
//!
//! A client id is hashed with xxh3-64 and mapped to a copy with Lamping and Veach's jump
//! consistent hash. The mapping is stable (one client always reads one copy, so it sees each
//! copy's versions in order) and growing `N` to `N + 1` moves only about `1/(N+1)` of clients, all
//! of them to the new copy.

use xxhash_rust::xxh3::xxh3_64;

/// Jump consistent hash: maps `key` to a bucket in `0..buckets`.
///
/// `buckets` of 0 is treated as 1. This is the algorithm from "A Fast, Minimal Memory, Consistent
/// Hash Algorithm" (Lamping, Veach, 2014), with its constants.
pub fn jump_consistent_hash(mut key: u64, buckets: u32) -> u32 {
    let buckets = i64::from(buckets.max(1));
    let mut b: i64 = -1;
    let mut j: i64 = 0;
    while j < buckets {
        b = j;
        key = key.wrapping_mul(2_862_933_555_777_941_757).wrapping_add(1);
        let divisor = ((key >> 33) + 1) as f64;
        j = ((b + 1) as f64 * ((1u64 << 31) as f64 / divisor)) as i64;
    }
    // `b` is in `0..buckets`, which fits in u32 because `buckets` came from a u32.
    b as u32
}

/// The hash of a client id: xxh3-64 of its UTF-8 bytes, seed 0.
pub fn client_hash(client_id: &str) -> u64 {
    xxh3_64(client_id.as_bytes())
}

/// The copy that `client_id` reads when a key has `copies` copies.
pub fn copy_index(client_id: &str, copies: u32) -> u32 {
    jump_consistent_hash(client_hash(client_id), copies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_copy_is_always_zero() {
        for id in ["a", "b", "client-42"] {
            assert_eq!(copy_index(id, 1), 0);
            assert_eq!(copy_index(id, 0), 0);
        }
    }

    #[test]
    fn spread_is_even_for_eight_copies() {
        let mut counts = [0u32; 8];
        for i in 0..10_000 {
            counts[copy_index(&format!("client-{i}"), 8) as usize] += 1;
        }
        for (copy, count) in counts.iter().enumerate() {
            let share = f64::from(*count) / 10_000.0;
            assert!(
                (share - 0.125).abs() <= 0.015,
                "copy {copy} got {share:.4} of clients: {counts:?}"
            );
        }
    }

    #[test]
    fn growing_from_eight_to_nine_moves_few_clients_and_only_to_the_new_copy() {
        let mut moved = 0;
        for i in 0..10_000 {
            let id = format!("client-{i}");
            let (before, after) = (copy_index(&id, 8), copy_index(&id, 9));
            if before != after {
                assert_eq!(
                    after, 8,
                    "{id} moved from {before} to {after}, not to the new copy"
                );
                moved += 1;
            }
        }
        assert!(moved > 0, "no client moved at all");
        assert!(moved <= 1_500, "{moved} of 10000 clients moved");
    }

    #[test]
    fn matches_the_reference_algorithm() {
        // Vectors published with widely used ports of the paper's algorithm (go-jump's tests).
        assert_eq!(jump_consistent_hash(1, 1), 0);
        assert_eq!(jump_consistent_hash(42, 57), 43);
        assert_eq!(jump_consistent_hash(0xDEAD_10CC, 1), 0);
        assert_eq!(jump_consistent_hash(0xDEAD_10CC, 666), 361);
        assert_eq!(jump_consistent_hash(256, 1024), 520);
    }
}
