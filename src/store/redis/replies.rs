//! Pure parsers of Redis replies: compare-and-set replies, copies, `SCAN` pages, audit stamps,
//! `CLUSTER SLOTS`, `CLUSTER NODES` and `INFO`. They send nothing; the only fred type they know
//! is [`Value`], the shape of a reply. The text of `CLUSTER NODES` and `INFO` is read with the
//! `hotsplit-redis-info` crate, which the dev cluster shares.

use std::borrow::Cow;
use std::str::FromStr;

use fred::types::Value;
use hotsplit_redis_info::{info_field, ClusterNode};

use super::target::format_address;
use crate::key::Version;
use crate::store::{
    CasOutcome, CopyRecord, CopyStamp, Layout, LayoutSwap, Lease, NodeLabel, Payload,
};

/// Each cluster primary's replicas, `host:port` labels, sorted.
pub(super) type ReplicaMap = std::collections::HashMap<NodeLabel, Vec<NodeLabel>>;

/// A primary and its replicas, as [`ReadOnlyNodes`](super::ReadOnlyNodes) discovered them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shard {
    /// The primary, `host:port`.
    pub(crate) primary: NodeLabel,
    /// Its replicas, `host:port`, sorted.
    pub(crate) replicas: Vec<NodeLabel>,
    /// Cluster mode: the slot ranges it serves, inclusive; empty for a standalone primary.
    pub(super) slots: Vec<(u16, u16)>,
}

/// One page of a `SCAN` on one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanPage {
    /// The cursor of the next page; `None` when the scan of this node is complete.
    pub(crate) next: Option<String>,
    /// The keys of this page (a key may come back more than once in a scan).
    pub(crate) keys: Vec<String>,
}

/// Each primary's replicas, read out of a `CLUSTER SLOTS` reply: an array of
/// `[start, end, primary, replica…]` where every node is `[host, port, id, …]`.
///
/// This is parsed here rather than by fred: fred's replica support (its `replicas` feature)
/// busy-loops its router task on a command whose node has no connection (fred 10.1,
/// `create_replica_connection` re-queues such a command with its attempt restored, forever),
/// which pinned a core and stopped runtime shutdown after a master failover.
pub(super) fn replicas_from_cluster_slots(
    reply: &Value,
) -> std::result::Result<ReplicaMap, String> {
    fn node(value: &Value) -> std::result::Result<NodeLabel, String> {
        let Value::Array(fields) = value else {
            return Err(format!("a node is not an array: {value:?}"));
        };
        let host = fields
            .first()
            .and_then(Value::as_string)
            .ok_or_else(|| format!("a node has no host: {value:?}"))?;
        let port = fields
            .get(1)
            .and_then(Value::as_u64)
            .and_then(|port| u16::try_from(port).ok())
            .ok_or_else(|| format!("a node has no port: {value:?}"))?;
        Ok(NodeLabel::new(format_address(&host, port)))
    }
    let Value::Array(ranges) = reply else {
        return Err(format!("not an array: {reply:?}"));
    };
    let mut map = ReplicaMap::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return Err(format!("a slot range is not an array: {range:?}"));
        };
        let primary = node(
            parts
                .get(2)
                .ok_or_else(|| format!("a slot range has no primary: {range:?}"))?,
        )?;
        let replicas = map.entry(primary).or_default();
        for replica in parts.iter().skip(3) {
            let replica = node(replica)?;
            if !replicas.contains(&replica) {
                replicas.push(replica);
            }
        }
        replicas.sort();
    }
    Ok(map)
}

/// Parses `{"applied", new}` or `{"changed", current}` of `hotsplit_layout`.
pub(super) fn parse_layout_reply(reply: Value) -> std::result::Result<LayoutSwap, String> {
    let [status, record] = <[Value; 2]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let record = record
        .as_str()
        .map(|text| text.into_owned())
        .unwrap_or_default();
    match status.as_str().as_deref() {
        Some("applied") => Ok(LayoutSwap::Applied),
        Some("changed") if record.is_empty() => Ok(LayoutSwap::Changed(None)),
        Some("changed") => Layout::decode(&record)
            .map(|layout| LayoutSwap::Changed(Some(layout)))
            .ok_or_else(|| format!("holds {record:?}, not copies:max_copies")),
        _ => Err(format!("unknown status {status:?}")),
    }
}

/// Parses `hotsplit_live`'s list of other live members (`<copies>:<instance>`) into their copy
/// counts.
pub(super) fn parse_live_reply(
    reply: Value,
) -> std::result::Result<Vec<crate::store::LiveMember>, String> {
    reply
        .into_array()
        .into_iter()
        .map(|member| {
            let text = member
                .as_str()
                .ok_or_else(|| format!("a member is not text: {member:?}"))?;
            text.split_once(':')
                .and_then(|(copies, instance)| {
                    Some(crate::store::LiveMember {
                        copies: copies.parse().ok()?,
                        instance: instance.to_owned(),
                    })
                })
                .ok_or_else(|| format!("member {text:?} is not copies:instance"))
        })
        .collect()
}

/// Parses the library names of a `FUNCTION LIST` reply: one entry per library, each a map (RESP3)
/// or a flat list of field names and values (RESP2) holding `library_name`.
pub(super) fn parse_library_names(reply: Value) -> std::result::Result<Vec<String>, String> {
    let entries = match reply {
        Value::Null => return Ok(Vec::new()),
        Value::Array(entries) => entries,
        other => return Err(format!("expected a list of libraries, got {other:?}")),
    };
    entries
        .into_iter()
        .map(|entry| {
            let fields: Vec<(Value, Value)> = match entry {
                Value::Map(map) => map
                    .inner()
                    .into_iter()
                    .map(|(key, value)| (Value::from(key), value))
                    .collect(),
                Value::Array(flat) => {
                    let mut pairs = Vec::with_capacity(flat.len() / 2);
                    let mut flat = flat.into_iter();
                    while let (Some(key), Some(value)) = (flat.next(), flat.next()) {
                        pairs.push((key, value));
                    }
                    pairs
                }
                other => return Err(format!("a library entry is not a map: {other:?}")),
            };
            fields
                .into_iter()
                .find(|(key, _)| key.as_str().as_deref() == Some("library_name"))
                .and_then(|(_, name)| name.as_str().map(|name| name.into_owned()))
                .ok_or_else(|| "a library entry has no library_name".to_owned())
        })
        .collect()
}

/// Parses the lease function's (`hotsplit_lease_v2`) `{"held"|"taken", holder}`.
pub(super) fn parse_lease_reply(reply: Value) -> std::result::Result<Lease, String> {
    let [status, holder] = <[Value; 2]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let holder = holder
        .as_string()
        .ok_or_else(|| format!("the holder is not text: {holder:?}"))?;
    match status.as_str().as_deref() {
        Some("held") => Ok(Lease::Held),
        Some("taken") => Ok(Lease::Taken { holder }),
        _ => Err(format!("unknown status {status:?}")),
    }
}

/// Parses `{"applied"|"current"|"stale"|"conflict", version}`.
pub(super) fn parse_cas_reply(reply: Value) -> std::result::Result<CasOutcome, String> {
    let fields = reply.into_array();
    let [status, version] = <[Value; 2]>::try_from(fields)
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let version = version
        .as_str()
        .ok_or_else(|| format!("the version is not text: {version:?}"))?
        .parse::<Version>()
        .map_err(|err| err.message().to_owned())?;
    match status.as_str().as_deref() {
        Some("applied") => Ok(CasOutcome::Applied),
        Some("current") => Ok(CasOutcome::Current),
        Some("stale") => Ok(CasOutcome::Stale { stored: version }),
        Some("conflict") => Ok(CasOutcome::Conflict { stored: version }),
        _ => Err(format!("unknown status {status:?}")),
    }
}

/// Parses the `HMGET ver val tomb exp` reply of a copy read at `now_ms`: `None` when the copy
/// does not exist, or is past its expiry (its hash is kept for the version retention, so the
/// compare-and-set still refuses older versions, but it is no longer served).
pub(super) fn parse_served_copy(
    reply: Value,
    now_ms: u64,
) -> std::result::Result<Option<CopyRecord>, String> {
    Ok(parse_copy(reply)?.filter(|record| record.expire_at_ms > now_ms))
}

/// Parses the `HMGET ver val tomb exp` reply of a copy: `None` when the copy does not exist.
pub(super) fn parse_copy(reply: Value) -> std::result::Result<Option<CopyRecord>, String> {
    let fields = reply.into_array();
    let [ver, val, tomb, exp] = <[Value; 4]>::try_from(fields)
        .map_err(|fields| format!("expected 4 fields, got {}", fields.len()))?;
    if ver.is_null() && val.is_null() && tomb.is_null() && exp.is_null() {
        return Ok(None);
    }
    // The fields are borrowed from the reply (a `Cow`), not copied: this runs on every read.
    fn text<'v>(name: &str, value: &'v Value) -> std::result::Result<Cow<'v, str>, String> {
        match value.as_str() {
            Some(text) => Ok(text),
            None if value.is_null() => Err(format!("field {name} is missing")),
            None => Err(format!("field {name} is not text")),
        }
    }
    let version = Version::from_str(&text("ver", &ver)?)
        .map_err(|err| format!("field ver: {}", err.message()))?;
    let expire_at_ms = {
        let exp = text("exp", &exp)?;
        exp.parse::<u64>()
            .map_err(|_| format!("field exp {exp:?} is not a millisecond timestamp"))?
    };
    let payload = match text("tomb", &tomb)?.as_ref() {
        "1" => Payload::Tombstone,
        "0" => Payload::Value(val.into_bytes().ok_or("field val is missing")?),
        other => return Err(format!("field tomb {other:?} is neither \"0\" nor \"1\"")),
    };
    Ok(Some(CopyRecord {
        version,
        payload,
        expire_at_ms,
    }))
}

/// Parses the text of `CLUSTER NODES` (with the shared parser of `hotsplit-redis-info`) into
/// shards: every master that is not flagged `fail`, `handshake` or `noaddr` and serves slots,
/// with its replicas (same exclusions), sorted by first slot. Slots being imported or migrated
/// (`[...]`) are left out.
pub(super) fn parse_cluster_nodes(text: &str) -> std::result::Result<Vec<Shard>, String> {
    let nodes: Vec<ClusterNode> = hotsplit_redis_info::parse_cluster_nodes(text)?
        .into_iter()
        .filter(|node| {
            !["fail", "handshake", "noaddr"]
                .iter()
                .any(|flag| node.has_flag(flag))
                && !node.host.is_empty()
                && node.port != 0
        })
        .collect();
    let label = |node: &ClusterNode| {
        NodeLabel::new(format_address(
            node.host.trim_matches(['[', ']']),
            node.port,
        ))
    };
    let mut shards: Vec<(&str, Shard)> = nodes
        .iter()
        .filter(|node| node.is_master() && !node.slots.is_empty())
        .map(|node| {
            let mut slots = node.slots.clone();
            slots.sort_unstable();
            (
                node.id.as_str(),
                Shard {
                    primary: label(node),
                    replicas: Vec::new(),
                    slots,
                },
            )
        })
        .collect();
    for node in nodes.iter().filter(|node| node.is_replica()) {
        let Some(master) = &node.master_id else {
            continue;
        };
        if let Some((_, shard)) = shards.iter_mut().find(|(id, _)| id == master) {
            shard.replicas.push(label(node));
        }
    }
    for (_, shard) in &mut shards {
        shard.replicas.sort();
    }
    shards.sort_by_key(|(_, shard)| shard.slots.first().copied());
    Ok(shards.into_iter().map(|(_, shard)| shard).collect())
}

/// Parses `INFO replication` of a standalone server: its replicas (`slaveN:ip=…,port=…`), or
/// an error when the server is itself a replica.
pub(super) fn parse_info_replicas(text: &str) -> std::result::Result<Vec<NodeLabel>, String> {
    let field = |name: &str| info_field(text, name);
    if field("role") == Some("slave") {
        let primary = match (field("master_host"), field("master_port")) {
            (Some(host), Some(port)) => format!(" of {host}:{port}"),
            _ => String::new(),
        };
        return Err(format!(
            "it is a replica{primary}; point the audit at the primary, whose replicas it finds"
        ));
    }
    let mut replicas = Vec::new();
    for line in text.lines().map(str::trim_end) {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let is_slave_line = key
            .strip_prefix("slave")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_slave_line {
            continue;
        }
        let item = |name: &str| {
            value.split(',').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                (key == name).then_some(value)
            })
        };
        let (Some(ip), Some(port)) = (item("ip"), item("port")) else {
            return Err(format!("cannot read the replica in {line:?}"));
        };
        let port: u16 = port
            .parse()
            .map_err(|_| format!("cannot read the replica port in {line:?}"))?;
        replicas.push(NodeLabel::new(format_address(ip, port)));
    }
    replicas.sort();
    Ok(replicas)
}

/// Parses a `SCAN` reply: `[cursor, [key, ...]]`.
pub(super) fn parse_scan_page(reply: Value) -> std::result::Result<ScanPage, String> {
    let [cursor, keys] = <[Value; 2]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 2 fields, got {}", fields.len()))?;
    let cursor = cursor.as_string().ok_or("the cursor is not text")?;
    let keys = keys
        .into_array()
        .into_iter()
        .map(|key| key.as_string().ok_or("a key is not text"))
        .collect::<std::result::Result<Vec<String>, _>>()?;
    Ok(ScanPage {
        next: (cursor != "0").then_some(cursor),
        keys,
    })
}

/// Parses the `HMGET ver tomb exp` reply of a copy read at `now_ms`: `None` when the copy does
/// not exist or is past its expiry (kept only so older writes stay refused; no read serves it).
pub(super) fn parse_stamp(
    reply: Value,
    now_ms: u64,
) -> std::result::Result<Option<CopyStamp>, String> {
    let [ver, tomb, exp] = <[Value; 3]>::try_from(reply.into_array())
        .map_err(|fields| format!("expected 3 fields, got {}", fields.len()))?;
    if ver.is_null() && tomb.is_null() && exp.is_null() {
        return Ok(None);
    }
    let exp = exp.as_str().ok_or("field exp is missing or not text")?;
    let expire_at_ms: u64 = exp
        .parse()
        .map_err(|_| format!("field exp {exp:?} is not a millisecond timestamp"))?;
    if expire_at_ms <= now_ms {
        return Ok(None);
    }
    let ver = ver.as_str().ok_or("field ver is missing or not text")?;
    let version = Version::from_str(&ver).map_err(|err| format!("field ver: {}", err.message()))?;
    let tombstone = match tomb.as_str().as_deref() {
        Some("1") => true,
        Some("0") => false,
        Some(other) => return Err(format!("field tomb {other:?} is neither \"0\" nor \"1\"")),
        None => return Err("field tomb is missing".to_owned()),
    };
    Ok(Some(CopyStamp { version, tombstone }))
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn library_names_are_read_from_resp2_and_resp3_function_lists() {
        let resp2 = Value::Array(vec![
            Value::Array(vec![
                Value::from("library_name"),
                Value::from("hotsplit"),
                Value::from("engine"),
                Value::from("LUA"),
                Value::from("functions"),
                Value::Array(Vec::new()),
            ]),
            Value::Array(vec![
                Value::from("library_name"),
                Value::from("hotsplit_v2"),
            ]),
        ]);
        assert_eq!(
            parse_library_names(resp2),
            Ok(vec!["hotsplit".to_owned(), "hotsplit_v2".to_owned()])
        );
        let mut map = fred::types::Map::new();
        map.insert("engine".into(), Value::from("LUA"));
        map.insert("library_name".into(), Value::from("hotsplit_v3"));
        assert_eq!(
            parse_library_names(Value::Array(vec![Value::Map(map)])),
            Ok(vec!["hotsplit_v3".to_owned()])
        );
        assert_eq!(
            parse_library_names(Value::Array(Vec::new())),
            Ok(Vec::new())
        );
        assert_eq!(parse_library_names(Value::Null), Ok(Vec::new()));
        assert!(parse_library_names(Value::Array(vec![Value::Array(vec![
            Value::from("engine"),
            Value::from("LUA"),
        ])]))
        .is_err());
        assert!(parse_library_names(Value::from("hotsplit")).is_err());
    }

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::from(host),
            Value::Integer(port),
            Value::from("0123456789abcdef"),
        ])
    }

    #[test]
    fn reads_each_primarys_replicas_out_of_cluster_slots() {
        let range = |start, end, nodes: Vec<Value>| {
            let mut parts = vec![Value::Integer(start), Value::Integer(end)];
            parts.extend(nodes);
            Value::Array(parts)
        };
        let reply = Value::Array(vec![
            range(
                0,
                5460,
                vec![
                    node("10.0.0.1", 7000),
                    node("10.0.0.5", 7004),
                    node("10.0.0.4", 7003),
                ],
            ),
            // A primary with two ranges lists its replicas once.
            range(
                5461,
                5470,
                vec![node("10.0.0.1", 7000), node("10.0.0.4", 7003)],
            ),
            range(5471, 16383, vec![node("10.0.0.2", 7001)]),
        ]);
        let map = replicas_from_cluster_slots(&reply).unwrap();
        assert_eq!(
            map[&NodeLabel::new("10.0.0.1:7000")],
            vec![
                NodeLabel::new("10.0.0.4:7003"),
                NodeLabel::new("10.0.0.5:7004")
            ]
        );
        assert!(map[&NodeLabel::new("10.0.0.2:7001")].is_empty());
        assert_eq!(map.len(), 2);

        let bad = Value::Array(vec![range(0, 1, vec![Value::from("no-node")])]);
        assert!(replicas_from_cluster_slots(&bad).is_err());
        assert!(replicas_from_cluster_slots(&Value::Null).is_err());
    }

    fn text(value: &str) -> Value {
        Value::String(value.into())
    }

    #[test]
    fn parses_cas_replies() {
        let reply = |status: &str, version: &str| Value::Array(vec![text(status), text(version)]);
        assert_eq!(
            parse_cas_reply(reply("applied", "7")),
            Ok(CasOutcome::Applied)
        );
        assert_eq!(
            parse_cas_reply(reply("current", "7")),
            Ok(CasOutcome::Current)
        );
        assert_eq!(
            parse_cas_reply(reply("stale", "18446744073709551615")),
            Ok(CasOutcome::Stale {
                stored: Version::new(u64::MAX).unwrap()
            })
        );
        assert!(parse_cas_reply(reply("maybe", "7")).is_err());
        assert!(parse_cas_reply(reply("stale", "07")).is_err());
        assert!(parse_cas_reply(Value::Array(vec![text("applied")])).is_err());
        assert!(parse_cas_reply(Value::Null).is_err());
    }

    #[test]
    fn parses_copies() {
        let reply = |fields: [Option<&str>; 4]| {
            Value::Array(
                fields
                    .iter()
                    .map(|field| field.map(text).unwrap_or(Value::Null))
                    .collect(),
            )
        };
        assert_eq!(parse_copy(reply([None, None, None, None])), Ok(None));
        assert_eq!(
            parse_copy(reply([
                Some("9007199254740993"),
                Some("hello"),
                Some("0"),
                Some("1700000000000")
            ])),
            Ok(Some(CopyRecord {
                version: Version::new(9_007_199_254_740_993).unwrap(),
                payload: Payload::Value(Bytes::from_static(b"hello")),
                expire_at_ms: 1_700_000_000_000,
            }))
        );
        let binary = Value::Array(vec![
            text("3"),
            Value::Bytes(Bytes::from_static(&[0xff, 0x00])),
            text("0"),
            text("5"),
        ]);
        assert_eq!(
            parse_copy(binary).unwrap().unwrap().payload,
            Payload::Value(Bytes::from_static(&[0xff, 0x00]))
        );
        assert_eq!(
            parse_copy(reply([Some("3"), Some(""), Some("1"), Some("5")]))
                .unwrap()
                .unwrap()
                .payload,
            Payload::Tombstone
        );
        for corrupt in [
            [Some("x"), Some("v"), Some("0"), Some("5")],
            [None, Some("v"), Some("0"), Some("5")],
            [Some("3"), None, Some("0"), Some("5")],
            [Some("3"), Some("v"), Some("2"), Some("5")],
            [Some("3"), Some("v"), Some("0"), Some("-5")],
            [Some("3"), Some("v"), Some("0"), None],
        ] {
            assert!(parse_copy(reply(corrupt)).is_err(), "{corrupt:?}");
        }
        assert!(parse_copy(Value::Array(vec![text("1")])).is_err());
    }

    #[test]
    fn parses_cluster_nodes_into_shards() {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383 [93->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 127.0.0.1:30005@31005 slave 67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 0 1426238316232 5 connected
824fe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30006@31006 slave,fail 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 1426238317741 6 disconnected
aaaafe116063bc5fcf9f4ffd895bc17aee7731ac3 :0@0 slave,noaddr 292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 0 0 6 disconnected
bbbbfe116063bc5fcf9f4ffd895bc17aee7731ac3 127.0.0.1:30007@31007 master - 0 0 7 connected
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5459 5460
";
        let shards = parse_cluster_nodes(text).unwrap();
        let label = NodeLabel::new;
        assert_eq!(
            shards,
            [
                Shard {
                    primary: label("127.0.0.1:30001"),
                    replicas: vec![label("127.0.0.1:30004")],
                    slots: vec![(0, 5459), (5460, 5460)],
                },
                Shard {
                    primary: label("127.0.0.1:30002"),
                    replicas: vec![label("127.0.0.1:30005")],
                    slots: vec![(5461, 10922)],
                },
                Shard {
                    // Its replica failed; the master without slots is left out.
                    primary: label("127.0.0.1:30003"),
                    replicas: vec![],
                    slots: vec![(10923, 16383)],
                },
            ]
        );
        assert!(parse_cluster_nodes("id 127.0.0.1:1@2 master").is_err());
        assert!(parse_cluster_nodes("").unwrap().is_empty());
    }

    #[test]
    fn finds_standalone_replicas_in_info_replication() {
        let text = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=30002,state=online,offset=123,lag=0\r\nslave1:ip=10.0.0.5,port=6380,state=wait_bgsave,offset=0,lag=0\r\nmaster_failover_state:no-failover\r\nmaster_repl_offset:123\r\n";
        assert_eq!(
            parse_info_replicas(text).unwrap(),
            [
                NodeLabel::new("10.0.0.5:6380"),
                NodeLabel::new("127.0.0.1:30002")
            ]
        );
        assert!(parse_info_replicas("role:master\r\nconnected_slaves:0\r\n")
            .unwrap()
            .is_empty());
        let err = parse_info_replicas("role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:7000\r\n")
            .unwrap_err();
        assert!(err.contains("replica of 10.0.0.1:7000"), "{err}");
        assert!(parse_info_replicas("role:master\r\nslave0:ip=x,state=online\r\n").is_err());
    }

    #[test]
    fn parses_lease_replies() {
        let reply = |status: &str, holder: &str| {
            Value::Array(vec![Value::from(status), Value::from(holder)])
        };
        assert_eq!(parse_lease_reply(reply("held", "a")).unwrap(), Lease::Held);
        assert_eq!(
            parse_lease_reply(reply("taken", "b")).unwrap(),
            Lease::Taken {
                holder: "b".to_owned()
            }
        );
        assert!(parse_lease_reply(reply("lost", "b")).is_err());
        assert!(parse_lease_reply(Value::Null).is_err());
    }

    #[test]
    fn parses_scan_pages_and_stamps() {
        let page = Value::Array(vec![
            text("17"),
            Value::Array(vec![text("a#1"), text("b#0")]),
        ]);
        assert_eq!(
            parse_scan_page(page).unwrap(),
            ScanPage {
                next: Some("17".to_owned()),
                keys: vec!["a#1".to_owned(), "b#0".to_owned()],
            }
        );
        let last = Value::Array(vec![text("0"), Value::Array(vec![])]);
        assert_eq!(parse_scan_page(last).unwrap().next, None);
        assert!(parse_scan_page(Value::Null).is_err());

        let stamp = |ver: Option<&str>, tomb: Option<&str>| {
            parse_stamp(
                Value::Array(vec![
                    ver.map(text).unwrap_or(Value::Null),
                    tomb.map(text).unwrap_or(Value::Null),
                    text("2000"),
                ]),
                1000,
            )
        };
        assert_eq!(
            stamp(None, None).unwrap_err(),
            "field ver is missing or not text"
        );
        let expired = Value::Array(vec![text("4"), text("0"), text("1000")]);
        assert_eq!(parse_stamp(expired, 1000), Ok(None));
        let missing = Value::Array(vec![Value::Null, Value::Null, Value::Null]);
        assert_eq!(parse_stamp(missing, 1000), Ok(None));
        assert_eq!(
            stamp(Some("18446744073709551615"), Some("1")),
            Ok(Some(CopyStamp {
                version: Version::new(u64::MAX).unwrap(),
                tombstone: true,
            }))
        );
        assert_eq!(
            stamp(Some("4"), Some("0")).unwrap().map(|s| s.tombstone),
            Some(false)
        );
        for corrupt in [
            (Some("04"), Some("0")),
            (Some("4"), None),
            (None, Some("0")),
            (Some("4"), Some("2")),
        ] {
            assert!(stamp(corrupt.0, corrupt.1).is_err(), "{corrupt:?}");
        }
    }
}
