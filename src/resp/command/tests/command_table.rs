//! The command table (each command once, found in any case) and the error prefixes' metric labels.

use super::*;

#[test]
fn the_metrics_count_every_error_prefix_under_its_own_label() {
    let prefixes: Vec<&str> = errors::Prefix::ALL.iter().map(|p| p.as_str()).collect();
    assert_eq!(prefixes, crate::resp::metrics::PREFIXES);
    assert_eq!(
        errors::Prefix::of(crate::resp::conn::OVERLOADED),
        Some(errors::Prefix::Overloaded)
    );
}

#[test]
fn every_command_is_listed_once_and_found_in_any_case() {
    for (at, spec) in table::TABLE.iter().enumerate() {
        assert!(
            table::TABLE[..at]
                .iter()
                .all(|other| other.name != spec.name),
            "{} twice",
            spec.name
        );
        let upper = spec.name.to_ascii_uppercase();
        assert_eq!(table::find(upper.as_bytes()).unwrap().name, spec.name);
    }
}
