//! The Redis-protocol door's metrics, `hotsplit_resp_*`: commands and their latency by
//! command, error replies by prefix, open and refused connections, protocol errors, the byte
//! budgets a connection passed (`hotsplit_resp_budget_exceeded_total{budget}`), the bytes the
//! commands being received hold, failed authentications and evicted unauthenticated
//! connections.
//!
//! Every label set is bounded: a command is counted under its name when the command table
//! lists it (`resp::command::table::TABLE`, the one list of commands: a command added there
//! has its label), else `other`; an error under its first word when it is one of [`PREFIXES`],
//! else `other`. A client sending random command names cannot grow the exposition. Every handle
//! is resolved once, at startup, so counting is an index and an atomic add.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::command::table::TABLE;
use crate::metrics::{register, register_with_unit, Metrics};

/// The label of a command or an error prefix not listed.
const OTHER: &str = "other";

/// The error prefixes counted under their own label (the first word of the reply); any other
/// is `other`.
pub const PREFIXES: [&str; 12] = [
    "ERR",
    "NOAUTH",
    "WRONGPASS",
    "NOPERM",
    "NOPROTO",
    "EXECABORT",
    "FLOOR",
    "UNAVAILABLE",
    "OVERLOADED",
    "DEADLINE",
    "STALE",
    "FULL",
];

/// A byte budget or deadline of the door, as the `budget` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// `resp.max_pending_bytes`: one command being received.
    Pending,
    /// `resp.max_receiving_bytes`: every command being received.
    Receiving,
    /// `resp.receive_timeout`.
    ReceiveTimeout,
    /// `resp.max_queued_bytes`: one transaction's queue.
    Queued,
    /// `resp.max_reply_bytes`: one reply.
    Reply,
    /// `resp.auth_timeout`.
    AuthTimeout,
}

impl Budget {
    /// Every budget, in label order.
    const ALL: [Budget; 6] = [
        Budget::Pending,
        Budget::Receiving,
        Budget::ReceiveTimeout,
        Budget::Queued,
        Budget::Reply,
        Budget::AuthTimeout,
    ];

    /// The `budget` label: the config field.
    fn label(self) -> &'static str {
        match self {
            Budget::Pending => "max_pending_bytes",
            Budget::Receiving => "max_receiving_bytes",
            Budget::ReceiveTimeout => "receive_timeout",
            Budget::Queued => "max_queued_bytes",
            Budget::Reply => "max_reply_bytes",
            Budget::AuthTimeout => "auth_timeout",
        }
    }
}

/// Labels of the budget counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct BudgetLabels {
    /// The `resp.*` field.
    budget: &'static str,
}

/// Labels of the per-command families.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CommandLabels {
    /// A command's name in the command table, or `other`.
    command: &'static str,
}

/// Labels of the error counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PrefixLabels {
    /// One of [`PREFIXES`], or `other`.
    prefix: &'static str,
}

/// The door's metric handles. Cheap to clone.
#[derive(Debug, Clone)]
pub struct RespMetrics {
    /// The resolved handles, shared.
    inner: Arc<Handles>,
}

/// The handles of [`RespMetrics`].
#[derive(Debug)]
struct Handles {
    /// Commands run, indexed like the command table, then `other`.
    commands: Box<[Counter]>,
    /// Command latency by command.
    latency: Family<CommandLabels, Histogram>,
    /// Each command's latency histogram, indexed as `commands`, resolved on its first use (a
    /// histogram is 24 series: only the commands a client sends are exported).
    latency_by_index: Box<[OnceLock<Histogram>]>,
    /// Error replies, indexed like [`PREFIXES`], then `other`.
    errors: Box<[Counter]>,
    /// Open connections.
    open: Gauge,
    /// Connections refused at `resp.max_connections`.
    refused: Counter,
    /// Connections closed for breaking the protocol or a bound.
    protocol_errors: Counter,
    /// Connections closed because a reload revoked their token.
    revoked: Counter,
    /// Budgets passed, indexed like [`Budget::ALL`].
    budgets: Box<[Counter]>,
    /// The bytes every command being received holds (the `resp.max_receiving_bytes` count
    /// itself: `inc_by` answers the total before).
    receiving: Gauge,
    /// The bytes of replies every connection holds while it waits for its client to read them.
    writing: Gauge,
    /// `GET`s started ahead of their turn in a pipelined batch's run (`resp::conn::ahead`).
    gets_ahead: Counter,
    /// Of those, the ones whose floors moved before their turn, read again then.
    gets_read_again: Counter,
    /// `AUTH` attempts refused `WRONGPASS`.
    auth_failures: Counter,
    /// Unauthenticated connections closed to make room for a new one.
    evicted: Counter,
}

/// Where the command named `name` (any case) is counted: its place in the command table, or
/// `other` (the table's length).
pub fn command_index(name: &[u8]) -> usize {
    super::command::table::position(name).unwrap_or(TABLE.len())
}

/// The `command` label of the count at `index` (from [`command_index`]).
fn command_label(index: usize) -> &'static str {
    TABLE.get(index).map_or(OTHER, |spec| spec.name)
}

/// Which of [`PREFIXES`] (or `other`) the error reply `text` is counted under.
fn prefix_index(text: &str) -> usize {
    let word = text.split(' ').next().unwrap_or_default();
    PREFIXES
        .iter()
        .position(|known| *known == word)
        .unwrap_or(PREFIXES.len())
}

/// The per-command handles of [`Handles`]: `commands`, `latency`, `latency_by_index`.
type CommandHandles = (
    Box<[Counter]>,
    Family<CommandLabels, Histogram>,
    Box<[OnceLock<Histogram>]>,
);

/// The per-command families, registered with their handles resolved: a counter per command of
/// the table (then `other`), the latency family, and a slot per command for its histogram.
fn command_handles(registry: &mut Registry) -> CommandHandles {
    let family: Family<CommandLabels, Counter> = register(
        registry,
        "resp_commands",
        "Commands run on the Redis-protocol listener, by command (the known names, else other)",
    );
    let latency = register_with_unit(
        registry,
        "resp_command_duration",
        "Latency of Redis-protocol commands, by command, from the start of the command to its reply being ready (not written)",
        Unit::Seconds,
        Family::<CommandLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_005, 2.0, 22))
        }),
    );
    let names = TABLE.iter().map(|spec| spec.name).chain([OTHER]);
    // Each handle is cloned in its own statement: `get_or_create` returns a read guard.
    let commands = names
        .clone()
        .map(|command| {
            let counter = family.get_or_create(&CommandLabels { command }).clone();
            counter
        })
        .collect();
    let latency_by_index = names.map(|_| OnceLock::new()).collect();
    (commands, latency, latency_by_index)
}

/// The error counter, registered, with a handle per prefix (then `other`).
fn error_handles(registry: &mut Registry) -> Box<[Counter]> {
    let errors: Family<PrefixLabels, Counter> = register(
        registry,
        "resp_errors",
        "Error replies of the Redis-protocol listener, by prefix (ERR, NOAUTH, OVERLOADED, ...; else other)",
    );
    PREFIXES
        .iter()
        .copied()
        .chain([OTHER])
        .map(|prefix| {
            let counter = errors.get_or_create(&PrefixLabels { prefix }).clone();
            counter
        })
        .collect()
}

/// The budget counter, registered, with a handle per budget.
fn budget_handles(registry: &mut Registry) -> Box<[Counter]> {
    let budgets: Family<BudgetLabels, Counter> = register(
        registry,
        "resp_budget_exceeded",
        "Redis-protocol commands or connections refused at a [resp] budget, by its field (max_pending_bytes, max_receiving_bytes, receive_timeout, max_queued_bytes, max_reply_bytes, auth_timeout)",
    );
    Budget::ALL
        .iter()
        .map(|budget| {
            let counter = budgets
                .get_or_create(&BudgetLabels {
                    budget: budget.label(),
                })
                .clone();
            counter
        })
        .collect()
}

impl Handles {
    /// Registers every family in `registry` (in exposition order) and resolves the handles.
    fn register(registry: &mut Registry) -> Handles {
        let (commands, latency, latency_by_index) = command_handles(registry);
        Handles {
            commands,
            latency,
            latency_by_index,
            errors: error_handles(registry),
            open: register(
                registry,
                "resp_connections",
                "Open Redis-protocol connections",
            ),
            refused: register(
                registry,
                "resp_connections_refused",
                "Redis-protocol connections answered 'max number of clients reached' and closed (resp.max_connections)",
            ),
            protocol_errors: register(
                registry,
                "resp_protocol_errors",
                "Redis-protocol connections answered 'Protocol error' and closed (malformed input or a bound: resp.max_args, resp.max_inline_bytes, resp.max_pending_bytes, server.max_value_bytes)",
            ),
            revoked: register(
                registry,
                "resp_connections_revoked",
                "Redis-protocol connections closed because a reload revoked the token they authenticated with",
            ),
            budgets: budget_handles(registry),
            receiving: register(
                registry,
                "resp_receiving_bytes",
                "Bytes held by the Redis-protocol commands being received, on every connection (resp.max_receiving_bytes)",
            ),
            writing: register(
                registry,
                "resp_writing_bytes",
                "Bytes of replies held by Redis-protocol connections while their clients read them (bounded per connection by resp.max_output_bytes, 16 KiB before AUTH)",
            ),
            gets_ahead: register(
                registry,
                "resp_gets_ahead",
                "Redis-protocol GETs that needed the store, sent together with the GETs pipelined after them and answered in order",
            ),
            gets_read_again: register(
                registry,
                "resp_gets_read_again",
                "Of the GETs sent ahead, those whose floors moved before their turn (a GET before them raised the key's high-water): what they fetched was dropped and they were read again in turn",
            ),
            auth_failures: register(
                registry,
                "resp_auth_failures",
                "Redis-protocol AUTH attempts refused WRONGPASS (each reply is delayed, more with each failure on its connection)",
            ),
            evicted: register(
                registry,
                "resp_connections_evicted",
                "Unauthenticated Redis-protocol connections closed to make room for a new one (resp.max_connections, resp.max_unauthenticated)",
            ),
        }
    }
}

impl RespMetrics {
    /// Creates the families in `metrics`' registry and resolves every handle (once per
    /// service).
    pub fn register(metrics: &Metrics) -> RespMetrics {
        RespMetrics {
            inner: Arc::new(metrics.register_with(Handles::register)),
        }
    }

    /// Counts one command (`index` from [`command_index`]) that took `took`.
    pub fn command(&self, index: usize, took: Duration) {
        if let Some(counter) = self.inner.commands.get(index) {
            counter.inc();
        }
        let Some(slot) = self.inner.latency_by_index.get(index) else {
            return;
        };
        let histogram = slot.get_or_init(|| {
            let command = command_label(index);
            let histogram = self
                .inner
                .latency
                .get_or_create(&CommandLabels { command })
                .clone();
            histogram
        });
        histogram.observe(took.as_secs_f64());
    }

    /// Counts `count` `GET`s answered from memory without a future (`Door::get_now`), once
    /// per batch: their count only (each took well under the latency histogram's first
    /// bucket; `hotsplit_near_cache_*` has their ages).
    pub fn gets_answered_now(&self, count: u64) {
        static GET: std::sync::LazyLock<usize> = std::sync::LazyLock::new(|| command_index(b"get"));
        if let Some(counter) = self.inner.commands.get(*GET) {
            counter.inc_by(count);
        }
    }

    /// Counts `count` `GET`s started ahead in one run.
    pub fn gets_ahead(&self, count: u64) {
        self.inner.gets_ahead.inc_by(count);
    }

    /// Counts a `GET` started ahead that was read again in its turn.
    pub fn get_read_again(&self) {
        self.inner.gets_read_again.inc();
    }

    /// Counts an error reply with `text`.
    pub fn error(&self, text: &str) {
        if let Some(counter) = self.inner.errors.get(prefix_index(text)) {
            counter.inc();
        }
    }

    /// The open-connection gauge.
    pub(crate) fn open(&self) -> &Gauge {
        &self.inner.open
    }

    /// Counts a connection refused at the bound.
    pub(crate) fn refused(&self) {
        self.inner.refused.inc();
    }

    /// Counts a connection closed for a protocol error.
    pub(crate) fn protocol_error(&self) {
        self.inner.protocol_errors.inc();
    }

    /// Counts a connection closed for a revoked token.
    pub(crate) fn revoked(&self) {
        self.inner.revoked.inc();
    }

    /// Counts a command or a connection refused at `budget`.
    pub(crate) fn exceeded(&self, budget: Budget) {
        let at = Budget::ALL.iter().position(|known| *known == budget);
        if let Some(counter) = at.and_then(|at| self.inner.budgets.get(at)) {
            counter.inc();
        }
    }

    /// The bytes every command being received holds.
    pub(crate) fn receiving(&self) -> &Gauge {
        &self.inner.receiving
    }

    /// The `hotsplit_resp_writing_bytes` gauge.
    pub(crate) fn writing(&self) -> &Gauge {
        &self.inner.writing
    }

    /// Counts an `AUTH` refused `WRONGPASS`.
    pub(crate) fn auth_failure(&self) {
        self.inner.auth_failures.inc();
    }

    /// Counts an unauthenticated connection evicted to make room.
    pub(crate) fn evicted(&self) {
        self.inner.evicted.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_prefixes_fall_into_a_bounded_set() {
        assert_eq!(command_label(command_index(b"GET")), "get");
        assert_eq!(
            command_label(command_index(b"HotSplit.Read")),
            "hotsplit.read"
        );
        assert_eq!(command_label(command_index(b"FLUSHALL")), OTHER);
        assert_eq!(
            PREFIXES[prefix_index("NOAUTH Authentication required.")],
            "NOAUTH"
        );
        assert_eq!(prefix_index("MOVED 1 x"), PREFIXES.len());
        let metrics = Metrics::new();
        let resp = RespMetrics::register(&metrics);
        resp.command(command_index(b"get"), Duration::from_micros(30));
        resp.command(command_index(b"nope"), Duration::from_micros(30));
        resp.error("OVERLOADED too many requests in flight, retry later");
        resp.error("WEIRD x");
        let text = metrics.render();
        for line in [
            r#"hotsplit_resp_commands_total{command="get"} 1"#,
            r#"hotsplit_resp_commands_total{command="other"} 1"#,
            r#"hotsplit_resp_errors_total{prefix="OVERLOADED"} 1"#,
            r#"hotsplit_resp_errors_total{prefix="other"} 1"#,
            r#"hotsplit_resp_command_duration_seconds_count{command="get"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains(r#"command_duration_seconds_count{command="set"}"#));
    }

    #[test]
    fn every_command_of_the_table_is_counted_under_its_own_label() {
        let metrics = Metrics::new();
        let resp = RespMetrics::register(&metrics);
        for spec in TABLE {
            let sent = spec.name.to_ascii_uppercase();
            let index = command_index(sent.as_bytes());
            assert_eq!(command_label(index), spec.name);
            resp.command(index, Duration::from_micros(30));
        }
        let text = metrics.render();
        for spec in TABLE {
            let line = format!(
                r#"hotsplit_resp_commands_total{{command="{}"}} 1"#,
                spec.name
            );
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
    }
}
