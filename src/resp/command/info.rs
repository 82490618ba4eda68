//! `COMMAND`, `INFO`, `CONFIG GET` and `CLUSTER`: what clients ask before they send anything
//! else (redis-cli's hints, ioredis's ready check, redis-benchmark's `CONFIG GET save`), each a
//! struct parsed from its arguments ([`super::parse`]).

use bytes::Bytes;

use super::connection::REDIS_VERSION;
use super::errors::RespError;
use super::parse::{Args, Local, Parse};
use super::table::{self, Spec, TABLE};
use super::{ConnState, Door};
use crate::resp::reply::Reply;

/// `COMMAND`'s entry for `spec`: name, arity, flags, first key, last key, step, ACL
/// categories, tips, key specs, subcommands.
fn entry(spec: &Spec) -> Reply {
    let (first, last, step) = spec.keys;
    Reply::Array(vec![
        Reply::bulk(spec.name),
        Reply::Int(spec.arity),
        Reply::Array(spec.flags.iter().map(|flag| Reply::Simple(flag)).collect()),
        Reply::Int(first),
        Reply::Int(last),
        Reply::Int(step),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(Vec::new()),
    ])
}

/// `COMMAND [COUNT|INFO name…|LIST|DOCS [name…]]`.
#[derive(Debug)]
pub(crate) enum Command {
    /// Every command's entry.
    All,
    /// `COUNT`.
    Count,
    /// `LIST`.
    List,
    /// `INFO name…`: each name's entry, or nil.
    Info(Vec<Bytes>),
    /// `DOCS`: no documentation to give.
    Docs,
}

impl Parse for Command {
    fn parse(args: &mut Args) -> Result<Command, RespError> {
        let Some(sub) = args.next_optional() else {
            return Ok(Command::All);
        };
        let command = match sub.to_ascii_uppercase().as_slice() {
            b"COUNT" => Command::Count,
            b"LIST" => Command::List,
            b"INFO" => Command::Info(args.rest().collect()),
            b"DOCS" => Command::Docs,
            _ => return Err(table::unknown_subcommand("command", &sub)),
        };
        // `COUNT`, `LIST` and `DOCS` ignore what follows them, as they always have.
        args.ignore_rest();
        Ok(command)
    }
}

impl Local for Command {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(match self {
            Command::All => Reply::Array(TABLE.iter().map(entry).collect()),
            Command::Count => Reply::Int(TABLE.len() as i64),
            Command::List => {
                Reply::Array(TABLE.iter().map(|spec| Reply::bulk(spec.name)).collect())
            }
            Command::Info(names) => Reply::Array(
                names
                    .iter()
                    .map(|name| table::find(name).map_or(Reply::Nil, entry))
                    .collect(),
            ),
            // An empty map, which every client reads as "no hints".
            Command::Docs => Reply::Map(Vec::new()),
        })
    }
}

/// `CLUSTER …`: refused (hotsplit is one Redis to a client, never a cluster); queued in a
/// transaction like any command.
pub(crate) struct Cluster;

impl Parse for Cluster {
    fn parse(args: &mut Args) -> Result<Cluster, RespError> {
        args.ignore_rest();
        Ok(Cluster)
    }
}

impl Local for Cluster {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        Err(RespError::err("This instance has cluster support disabled"))
    }
}

/// The configuration names `CONFIG GET` answers, with their values.
const CONFIG: &[(&str, &str)] = &[("save", ""), ("appendonly", "no"), ("databases", "1")];

/// Whether `name` matches the glob `pattern` (`*`, `?`; any case): the greedy matcher that
/// goes back only to the last `*`, so no pattern costs more than its length times the name's.
fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some(b'*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&byte) if byte == b'?' || byte.eq_ignore_ascii_case(&name[n]) => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((at, from)) => {
                    p = at + 1;
                    n = from + 1;
                    star = Some((at, from + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|byte| *byte == b'*')
}

/// `CONFIG GET pattern…` (a map of what matches); other subcommands are refused.
pub(crate) struct ConfigGet {
    /// The glob patterns (each at most 128 bytes).
    patterns: Vec<Bytes>,
}

impl Parse for ConfigGet {
    fn parse(args: &mut Args) -> Result<ConfigGet, RespError> {
        let sub = args.next_bytes()?;
        if !sub.eq_ignore_ascii_case(b"GET") {
            return Err(RespError::err(format!(
                "CONFIG {} is not supported by hotsplit: its configuration is its TOML file",
                String::from_utf8_lossy(&sub).to_ascii_uppercase()
            )));
        }
        if args.is_empty() {
            return Err(RespError::arity("config|get"));
        }
        let patterns: Vec<Bytes> = args.rest().collect();
        if patterns.iter().any(|pattern| pattern.len() > 128) {
            return Err(RespError::err(
                "a CONFIG GET pattern is longer than 128 bytes",
            ));
        }
        Ok(ConfigGet { patterns })
    }
}

impl Local for ConfigGet {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        let matched = CONFIG
            .iter()
            .filter(|(name, _)| {
                self.patterns
                    .iter()
                    .any(|pattern| glob(pattern, name.as_bytes()))
            })
            .map(|(name, value)| (Reply::bulk(*name), Reply::bulk(*value)))
            .collect();
        Ok(Reply::Map(matched))
    }
}

/// `INFO [section…]`: `server`, `clients`, `persistence`, `replication`, `stats` and
/// `hotsplit`, as Redis writes them (`# Name`, then `field:value` lines, CRLF).
pub(crate) struct Info {
    /// The sections asked for, lowercase; none: the default ones (all of them).
    sections: Vec<String>,
}

impl Parse for Info {
    fn parse(args: &mut Args) -> Result<Info, RespError> {
        let sections = args
            .rest()
            .map(|section| String::from_utf8_lossy(&section).to_ascii_lowercase())
            .collect();
        Ok(Info { sections })
    }
}

impl Local for Info {
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(door.info(conn, &self.sections))
    }
}

impl Door {
    /// The `INFO` text of the `wanted` sections (lowercase; none: all of them).
    fn info(&self, conn: &ConnState, wanted: &[String]) -> Reply {
        let all = wanted.is_empty()
            || wanted
                .iter()
                .any(|section| matches!(section.as_str(), "all" | "everything" | "default"));
        let near = self.core.ops().reader().near_cache().is_some();
        let sections: [(&str, Vec<(&str, String)>); 6] = [
            (
                "Server",
                vec![
                    ("redis_version", REDIS_VERSION.to_owned()),
                    ("redis_mode", "standalone".to_owned()),
                    ("hotsplit_version", env!("CARGO_PKG_VERSION").to_owned()),
                    ("run_id", self.core.instance().to_string()),
                    ("process_id", std::process::id().to_string()),
                ],
            ),
            ("Clients", vec![("client_id", conn.id.to_string())]),
            ("Persistence", vec![("loading", "0".to_owned())]),
            (
                "Replication",
                vec![
                    ("role", "master".to_owned()),
                    ("connected_slaves", "0".to_owned()),
                ],
            ),
            (
                "Stats",
                vec![
                    ("hotsplit_connection_commands", conn.commands.to_string()),
                    ("hotsplit_metrics", "/metrics".to_owned()),
                ],
            ),
            (
                "Hotsplit",
                vec![
                    ("hotsplit_instance", self.core.instance().to_string()),
                    (
                        "hotsplit_near_cache",
                        if near { "on" } else { "off" }.to_owned(),
                    ),
                    (
                        "hotsplit_high_water_bytes",
                        self.core.ops().high_water().bytes().to_string(),
                    ),
                ],
            ),
        ];
        let mut text = String::new();
        for (name, fields) in sections {
            if !all
                && !wanted
                    .iter()
                    .any(|section| *section == name.to_ascii_lowercase())
            {
                continue;
            }
            if !text.is_empty() {
                text.push_str("\r\n");
            }
            text.push_str("# ");
            text.push_str(name);
            text.push_str("\r\n");
            for (field, value) in fields {
                text.push_str(field);
                text.push(':');
                text.push_str(&value);
                text.push_str("\r\n");
            }
        }
        Reply::Verbatim(text)
    }
}
