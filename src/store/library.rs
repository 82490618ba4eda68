//! The Redis Functions library's identity: its version, its name and the names of its functions,
//! one constant each, for the store, the benches, the scrub, the docs and the tests.
//!
//! Function names are global across libraries in Redis, so two releases can run side by side on
//! one cluster (a rolling upgrade) only if each release calls functions of its own. The version
//! is therefore part of every name: library `hotsplit_v2` registers `hotsplit_cas_v2`,
//! `hotsplit_alloc_v2`, `hotsplit_layout_v2`, `hotsplit_live_v2` and `hotsplit_lease_v2`. The release before versioned
//! names ran library `hotsplit` with `hotsplit_cas` …; it counts as version 1
//! ([`LEGACY_LIBRARY_NAME`]).
//!
//! A version names one Lua source exactly. It is bumped when, and only when, the source changes:
//! [`RELEASED`] records the SHA-256 of every version's source, and a unit test fails when
//! `hotsplit.lua` no longer matches the digest recorded for [`LIBRARY_VERSION`]. Because one name
//! means one source, an instance may load its own library with `FUNCTION LOAD REPLACE`: the only
//! library it can replace is its own version's, with the same code. Another release's library is
//! never replaced; it is deleted (`FUNCTION DELETE`) only once no registered instance runs it
//! (`fleet::retire`).
//!
//! This module uses no fred: it is names and text, shared by everything that speaks the library.

use std::fmt;

/// The version of the function library this release runs.
pub(crate) const LIBRARY_VERSION: u32 = 2;

/// The library this release loads (`#!lua name=hotsplit_v2`).
pub const LIBRARY_NAME: &str = "hotsplit_v2";

/// The versioned compare-and-set of one copy.
pub const CAS_FUNCTION: &str = "hotsplit_cas_v2";

/// The version counter of `allocated` families.
pub const ALLOC_FUNCTION: &str = "hotsplit_alloc_v2";

/// The compare-and-set of a family's layout record.
pub const LAYOUT_FUNCTION: &str = "hotsplit_layout_v2";

/// The refresh of one instance's entry in a family's live set.
pub(crate) const LIVE_FUNCTION: &str = "hotsplit_live_v2";

/// The lease of a fleet-wide job (the scrub's): one holder at a time.
pub(crate) const LEASE_FUNCTION: &str = "hotsplit_lease_v2";

/// The Lua source of [`LIBRARY_NAME`].
pub(crate) const LIBRARY_SOURCE: &str = include_str!("redis/hotsplit.lua");

/// The library of the release before versioned names (version 1): its functions were
/// `hotsplit_cas`, `hotsplit_alloc`, `hotsplit_layout` and `hotsplit_live`.
pub const LEGACY_LIBRARY_NAME: &str = "hotsplit";

/// Every library version released, with the SHA-256 (hex) of its Lua source, oldest first.
///
/// Never edit a recorded digest: a changed source is a new version (append it, bump
/// [`LIBRARY_VERSION`] and rename the library and its functions). Version 1's source is kept as
/// `tests/fixtures/hotsplit-v1.lua`, which the rolling-upgrade test loads.
#[cfg(any(test, feature = "test-util"))]
pub const RELEASED: &[(u32, &str)] = &[
    (
        1,
        "8fb111fe218a12ea5f1e4cd401dc0fdc138a81b5103bb7a900f2e732d1237eb8",
    ),
    (
        2,
        "889ea2b0592b82fdaecc9fa95182a98d0930140ebdf637da7875a7b47d13a728",
    ),
];

/// The names one release's library goes by in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FunctionLibrary {
    /// The library's name (`#!lua name=…`), what `FUNCTION LIST` and `FUNCTION DELETE` take.
    pub name: &'static str,
    /// The Lua source `FUNCTION LOAD` sends.
    pub source: &'static str,
    /// The compare-and-set of one copy.
    pub cas: &'static str,
    /// The version counter.
    pub alloc: &'static str,
    /// The layout record's compare-and-set.
    pub layout: &'static str,
    /// The live-set refresh.
    pub live: &'static str,
    /// The lease of fleet-wide jobs; `None` in version 1, which had none (an instance of that
    /// release never scrubs).
    pub lease: Option<&'static str>,
}

impl FunctionLibrary {
    /// This release's library.
    pub(crate) const CURRENT: FunctionLibrary = FunctionLibrary {
        name: LIBRARY_NAME,
        source: LIBRARY_SOURCE,
        cas: CAS_FUNCTION,
        alloc: ALLOC_FUNCTION,
        layout: LAYOUT_FUNCTION,
        live: LIVE_FUNCTION,
        lease: Some(LEASE_FUNCTION),
    };

    /// The library of the release before versioned names (version 1), over its `source`
    /// (`tests/fixtures/hotsplit-v1.lua`): what an instance of that release calls.
    pub const fn legacy(source: &'static str) -> FunctionLibrary {
        FunctionLibrary {
            name: LEGACY_LIBRARY_NAME,
            source,
            cas: "hotsplit_cas",
            alloc: "hotsplit_alloc",
            layout: "hotsplit_layout",
            live: "hotsplit_live",
            lease: None,
        }
    }

    /// Every function name, in the order the source registers them.
    #[cfg(test)]
    pub(crate) fn functions(&self) -> Vec<&'static str> {
        [self.cas, self.layout, self.alloc, self.live]
            .into_iter()
            .chain(self.lease)
            .collect()
    }

    /// The library's version, from its name.
    pub fn version(&self) -> Option<LibraryVersion> {
        LibraryVersion::of(self.name)
    }
}

/// The version of a hotsplit function library, read from its name: `hotsplit` is 1,
/// `hotsplit_v<N>` is N (N ≥ 2). Any other name is not a hotsplit library.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibraryVersion(pub u32);

impl LibraryVersion {
    /// This release's version.
    pub const CURRENT: LibraryVersion = LibraryVersion(LIBRARY_VERSION);

    /// The version of the library named `name`, or `None` when it is not a hotsplit library
    /// (another application's, or a name this scheme never gives: `hotsplit_v1`,
    /// `hotsplit_v02`).
    pub fn of(name: &str) -> Option<LibraryVersion> {
        if name == LEGACY_LIBRARY_NAME {
            return Some(LibraryVersion(1));
        }
        let digits = name.strip_prefix("hotsplit_v")?;
        if digits.is_empty()
            || digits.len() > 9
            || digits.starts_with('0')
            || !digits.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let version: u32 = digits.parse().ok()?;
        (version >= 2).then_some(LibraryVersion(version))
    }

    /// The library name of this version.
    pub fn library_name(self) -> String {
        if self.0 <= 1 {
            LEGACY_LIBRARY_NAME.to_owned()
        } else {
            format!("hotsplit_v{}", self.0)
        }
    }
}

impl fmt::Display for LibraryVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The SHA-256 of `source`, in lowercase hex: what [`RELEASED`] records.
#[cfg(any(test, feature = "test-util"))]
pub fn source_digest(source: &str) -> String {
    ring::digest::digest(&ring::digest::SHA256, source.as_bytes())
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_matches_the_digest_recorded_for_its_version() {
        let recorded = RELEASED
            .iter()
            .find(|(version, _)| *version == LIBRARY_VERSION)
            .map(|(_, digest)| *digest);
        assert_eq!(
            RELEASED.last().map(|(version, _)| *version),
            Some(LIBRARY_VERSION),
            "LIBRARY_VERSION must be the newest version RELEASED records"
        );
        assert_eq!(
            Some(source_digest(LIBRARY_SOURCE).as_str()),
            recorded,
            "hotsplit.lua changed without a new library version: append a version to RELEASED \
             with the new digest, bump LIBRARY_VERSION, and rename the library and its functions \
             (a running release keeps calling the functions of its own version)"
        );
    }

    #[test]
    fn the_source_declares_the_names_of_its_version() {
        let library = FunctionLibrary::CURRENT;
        assert!(LIBRARY_SOURCE.starts_with(&format!("#!lua name={}\n", library.name)));
        assert_eq!(library.version(), Some(LibraryVersion::CURRENT));
        let suffix = format!("_v{LIBRARY_VERSION}");
        for name in library.functions() {
            assert!(
                name.starts_with("hotsplit_") && name.ends_with(&suffix),
                "{name}"
            );
        }
        let registered: Vec<&str> = LIBRARY_SOURCE
            .lines()
            .filter_map(|line| line.strip_prefix("redis.register_function('"))
            .filter_map(|rest| rest.split_once('\'').map(|(name, _)| name))
            .collect();
        assert_eq!(registered, library.functions());
    }

    #[test]
    fn versions_are_read_from_library_names_only_in_their_one_spelling() {
        assert_eq!(LibraryVersion::of("hotsplit"), Some(LibraryVersion(1)));
        assert_eq!(LibraryVersion::of("hotsplit_v2"), Some(LibraryVersion(2)));
        assert_eq!(LibraryVersion::of("hotsplit_v17"), Some(LibraryVersion(17)));
        for other in [
            "hotsplit_v1",
            "hotsplit_v0",
            "hotsplit_v02",
            "hotsplit_v",
            "hotsplit_v2x",
            "hotsplit_v9999999999",
            "hotsplitter",
            "mylib",
            "",
        ] {
            assert_eq!(LibraryVersion::of(other), None, "{other}");
        }
        for version in [1, 2, 40] {
            let version = LibraryVersion(version);
            assert_eq!(LibraryVersion::of(&version.library_name()), Some(version));
        }
    }
}
