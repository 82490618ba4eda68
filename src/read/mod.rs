//! The affine read path: copy choice → version floor → sibling fallback.
//!
//! A client reads the copy chosen by [`affinity::copy_index`] of its id, so it sees each copy's
//! versions in order. A reader may carry a floor (the highest version it has seen, from
//! `min_version` or `If-None-Match`); a copy below the floor is never served. When the affine
//! copy is below the floor, missing or unreachable, the affine copy's answer and up to
//! `fallback_copies` siblings (read in parallel) are compared and the highest version wins.
//! A read served away from where the reader's next read goes (a sibling, or a primary while
//! replicas exist) leaves the version served as the reader's seen floor on this instance for the
//! family's `pin_window` ([`Router::record_seen`]); past that window, or through another
//! instance, only a floor the client carries itself keeps it from the affine copy's older
//! version. At an equal version a tombstone wins over a value, as in the compare-and-set.
//!
//! With a near cache ([`crate::near`], `near` below), a read of a class with a near-cache max
//! age first looks at the affine copy's entry: an entry young enough for the class that meets
//! every floor answers. Otherwise the read waits for one fill of that copy from its source
//! (shared by every concurrent miss), and reads whose floor the fill does not meet, or that it
//! finds below the copy's high-water version, go on as without a cache.
//!
//! # Layout
//! One read is one [`Reader::read`] (here: metrics, the deadline) over these steps, each file
//! calling only the ones after it:
//! - `prepare`: the copy, the route and the floors, settled with no store call, in one value
//!   (`Prepared`) the other steps take;
//! - `path`: the affine copy (through `near` when the class has a near-cache max age), the
//!   sibling fallback, then `decide`, repair and the floor left on this instance;
//! - `near`: hits, single-flight fills, offers and high-water versions;
//! - `consult`: one copy read where the plan sends it (replica or primary), and the breach error;
//! - `decide`: which consulted record answers, and the repair it calls for.

mod consult;
mod decide;
mod near;
mod path;
mod prepare;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::affinity;
use crate::deadline::{self, Deadline};
use crate::error::{ErrorKind, Result};
use crate::family::Families;
use crate::heal::Repairer;
use crate::hot::HotKeys;
use crate::key::{CopyKey, Key, Placement, Version};
use crate::layout::Layouts;
use crate::metrics::{Metrics, ReadOutcome};
use crate::near::{NearCache, Now};
use crate::route::{Floors, ReadClass, RouteReason, Router};
use crate::store::{CopyRead, CopyStore, ServedBy};
use decide::{decide, repair_of, Decision};

/// The read path.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReadConfig {
    /// How many sibling copies a read consults when its affine copy is below the floor, missing
    /// or unreachable. Default: 2.
    pub fallback_copies: u32,
    /// The `Retry-After` sent with 503 answers. Default: `1s`.
    #[serde(with = "crate::duration")]
    pub retry_after: Duration,
}

impl Default for ReadConfig {
    fn default() -> Self {
        ReadConfig {
            fallback_copies: 2,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// Who a read is for: it decides the copy the read targets and the floors it brings. A door
/// says which of these its caller is; what each brings is decided below the doors (`ops`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A client that named itself (HTTP's `client_id`, the Redis door's `HOTSPLIT.CLIENT`): the
    /// copy its id hashes to, and the floors this instance holds for it.
    Client(String),
    /// A connection of a pool that named no client (the Redis door's): reads as the
    /// connection's own id (made by [`crate::ops::Ops::pooled`]), and takes the instance's
    /// high-water of the key as a floor (`ops`), since the application's next command may go
    /// out on another connection.
    Pooled(Arc<str>),
    /// One named copy, for operators and tests: no client, no fallback.
    Named(u32),
}

impl Caller {
    /// The client id the read goes as; `None` for a named copy.
    pub fn client_id(&self) -> Option<&str> {
        match self {
            Caller::Client(id) => Some(id),
            Caller::Pooled(id) => Some(id),
            Caller::Named(_) => None,
        }
    }
}

/// One read, as a door parsed it: the one type every door builds, the operations layer
/// ([`crate::ops::Ops::read`]) takes and the read path serves.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    /// The key to read.
    pub key: Key,
    /// Who the read is for.
    pub caller: Caller,
    /// A version floor the caller sent itself (`min_version`, `MINVERSION`): a copy below it is
    /// never served.
    pub min_version: Option<Version>,
    /// The highest version among the caller's entity tags (`If-None-Match`): a floor too, and
    /// the answer is "not modified" when no consulted copy is newer.
    pub if_none_match: Option<Version>,
    /// The read class the caller named; `None` uses the family's default class (or, on the
    /// Redis door, the connection's).
    pub class: Option<String>,
    /// The caller's request id (`Hotsplit-Request`): pinned to primaries after that request
    /// wrote.
    pub request_id: Option<String>,
    /// When the read must be answered: every store call it makes is bounded by it, and past it
    /// the read fails with [`ErrorKind::DeadlineExceeded`]. `None`: only the store's own
    /// command timeout bounds each call.
    pub deadline: Option<Deadline>,
}

/// The floors a read brings besides its own, which the operations layer fills from what the
/// caller carries (`crate::ops`): its session token's floors for the key, and for a pooled
/// caller the instance's high-water.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Carried {
    /// The session token's floors for this key: honoured exactly as this instance's own memory
    /// of the client (a written floor as an own-write floor, a served one as a seen floor).
    pub session: Floors,
    /// A floor the read must meet: a version this instance answered or accepted for this very
    /// key (the high-water's exact record). Like `min_version`, never undercut: below it the
    /// answer is `BelowVersionFloor`.
    pub floor: Option<Version>,
    /// A floor that may over-state (the high-water's estimate, shared with other keys): a copy
    /// below it is not served while another consulted copy holds more, but when none does the
    /// newest is served, as a near-cache rollback is.
    pub estimate: Option<Version>,
}

/// What a read found, short of an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A value or "not modified".
    Answer(ReadAnswer),
    /// The newest consulted record is a tombstone at or above every floor (a 404).
    Invalidated {
        /// The tombstone's version: what the reader was shown.
        version: Version,
        /// When the tombstone's copy expires, Unix ms.
        expire_at_ms: u64,
    },
    /// No consulted copy holds the key.
    Missing,
}

/// The floors a read leaves, as the read path found them; the operations layer records them in
/// its one after-answer step (`crate::ops`), which is the only writer of each.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trail {
    /// The version the read showed the reader (a value's, a "not modified"'s, a tombstone's)
    /// and when its copy expires, Unix ms: the floor it leaves in the caller's session and the
    /// instance's high-water.
    pub shown: Option<(Version, u64)>,
    /// A seen floor to hold for the client on this instance, when the read was served from
    /// somewhere its next read may not go (see `Reader::remember`).
    pub seen: Option<Version>,
    /// The near-cache copy whose entry and record a rollback voids: every consulted copy was
    /// below the version this instance served from it.
    pub void_near: Option<CopyKey>,
}

/// One read's outcome: what it found and the floors it leaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    /// What it found.
    pub found: Found,
    /// The floors it leaves.
    pub trail: Trail,
}

impl Read {
    /// The answer as the read path's callers see it: a tombstone or a missing key is
    /// [`ErrorKind::NotFound`] (with the tombstone's version, [`crate::Error::invalidated_at`]).
    ///
    /// # Errors
    /// [`ErrorKind::NotFound`] when nothing was found.
    pub fn into_answer(self) -> Result<ReadAnswer> {
        match self.found {
            Found::Answer(answer) => Ok(answer),
            Found::Invalidated { version, .. } => Err(crate::Error::invalidated(version.get())),
            Found::Missing => Err(crate::Error::new(ErrorKind::NotFound, "key not found")),
        }
    }
}

/// Where and why a read was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteNote {
    /// The read's class.
    pub class: ReadClass,
    /// Why the serving node was chosen (for a near-cache answer: why the node that filled the
    /// entry served the fill).
    pub reason: RouteReason,
    /// For an answer from the near cache, the entry's age bound when served (the source's lag
    /// at fill plus the entry's age); `None` for an answer read from the store.
    pub near_cache_age: Option<Duration>,
}

impl RouteNote {
    /// What every door says after the prefix for an answer from the near cache, before the
    /// age in milliseconds.
    pub const NEAR_CACHE: &'static str = ";source=near-cache;age_ms=";

    /// The first words of every door's route note: `class=NAME;reason=REASON`.
    pub fn prefix(class_name: &str, reason: RouteReason) -> String {
        format!("class={class_name};reason={}", reason.as_str())
    }

    /// The route note as every door words it (HTTP's `Hotsplit-Route`, the Redis door's
    /// `route`): [`RouteNote::prefix`], then [`RouteNote::NEAR_CACHE`] and the age bound in
    /// milliseconds for an answer from the near cache. `class_name` is the name of `self.class`.
    pub fn text(&self, class_name: &str) -> String {
        let mut text = RouteNote::prefix(class_name, self.reason);
        if let Some(age) = self.near_cache_age {
            text.push_str(RouteNote::NEAR_CACHE);
            text.push_str(&age.as_millis().to_string());
        }
        text
    }
}

/// A successful read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadAnswer {
    /// The value of the copy that served.
    Value {
        /// The value bytes.
        value: Bytes,
        /// Its version.
        version: Version,
        /// The copy that served it.
        copy: u32,
        /// The node that served it.
        served_by: ServedBy,
        /// The class and the routing reason.
        route: RouteNote,
        /// When the served copy expires, Unix ms: how long a floor at its version lasts.
        expire_at_ms: u64,
    },
    /// No consulted copy is newer than the `If-None-Match` version.
    NotModified {
        /// The newest version consulted (at most the `If-None-Match` version).
        version: Version,
        /// The copy that answered.
        copy: u32,
        /// The node that answered.
        served_by: ServedBy,
        /// The class and the routing reason.
        route: RouteNote,
        /// When the answering copy expires, Unix ms.
        expire_at_ms: u64,
    },
}

/// Where an affinity lookup lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affinity {
    /// The copy index.
    pub copy: u32,
    /// The copy's stored key.
    pub copy_key: CopyKey,
    /// How many copies the key's family has.
    pub copies: u32,
    /// The node that owns the copy.
    pub node: String,
}

/// Serves affine reads.
pub struct Reader {
    /// Where copies live.
    store: Arc<dyn CopyStore>,
    /// Copies per key family.
    families: Arc<Families>,
    /// Fallback width.
    config: ReadConfig,
    /// Read outcome counters.
    metrics: Arc<Metrics>,
    /// Classes, lag gate, pins.
    router: Arc<Router>,
    /// Writes a sibling's newer record back to a stale or missing affine copy; `None` disables
    /// read repair.
    repairer: Option<Repairer>,
    /// The instance's near cache; `None` when it is off.
    near: Option<Arc<NearCache>>,
    /// The hot-key detector every answered read is offered to; `None`: none.
    hot: Option<Arc<HotKeys>>,
    /// Which copy names each family is read under now (`layout::placing`); `None`: the
    /// configured ones.
    layouts: Option<Arc<Layouts>>,
}

/// Whether the affine copy or a sibling answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    Affine,
    Sibling,
}

impl Served {
    /// Who served, when `copy` answered a read whose affine copy is `affine`.
    fn of(copy: u32, affine: u32) -> Served {
        if copy == affine {
            Served::Affine
        } else {
            Served::Sibling
        }
    }
}

/// One consulted copy and what it held.
struct Consulted {
    copy: u32,
    read: CopyRead,
    reason: RouteReason,
}

impl Reader {
    /// A reader over `store`.
    pub fn new(
        store: Arc<dyn CopyStore>,
        families: Arc<Families>,
        config: ReadConfig,
        metrics: Arc<Metrics>,
        router: Arc<Router>,
    ) -> Reader {
        Reader {
            store,
            families,
            config,
            metrics,
            router,
            repairer: None,
            near: None,
            hot: None,
            layouts: None,
        }
    }

    /// Reads each family under the copy names `layouts` says (a `spread` family reads `K#i`
    /// until every live instance writes its tagged names). Default: the configured names.
    pub fn with_layouts(mut self, layouts: Arc<Layouts>) -> Reader {
        self.layouts = Some(layouts);
        self
    }

    /// Answers reads of classes with a near-cache max age from `near` within that age, and
    /// fills it. Default: no near cache.
    pub fn with_near_cache(mut self, near: Arc<NearCache>) -> Reader {
        self.near = Some(near);
        self
    }

    /// Offers every answered read (and every miss) to `hot`, with whether it reached Redis.
    /// Default: no detector.
    pub fn with_hot_keys(mut self, hot: Arc<HotKeys>) -> Reader {
        self.hot = Some(hot);
        self
    }

    /// The hot-key detector, when reads feed one.
    pub fn hot_keys(&self) -> Option<&Arc<HotKeys>> {
        self.hot.as_ref()
    }

    /// The near cache, when reads use one.
    pub fn near_cache(&self) -> Option<&Arc<NearCache>> {
        self.near.as_ref()
    }

    /// Repairs stale or missing affine copies found by a fallback read. Default: no repair.
    pub fn with_repairer(mut self, repairer: Repairer) -> Reader {
        self.repairer = Some(repairer);
        self
    }

    /// The key families.
    pub fn families(&self) -> &Arc<Families> {
        &self.families
    }

    /// The router reads go through.
    pub fn router(&self) -> &Arc<Router> {
        &self.router
    }

    /// The placement `key`'s copies are read under now.
    pub(crate) fn read_placement(&self, key: &Key) -> Placement {
        let family = self.families.resolve(key);
        self.layouts
            .as_ref()
            .and_then(|layouts| layouts.read_placement(family.name()))
            .unwrap_or(family.placement)
    }

    /// How many copies reads of `key` choose among: its family's, or its split copies once
    /// readers may use them (`crate::split`).
    pub(crate) fn key_copies(&self, key: &Key) -> u32 {
        let family = self.families.resolve(key);
        self.layouts.as_ref().map_or(family.copies, |layouts| {
            layouts.key_read_copies(family.name(), key.as_str(), family.copies)
        })
    }

    /// The name copy `index` of `key` is read under ([`Reader::read_placement`]).
    pub(crate) fn copy_key(&self, key: &Key, index: u32) -> CopyKey {
        key.copy_key(index, self.read_placement(key))
    }

    /// Which copy `client_id` reads for `key`, and where it lives.
    pub fn affinity(&self, key: &Key, client_id: &str) -> Affinity {
        let copies = self.key_copies(key);
        let copy = affinity::copy_index(client_id, copies);
        let copy_key = self.copy_key(key, copy);
        let node = self.store.node_of(&copy_key).to_string();
        Affinity {
            copy,
            copy_key,
            copies,
            node,
        }
    }

    /// Reads `request.key` for one caller, with the floors it `carried`: what was found, and
    /// the floors the read leaves ([`Trail`]), which the caller records (`crate::ops` does, in
    /// one step). A tombstone or a missing key is found, not an error.
    ///
    /// # Errors
    /// - [`ErrorKind::MissingClient`] when the client id is empty;
    /// - [`ErrorKind::InvalidCopy`] when a named copy is out of range;
    /// - [`ErrorKind::BelowVersionFloor`] when no consulted copy reaches the floor;
    /// - [`ErrorKind::UnknownClass`] / [`ErrorKind::ClassNotAllowed`] for a bad class;
    /// - [`ErrorKind::StalenessBudgetExceeded`] when the class fails over budget;
    /// - [`ErrorKind::Unavailable`] / [`ErrorKind::Timeout`] when no copy could be read;
    /// - [`ErrorKind::DeadlineExceeded`] when the request's deadline passed first (the store
    ///   calls still running are dropped; nothing the read does on the way is left half done:
    ///   repairs run off the request path, and floors are recorded only once an answer is
    ///   chosen, by the caller).
    pub async fn read(&self, request: &ReadRequest, carried: Carried) -> Result<Read> {
        self.read_bounded(request, carried, request.deadline).await
    }

    /// [`Reader::read`] with no timer of its own: the caller bounds the whole read by
    /// `request.deadline` (a pipelined run's reads share one deadline, and the run awaits
    /// them under one timer: `crate::resp`'s `ahead`). Its errors are [`Reader::read`]'s,
    /// but [`ErrorKind::DeadlineExceeded`], which the caller's bound gives.
    pub async fn read_under_callers_deadline(
        &self,
        request: &ReadRequest,
        carried: Carried,
    ) -> Result<Read> {
        self.read_bounded(request, carried, None).await
    }

    /// [`Reader::read`], its store reads bounded by `deadline`.
    async fn read_bounded(
        &self,
        request: &ReadRequest,
        carried: Carried,
        deadline: Option<Deadline>,
    ) -> Result<Read> {
        let result = match self.prepare(request, carried) {
            Err(err) => Err(err),
            Ok(prepared) => match self.near_hit(request, &prepared, None, None) {
                Some(hit) => hit,
                // The rest waits on the store. It is boxed so that the hit path, which
                // never builds it, does not move a future the size of every store read's
                // state through each caller's own future.
                None => {
                    box_in_place!(deadline::within(
                        deadline,
                        self.read_rest(request, prepared)
                    ))
                    .await
                }
            },
        };
        self.finish(request, result)
    }

    /// [`Reader::read`] when memory answers it (the near cache, or a refusal `prepare` makes):
    /// the same answer, decided without a future. `None`, having counted nothing, when the read
    /// needs the store, and when the affine copy's entry is
    /// below `held_to` and was filled by a primary: the rollback guard of a reader naming a
    /// client reads such an answer again (`crate::ops`'s `guard_rollback`), so the caller's
    /// slower path must run; a replica's fill below it is lag, not a set-back. The near-cache
    /// entry's expiry and age are taken by `now`, the caller's clock (read after the request
    /// arrived).
    ///
    /// # Errors
    /// As [`Reader::read`].
    pub fn read_now(
        &self,
        request: &ReadRequest,
        carried: Carried,
        held_to: Option<Version>,
        now: Now,
    ) -> Option<Result<Read>> {
        let result = match self.prepare(request, carried) {
            Err(err) => Err(err),
            Ok(prepared) => self.near_hit(request, &prepared, held_to, Some(now))?,
        };
        Some(self.finish(request, result))
    }

    /// Counts what a read concluded (the bill, the hot-key detector, the outcome) and hands
    /// it to the caller.
    fn finish(&self, request: &ReadRequest, result: Result<Concluded>) -> Result<Read> {
        match &result {
            Ok(Concluded {
                found:
                    Found::Answer(
                        ReadAnswer::Value {
                            route, served_by, ..
                        }
                        | ReadAnswer::NotModified {
                            route, served_by, ..
                        },
                    ),
                ..
            }) => {
                // An answer from the near cache was served by no node: the bill counts store
                // reads.
                if route.near_cache_age.is_none() {
                    self.count(&request.key, served_by, *route);
                }
                if let Some(hot) = &self.hot {
                    hot.observe(request.key.as_str(), route.near_cache_age.is_none());
                }
            }
            // A miss asked for the key too (and was looked up in the store).
            Ok(_) => {
                if let Some(hot) = &self.hot {
                    hot.observe(request.key.as_str(), true);
                }
            }
            Err(_) => {}
        }
        let outcome = match &result {
            Ok(Concluded {
                found: Found::Answer(ReadAnswer::NotModified { .. }),
                ..
            }) => ReadOutcome::NotModified,
            Ok(Concluded {
                found: Found::Answer(ReadAnswer::Value { .. }),
                served,
                ..
            }) => match served {
                Served::Affine => ReadOutcome::Affine,
                Served::Sibling => ReadOutcome::Fallback,
            },
            Ok(_) => ReadOutcome::NotFound,
            Err(err) => match err.kind() {
                ErrorKind::NotFound => ReadOutcome::NotFound,
                ErrorKind::BelowVersionFloor => ReadOutcome::BelowFloor,
                ErrorKind::Unavailable
                | ErrorKind::Timeout
                | ErrorKind::NodeFailing
                | ErrorKind::DeadlineExceeded => ReadOutcome::Unavailable,
                _ => return result.map(Concluded::into_read),
            },
        };
        self.metrics.read(outcome);
        result.map(Concluded::into_read)
    }
}

#[cfg(test)]
impl Reader {
    /// The read path's own tests read through this, not through `crate::ops` (which imports
    /// this module): `request` with no carried floors, its trail's seen pin and near-cache void
    /// recorded as the after-answer step (`crate::ops::Ops::leave`) records them — the parts
    /// of the step that are the reader's own (its router's pins, its near cache); the session
    /// and the high-water are the operations layer's, and no test here carries either.
    pub(crate) async fn read_for_tests(&self, request: &ReadRequest) -> Result<ReadAnswer> {
        let read = self.read(request, Carried::default()).await?;
        if let (Some(version), Some(client)) = (read.trail.seen, request.caller.client_id()) {
            self.router.record_seen(&request.key, version, client);
        }
        if let Some(copy_key) = &read.trail.void_near {
            self.void_near(copy_key);
        }
        read.into_answer()
    }
}

/// A read as the path concluded it: what it found, where, and the floors it leaves.
struct Concluded {
    /// What it found.
    found: Found,
    /// Whether the affine copy or a sibling answered.
    served: Served,
    /// The floors it leaves.
    trail: Trail,
}

impl Concluded {
    /// The outcome the read path's callers get.
    fn into_read(self) -> Read {
        Read {
            found: self.found,
            trail: self.trail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::family::fixture;
    use crate::publish::{Publisher, VersionChoice};
    use crate::route::RouteReason;
    use crate::store::memory::MemoryStore;
    use crate::store::{CopyRead, CopyRecord, Payload, ServedBy};

    impl Fixture {
        fn reader(&self) -> &Reader {
            &self.reader
        }

        fn publisher(&self) -> &Publisher {
            &self.publisher
        }

        /// Reads as a caller with no session ([`Reader::read_for_tests`]).
        async fn read_raw(&self, request: &ReadRequest) -> Result<ReadAnswer> {
            self.reader.read_for_tests(request).await
        }
    }

    struct Fixture {
        store: Arc<MemoryStore>,
        publisher: Publisher,
        reader: Reader,
    }

    fn fixture() -> Fixture {
        let text = "[[family]]\nprefix = \"p:\"\ncopies = 8";
        let families = Arc::new(fixture::families(text));
        let sections = crate::route::fixture::sections(text);
        let store = Arc::new(MemoryStore::new());
        let metrics = Metrics::new();
        Fixture {
            publisher: Publisher::new(store.clone(), families.clone(), metrics.clone()),
            reader: Reader::new(
                store.clone(),
                families.clone(),
                ReadConfig::default(),
                metrics,
                Arc::new(Router::for_tests(
                    &sections.route,
                    &sections.classes,
                    families,
                )),
            ),
            store,
        }
    }

    fn version(n: u64) -> Version {
        Version::new(n).unwrap()
    }

    fn request(client: &str, min_version: Option<u64>, if_none_match: Option<u64>) -> ReadRequest {
        ReadRequest {
            key: Key::parse("p:1").unwrap(),
            caller: Caller::Client(client.into()),
            min_version: min_version.map(version),
            if_none_match: if_none_match.map(version),
            class: None,
            request_id: None,
            deadline: None,
        }
    }

    /// `fixture`'s reader reads `p:1` as `client`, with those floors.
    async fn read(
        fixture: &Fixture,
        client: &str,
        min_version: Option<u64>,
        if_none_match: Option<u64>,
    ) -> Result<ReadAnswer> {
        fixture
            .read_raw(&request(client, min_version, if_none_match))
            .await
    }

    async fn publish(fixture: &Fixture, n: u64, value: &'static str) {
        let key = Key::parse("p:1").unwrap();
        fixture
            .publisher()
            .publish(
                &key,
                VersionChoice::Given(version(n)),
                Bytes::from_static(value.as_bytes()),
            )
            .await
            .unwrap();
    }

    /// Makes the copy `client` reads hold `n` with `value`, bypassing the compare-and-set.
    fn regress_affine_copy(fixture: &Fixture, client: &str, n: u64, value: &'static str) -> u32 {
        let affinity = fixture
            .reader()
            .affinity(&Key::parse("p:1").unwrap(), client);
        fixture.store.overwrite_for_test(
            &affinity.copy_key,
            Some(CopyRecord {
                version: version(n),
                payload: Payload::Value(Bytes::from_static(value.as_bytes())),
                expire_at_ms: crate::store::now_unix_ms() + 60_000,
            }),
        );
        affinity.copy
    }

    #[tokio::test]
    async fn reads_the_affine_copy() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let answer = read(&fixture, "alice", None, None).await.unwrap();
        let expected_copy = affinity::copy_index("alice", 8);
        assert!(
            matches!(answer, ReadAnswer::Value { ref value, copy, .. } if value == "five" && copy == expected_copy)
        );
    }

    #[tokio::test]
    async fn a_floor_skips_a_stale_affine_copy() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let affine = regress_affine_copy(&fixture, "alice", 4, "four");
        // Without a floor the stale affine copy serves (best effort).
        let answer = read(&fixture, "alice", None, None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { version: v, copy, .. } if v.get() == 4 && copy == affine)
        );
        // With a floor it is never served.
        let answer = read(&fixture, "alice", Some(5), None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { ref value, copy, .. } if value == "five" && copy != affine)
        );
        // If-None-Match 5 is a floor too: not modified, never the older body.
        let answer = read(&fixture, "alice", None, Some(5)).await.unwrap();
        assert!(matches!(answer, ReadAnswer::NotModified { version: v, .. } if v.get() == 5));
        // A floor nobody reached.
        let err = read(&fixture, "alice", Some(6), None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BelowVersionFloor);
        // If-None-Match above every copy: not modified rather than an older body.
        let answer = read(&fixture, "alice", None, Some(9)).await.unwrap();
        assert!(matches!(answer, ReadAnswer::NotModified { .. }));
    }

    #[tokio::test]
    async fn an_own_write_floor_holds_even_when_the_writers_copy_missed_the_write() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        // The write reached every copy but alice's (as if hers were queued for retry).
        let affine = regress_affine_copy(&fixture, "alice", 4, "four");
        let key = Key::parse("p:1").unwrap();
        fixture
            .reader()
            .router()
            .record_write(&key, version(5), Some("alice"), None);
        let answer = read(&fixture, "alice", None, None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { ref value, copy, .. } if value == "five" && copy != affine),
            "{answer:?}"
        );
        // Another client reading the same copy has no floor: best effort, the old value.
        let bob_copy = fixture.reader().affinity(&key, "bob").copy;
        if bob_copy == affine {
            let answer = read(&fixture, "bob", None, None).await.unwrap();
            assert!(matches!(answer, ReadAnswer::Value { version: v, .. } if v.get() == 4));
        }
    }

    #[tokio::test]
    async fn a_missing_affine_copy_falls_back_to_a_sibling_and_its_reader_does_not_go_back() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let affinity = fixture
            .reader()
            .affinity(&Key::parse("p:1").unwrap(), "alice");
        fixture.store.overwrite_for_test(&affinity.copy_key, None);
        // A sibling serves 5, and this instance remembers it as alice's seen floor.
        let answer = read(&fixture, "alice", None, None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { version: v, copy, .. } if v.get() == 5 && copy != affinity.copy)
        );
        // Her copy comes back older (a late fill): she still gets 5, from a sibling.
        regress_affine_copy(&fixture, "alice", 4, "four");
        let answer = read(&fixture, "alice", None, None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { version: v, copy, .. } if v.get() == 5 && copy != affinity.copy),
            "alice went back to 4"
        );
        // Nothing was remembered for a reader whose reads stayed on her own copy.
        let other = (0..64)
            .map(|n| format!("reader-{n}"))
            .find(|client| affinity::copy_index(client, 8) != affinity.copy)
            .unwrap();
        let answer = read(&fixture, &other, None, None).await.unwrap();
        assert!(matches!(answer, ReadAnswer::Value { version: v, .. } if v.get() == 5));
        regress_affine_copy(&fixture, &other, 3, "three");
        let answer = read(&fixture, &other, None, None).await.unwrap();
        assert!(
            matches!(answer, ReadAnswer::Value { version: v, .. } if v.get() == 3),
            "without a move and without a floor the affine copy serves as it is"
        );
    }

    #[tokio::test]
    async fn copy_zero_answers_when_every_consulted_copy_is_missing() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let key = Key::parse("p:1").unwrap();
        // As after a growth: only copy 0 holds the key.
        for copy in 1..8 {
            fixture
                .store
                .overwrite_for_test(&key.copy_key(copy, crate::key::Placement::Suffix), None);
        }
        let client = (0..100)
            .map(|n| format!("client-{n}"))
            .find(|client| (2..=5).contains(&affinity::copy_index(client, 8)))
            .unwrap();
        let answer = read(&fixture, &client, None, None).await.unwrap();
        assert!(matches!(answer, ReadAnswer::Value { copy: 0, version: v, .. } if v.get() == 5));
    }

    #[tokio::test]
    async fn tombstones_and_missing_keys_are_not_found() {
        let fixture = fixture();
        let err = read(&fixture, "alice", None, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        publish(&fixture, 5, "five").await;
        let key = Key::parse("p:1").unwrap();
        fixture
            .publisher()
            .invalidate(&key, VersionChoice::Given(version(6)))
            .await
            .unwrap();
        for inm in [None, Some(5), Some(6)] {
            let err = read(&fixture, "alice", None, inm).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::NotFound, "if-none-match {inm:?}");
        }
        // A reader that holds version 7 is never told that the key was deleted at 6.
        for (min_version, inm) in [(None, Some(7)), (Some(7), None)] {
            let err = read(&fixture, "alice", min_version, inm).await.unwrap_err();
            assert_eq!(
                err.kind(),
                ErrorKind::BelowVersionFloor,
                "{min_version:?} {inm:?}"
            );
        }
    }

    /// Makes copy `copy` of `p:1` hold `record` (or nothing), bypassing the compare-and-set.
    fn set_copy(fixture: &Fixture, copy: u32, n: u64, payload: Option<Payload>) {
        let record = payload.map(|payload| CopyRecord {
            version: version(n),
            payload,
            expire_at_ms: crate::store::now_unix_ms() + 60_000,
        });
        fixture.store.overwrite_for_test(
            &Key::parse("p:1")
                .unwrap()
                .copy_key(copy, crate::key::Placement::Suffix),
            record,
        );
    }

    #[tokio::test]
    async fn a_tombstone_wins_over_a_value_of_the_same_version_and_is_repaired_onto_the_copy() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let affine = affinity::copy_index("alice", 8);
        // Alice's copy is missing; the next sibling holds the value 5, the one after it a
        // tombstone 5 (an invalidate of the same version that reached only that copy).
        set_copy(&fixture, affine, 5, None);
        set_copy(
            &fixture,
            (affine + 1) % 8,
            5,
            Some(Payload::Value(Bytes::from_static(b"five"))),
        );
        set_copy(&fixture, (affine + 2) % 8, 5, Some(Payload::Tombstone));
        let err = read(&fixture, "alice", None, None).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::NotFound,
            "the tombstone wins the tie"
        );

        // Read repair writes the tombstone onto a copy holding the value of its version.
        let key = Key::parse("p:1").unwrap();
        let consulted = |copy, payload| Consulted {
            copy,
            read: CopyRead {
                served_by: ServedBy::embedded(),
                record: Ok(Some(CopyRecord {
                    version: version(5),
                    payload,
                    expire_at_ms: 1,
                })),
            },
            reason: RouteReason::Class,
        };
        let value = || Payload::Value(Bytes::from_static(b"five"));
        let write = repair_of(
            &key,
            0,
            crate::key::Placement::Suffix,
            &[consulted(0, value()), consulted(1, Payload::Tombstone)],
        )
        .expect("the tombstone is spread");
        assert_eq!(
            (write.copy_key, write.version, write.payload),
            (
                key.copy_key(0, crate::key::Placement::Suffix),
                version(5),
                Payload::Tombstone
            )
        );
        assert!(
            repair_of(
                &key,
                0,
                crate::key::Placement::Suffix,
                &[consulted(0, Payload::Tombstone), consulted(1, value())]
            )
            .is_none(),
            "a value never replaces a tombstone of its version"
        );
    }

    #[tokio::test]
    async fn a_tombstone_served_by_a_sibling_leaves_its_version_as_the_readers_floor() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let affine = affinity::copy_index("alice", 8);
        // Alice's copy could not be read in time (here: it is missing); a sibling holds the
        // tombstone 6 and answers 404.
        set_copy(&fixture, affine, 5, None);
        set_copy(&fixture, (affine + 1) % 8, 6, Some(Payload::Tombstone));
        let err = read(&fixture, "alice", None, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotFound);
        // Her copy then comes back with the older value: she is not shown 5 after the delete.
        set_copy(
            &fixture,
            affine,
            5,
            Some(Payload::Value(Bytes::from_static(b"five"))),
        );
        set_copy(&fixture, (affine + 1) % 8, 5, None);
        let err = read(&fixture, "alice", None, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BelowVersionFloor);
    }

    #[tokio::test]
    async fn a_sibling_that_answers_under_a_floor_leaves_the_version_it_served() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let affine = regress_affine_copy(&fixture, "alice", 4, "four");
        // Alice's floor 5 moves her read to a sibling, which holds 6.
        set_copy(
            &fixture,
            (affine + 1) % 8,
            6,
            Some(Payload::Value(Bytes::from_static(b"six"))),
        );
        let answer = read(&fixture, "alice", Some(5), None).await.unwrap();
        assert!(matches!(answer, ReadAnswer::Value { version: v, .. } if v.get() == 6));
        // Without her floor, she is still not sent back to 5 (or to her copy's 4).
        set_copy(&fixture, (affine + 1) % 8, 5, None);
        let err = read(&fixture, "alice", None, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::BelowVersionFloor);
    }

    #[tokio::test]
    async fn named_copies_are_checked() {
        let fixture = fixture();
        publish(&fixture, 5, "five").await;
        let mut named = request("x", None, None);
        named.caller = Caller::Named(7);
        assert!(matches!(
            fixture.read_raw(&named).await.unwrap(),
            ReadAnswer::Value { copy: 7, .. }
        ));
        named.caller = Caller::Named(8);
        assert_eq!(
            fixture.read_raw(&named).await.unwrap_err().kind(),
            ErrorKind::InvalidCopy
        );
        let err = read(&fixture, "", None, None).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::MissingClient);
    }
}
