//! SIGHUP: re-read the config file (and the tokens file) and apply what can change while the
//! process runs.
//!
//! Applied live: read class definitions (`[classes.*]`: route, budget, `on_breach`, reason),
//! each family's `default_class`, the tokens (`auth.tokens_file` and its content) and the log
//! filter (`server.log_level`). Each lives behind a pointer the request path loads without a
//! lock ([`crate::auth::TokenTable`], the router's class table, [`crate::logging::LogFilter`]),
//! so a reload never blocks a request and a request in flight finishes under the table it
//! started with.
//!
//! A file that does not load, parse or validate, or a tokens file that does not parse, is
//! refused as a whole: the error (naming the field) is logged and the config in force stays.
//! So is a file whose reloadable parts, laid over the restart-only fields in force, would not
//! pass startup's validation (`[auth]` dropped while the listener bound at startup is public, a
//! `decides-on-presence` default class for a family running several copies): what runs is
//! always a configuration startup would accept.
//! Any other difference (the listen address, the Redis URL, a family's copies, a class added
//! or removed, …) is not applied: the reload logs each such field as needing a restart, and
//! applies the rest. Every reload is counted in `hotsplit_config_reloads_total{result}`
//! (`ok` or `refused`).

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::auth::TokenTable;
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::logging::LogFilter;
use crate::metrics::Metrics;
use crate::route::Router;

/// The `result` label of `hotsplit_config_reloads_total`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReloadLabels {
    /// `ok` or `refused`.
    result: &'static str,
}

/// What a reload changed, and what it could not.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// The reloadable parts that changed (`classes`, `default classes`, `tokens`, `log level`).
    pub applied: Vec<String>,
    /// Fields that differ from the config in force and need a restart, as dotted paths
    /// (`server.listen`, `family[0].copies`); not applied.
    pub needs_restart: Vec<String>,
}

/// The log filter a reload may set, unless a flag chose it.
#[derive(Debug, Clone)]
struct LogControl {
    /// The filter of the running subscriber.
    filter: LogFilter,
    /// `--log` or `HOTSPLIT_LOG` set the filter: it wins over `server.log_level` on reload too.
    overridden: bool,
}

/// Applies a new config to a running service.
pub struct Reloader {
    /// The config in force: the last one applied, with the fields that need a restart as
    /// they were at startup.
    in_force: Mutex<Config>,
    /// The token table the API checks.
    tokens: TokenTable,
    /// The read router, whose class table is swapped.
    router: Arc<Router>,
    /// The log filter, when the binary set one up.
    log: Option<LogControl>,
    /// Reloads applied.
    ok: Counter,
    /// Reloads refused.
    refused: Counter,
}

impl Reloader {
    /// A reloader for a service running `config`, its token table and router; counts into
    /// `metrics`.
    pub fn new(
        config: Config,
        tokens: TokenTable,
        router: Arc<Router>,
        metrics: &Metrics,
    ) -> Reloader {
        let family = metrics.register_with(|registry| {
            let family = Family::<ReloadLabels, Counter>::default();
            registry.register(
                "config_reloads",
                "Config reloads (SIGHUP) by result: ok (applied, perhaps with fields needing a restart) or refused (the old config stays)",
                family.clone(),
            );
            family
        });
        let counter = |result| family.get_or_create(&ReloadLabels { result }).clone();
        Reloader {
            in_force: Mutex::new(config),
            tokens,
            router,
            log: None,
            ok: counter("ok"),
            refused: counter("refused"),
        }
    }

    /// Lets reloads set the log filter from `server.log_level`, unless `overridden` (a flag or
    /// environment variable chose the filter).
    pub fn with_log_filter(mut self, filter: LogFilter, overridden: bool) -> Reloader {
        self.log = Some(LogControl { filter, overridden });
        self
    }

    /// Counts and logs a reload refused before it reached [`Reloader::apply`] (the file could
    /// not be read or parsed).
    pub fn refuse(&self, err: &Error) {
        self.refused.inc();
        tracing::error!(error = %err, "config reload refused; the config in force is unchanged");
    }

    /// Applies `new`: validates it and loads its tokens file (either failing refuses the whole
    /// reload), applies the reloadable parts, and reports the rest as needing a restart.
    ///
    /// # Errors
    /// [`ErrorKind::Config`] naming the field, when the reload is refused; nothing changed.
    pub fn apply(&self, new: Config) -> Result<ReloadReport> {
        match self.try_apply(new) {
            Ok(report) => {
                self.ok.inc();
                for field in &report.needs_restart {
                    tracing::warn!(field = %field, "config reload: this change needs a restart; not applied");
                }
                tracing::info!(
                    applied = %report.applied.join(", "),
                    needs_restart = report.needs_restart.len(),
                    "config reloaded"
                );
                Ok(report)
            }
            Err(err) => {
                self.refuse(&err);
                Err(err)
            }
        }
    }

    fn try_apply(&self, new: Config) -> Result<ReloadReport> {
        new.validate()?;
        let tokens = new.auth.load_tokens()?;
        let classes = new.classes()?;
        let log_level = match &self.log {
            Some(control) if !control.overridden => Some(
                new.server
                    .log_level
                    .as_deref()
                    .unwrap_or(DEFAULT_LOG_LEVEL)
                    .parse::<tracing_subscriber::filter::Targets>()
                    .map_err(|err| {
                        Error::new(ErrorKind::Config, format!("server.log_level: {err}"))
                    })?,
            ),
            _ => None,
        };
        let mut in_force = self.in_force.lock().unwrap_or_else(PoisonError::into_inner);
        let mut report = ReloadReport {
            applied: Vec::new(),
            needs_restart: restart_fields(&in_force, &new)?,
        };
        // Classes and default classes: only with the same class names, since every class's
        // counters are resolved by index at startup.
        let same_names = classes.names() == self.router.classes().names();
        let running = would_be_in_force(&in_force, &new, same_names);
        // The new file validated on its own; what would run is its reloadable parts over the
        // restart-only parts in force (the listener bound at startup, the families' copies), and
        // that must pass the same checks startup makes, or nothing is applied.
        running
            .validate()
            .map_err(|err| conflict(&err, &report.needs_restart))?;
        if !same_names {
            report
                .needs_restart
                .push("classes (a class added or removed)".to_owned());
        } else if differs(&in_force.classes, &new.classes)?
            || default_classes_differ(&in_force, &new)
        {
            self.router.reload_classes(classes, |prefix| {
                default_class_of(&new, prefix).map(str::to_owned)
            })?;
            report.applied.push("classes".to_owned());
        }
        if differs(&in_force.auth, &new.auth)? || tokens_changed(&self.tokens, tokens.as_ref()) {
            report.applied.push("tokens".to_owned());
        }
        let count = tokens.as_ref().map_or(0, crate::auth::Tokens::len);
        self.tokens.store(tokens);
        if let (Some(control), Some(targets)) = (&self.log, log_level) {
            if control.filter.describe() != targets.to_string() {
                control.filter.set(targets);
                report.applied.push("log level".to_owned());
            }
        } else if in_force.server.log_level != new.server.log_level {
            tracing::info!("config reload: server.log_level changed, but --log / HOTSPLIT_LOG sets the filter; keeping it");
        }
        tracing::debug!(tokens = count, "config reload: token table stored");
        *in_force = running;
        Ok(report)
    }
}

/// The config that would be in force once `new` is applied over `in_force`: its classes and
/// default classes (when `same_names`: a class added or removed needs a restart), its `[auth]`
/// and its `server.log_level`, over everything else as it is in force.
fn would_be_in_force(in_force: &Config, new: &Config, same_names: bool) -> Config {
    let mut running = in_force.clone();
    if same_names {
        running.classes = new.classes.clone();
        running.default_family.default_class = new.default_family.default_class.clone();
        for family in &mut running.families {
            if let Some(class) = default_class_of(new, &family.prefix) {
                family.default_class = class.to_owned();
            }
        }
    }
    running.auth = new.auth.clone();
    running.server.log_level = new.server.log_level.clone();
    running
}

/// The error of a reload refused because the config that would be in force fails `err`,
/// naming the file's fields that need a restart (which may be what made the file valid alone).
fn conflict(err: &Error, needs_restart: &[String]) -> Error {
    let restart = if needs_restart.is_empty() {
        String::new()
    } else {
        format!(
            "; the file also changes fields that need a restart and are not applied: {}",
            needs_restart.join(", ")
        )
    };
    Error::new(
        ErrorKind::Config,
        format!("the file's reloadable parts (classes, default classes, [auth], server.log_level) over the config in force would not pass startup's checks: {err}{restart}"),
    )
}

/// The filter `serve` starts with when neither a flag nor `server.log_level` names one.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// The default class `config` gives the family with `prefix` (`""` for the default family).
fn default_class_of<'a>(config: &'a Config, prefix: &str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(&config.default_family.default_class);
    }
    config
        .families
        .iter()
        .find(|family| family.prefix == prefix)
        .map(|family| family.default_class.as_str())
}

fn default_classes_differ(old: &Config, new: &Config) -> bool {
    old.default_family.default_class != new.default_family.default_class
        || old.families.iter().any(|family| {
            default_class_of(new, &family.prefix).is_some_and(|class| class != family.default_class)
        })
}

/// Whether the table holds tokens other than `new` (a file with the same path but new lines).
fn tokens_changed(table: &TokenTable, new: Option<&crate::auth::Tokens>) -> bool {
    let old = table.load();
    match (old.as_deref(), new) {
        (None, None) => false,
        (Some(old), Some(new)) => !old.same_as(new),
        _ => true,
    }
}

/// Whether two serializable values differ.
fn differs<T: serde::Serialize>(a: &T, b: &T) -> Result<bool> {
    Ok(to_value(a)? != to_value(b)?)
}

fn to_value<T: serde::Serialize>(value: &T) -> Result<toml::Value> {
    toml::Value::try_from(value)
        .map_err(|err| Error::new(ErrorKind::Config, format!("cannot compare configs: {err}")))
}

/// The dotted paths of the fields where `new` differs from `old`, leaving out what a reload
/// applies (classes, default classes, `[auth]`, `server.log_level`).
fn restart_fields(old: &Config, new: &Config) -> Result<Vec<String>> {
    let mut new = new.clone();
    new.classes = old.classes.clone();
    new.auth = old.auth.clone();
    new.server.log_level = old.server.log_level.clone();
    new.default_family.default_class = old.default_family.default_class.clone();
    for family in &mut new.families {
        if let Some(class) = default_class_of(old, &family.prefix) {
            family.default_class = class.to_owned();
        }
    }
    let mut fields = Vec::new();
    diff("", &to_value(old)?, &to_value(&new)?, &mut fields);
    Ok(fields)
}

/// Appends to `out` the paths under `path` where `a` and `b` differ.
fn diff(path: &str, a: &toml::Value, b: &toml::Value, out: &mut Vec<String>) {
    use toml::Value;
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match (a, b) {
        (Value::Table(a), Value::Table(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                match (a.get(key), b.get(key)) {
                    (Some(a), Some(b)) => diff(&join(key), a, b, out),
                    _ => out.push(join(key)),
                }
            }
        }
        (Value::Array(a), Value::Array(b))
            if a.len() == b.len() && a.iter().all(toml::Value::is_table) =>
        {
            for (at, (a, b)) in a.iter().zip(b).enumerate() {
                diff(&format!("{path}[{at}]"), a, b, out);
            }
        }
        (a, b) if a != b => out.push(path.to_owned()),
        _ => {}
    }
}

/// Where a reload reads the new config from: the binary's own loader (the same file, with the
/// same flags and environment over it).
pub type ConfigSource = Box<dyn Fn() -> Result<Config> + Send + Sync>;

/// The background task that reloads on every SIGHUP until shutdown.
pub struct HangupReloader {
    /// Applies each new config.
    pub reloader: Reloader,
    /// Loads it.
    pub source: ConfigSource,
    /// SIGHUP, registered before the service serves (so a SIGHUP never finds the default
    /// action, which ends the process).
    pub hangups: tokio::signal::unix::Signal,
}

impl HangupReloader {
    /// Reloads on each SIGHUP until `shutdown` is cancelled.
    pub async fn run(mut self, shutdown: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                received = self.hangups.recv() => {
                    if received.is_none() {
                        return;
                    }
                    tracing::info!("SIGHUP received: reloading the config");
                    match (self.source)() {
                        Ok(config) => {
                            // `apply` logs and counts either outcome.
                            let _ = self.reloader.apply(config);
                        }
                        Err(err) => self.reloader.refuse(&err),
                    }
                }
            }
        }
    }
}
