//! Pure parsers of the text replies of Redis's `CLUSTER NODES` and `INFO`.
//!
//! Both hotsplit's Redis store (which builds its slot map from `CLUSTER NODES` and reads
//! `INFO replication`) and the dev cluster (which waits for a cluster to become healthy) read
//! these replies, so the parsing lives here once. The crate has no dependencies and does no I/O:
//! callers send the command however they like and hand the reply's text in.
//!
//! # Invariants
//! - Parsing never panics on any input; a line that cannot be read is an `Err` naming the line.
//! - [`ClusterNode`] is neutral: it keeps every node and every flag and leaves the choice of
//!   which nodes count (failed, handshake, no address) to the caller.

#![forbid(unsafe_code)]

/// One line of `CLUSTER NODES`: a node as one member of the cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// The 40-character node id.
    pub id: String,
    /// The client host as the line gives it (an IP address or, rarely, a name); empty while the
    /// address is unknown (`:0@0` for a `noaddr` node).
    pub host: String,
    /// The client port; 0 while the address is unknown.
    pub port: u16,
    /// The raw flags, e.g. `["myself", "master"]`, `["slave"]`, `["master", "fail"]`.
    pub flags: Vec<String>,
    /// The id of the master this node replicates; `None` for a master (`-`).
    pub master_id: Option<String>,
    /// Whether the reporting node's cluster bus link to this node is connected.
    pub connected: bool,
    /// The node's config epoch (0 if the field does not parse).
    pub config_epoch: u64,
    /// The slot ranges this node serves, inclusive, in `CLUSTER NODES` order. Slots being
    /// imported or migrated (`[slot->-id]`, `[slot-<-id]`) are left out.
    pub slots: Vec<(u16, u16)>,
}

impl ClusterNode {
    /// Tells whether `flag` (e.g. `"master"`, `"slave"`, `"handshake"`) is among the node's
    /// flags.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|own| own == flag)
    }

    /// Tells whether the node has the `master` flag.
    pub fn is_master(&self) -> bool {
        self.has_flag("master")
    }

    /// Tells whether the node has the `slave` flag.
    pub fn is_replica(&self) -> bool {
        self.has_flag("slave")
    }

    /// Tells whether the node is flagged `fail` (agreed failed by a majority of masters).
    pub fn is_failed(&self) -> bool {
        self.has_flag("fail")
    }

    /// Tells whether the node is flagged `fail?` (suspected by the reporting node).
    pub fn is_suspected(&self) -> bool {
        self.has_flag("fail?")
    }

    /// Tells whether this line describes the reporting node itself.
    pub fn is_myself(&self) -> bool {
        self.has_flag("myself")
    }

    /// The client address as `host:port`, as the line gives it (`":0"` while it is unknown).
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Tells whether the node serves `slot`.
    pub fn serves_slot(&self, slot: u16) -> bool {
        self.slots
            .iter()
            .any(|&(first, last)| first <= slot && slot <= last)
    }

    /// The number of slots the node serves.
    pub fn slot_count(&self) -> usize {
        self.slots
            .iter()
            .map(|&(first, last)| usize::from(last.saturating_sub(first)) + 1)
            .sum()
    }
}

/// Parses the text of `CLUSTER NODES`, one [`ClusterNode`] per non-empty line, in order.
///
/// # Errors
/// A line with fewer than 8 fields, an address without a port or with a port that does not
/// parse, or a slot range that does not parse; the message names the line.
pub fn parse_cluster_nodes(text: &str) -> Result<Vec<ClusterNode>, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(parse_cluster_nodes_line)
        .collect()
}

/// Parses one line of `CLUSTER NODES`:
/// `<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv> <config-epoch>
/// <link-state> <slot> ...`.
///
/// # Errors
/// As for [`parse_cluster_nodes`].
pub fn parse_cluster_nodes_line(line: &str) -> Result<ClusterNode, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() < 8 {
        return Err(format!("a line has {} fields: {line:?}", fields.len()));
    }
    let address = fields[1].split(['@', ',']).next().unwrap_or_default();
    let Some((host, port)) = address.rsplit_once(':') else {
        return Err(format!("address {:?} has no port in {line:?}", fields[1]));
    };
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address {:?} has a bad port in {line:?}", fields[1]))?;
    let mut slots = Vec::new();
    for range in &fields[8..] {
        if range.starts_with('[') {
            continue;
        }
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        match (first.parse(), last.parse()) {
            (Ok(first), Ok(last)) => slots.push((first, last)),
            _ => return Err(format!("slot range {range:?} does not parse in {line:?}")),
        }
    }
    Ok(ClusterNode {
        id: fields[0].to_owned(),
        host: host.to_owned(),
        port,
        flags: fields[2].split(',').map(str::to_owned).collect(),
        master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
        connected: fields[7] == "connected",
        config_epoch: fields[6].parse().unwrap_or(0),
        slots,
    })
}

/// Returns the value of `field` in an `INFO`-style text of `field:value` lines, trimmed.
pub fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name == field).then(|| value.trim())
    })
}

/// Returns the value of `field` in an `INFO`-style text as a number; `None` if the field is
/// missing or its value is not a non-negative integer.
pub fn info_number(info: &str, field: &str) -> Option<u64> {
    info_field(info, field)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002,host master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 [93->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,fail,noaddr - 1 2 5 disconnected 10923 10924-16383
";

    #[test]
    fn cluster_nodes_lines_parse() {
        let nodes = parse_cluster_nodes(NODES).unwrap();
        assert_eq!(nodes.len(), 4);
        assert!(nodes[0].is_replica() && !nodes[0].is_master());
        assert_eq!(
            nodes[0].master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert_eq!(nodes[1].addr(), "127.0.0.1:30002");
        assert_eq!(nodes[1].slots, vec![(5461, 10922)]);
        assert_eq!(nodes[1].config_epoch, 2);
        assert!(nodes[2].is_myself() && nodes[2].is_master());
        assert_eq!(nodes[2].slots, vec![(0, 5460)]);
        assert!(nodes[3].is_failed() && !nodes[3].is_suspected() && !nodes[3].connected);
        assert!(nodes[3].has_flag("noaddr"));
        assert_eq!((nodes[3].host.as_str(), nodes[3].port), ("", 0));
        assert_eq!(nodes[3].slot_count(), 16384 - 10923);
        assert!(nodes[3].serves_slot(10923) && !nodes[3].serves_slot(10922));
    }

    #[test]
    fn bad_cluster_nodes_lines_are_errors() {
        assert!(parse_cluster_nodes("id 127.0.0.1:1@2 master").is_err());
        assert!(parse_cluster_nodes("id 127.0.0.1@2 master - 0 0 1 connected").is_err());
        assert!(parse_cluster_nodes("id 127.0.0.1:x@2 master - 0 0 1 connected").is_err());
        assert!(parse_cluster_nodes("id 127.0.0.1:1@2 master - 0 0 1 connected 5-x").is_err());
        assert!(parse_cluster_nodes("").unwrap().is_empty());
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:2\r\nmaster_repl_offset:-1\r\nslave0:ip=127.0.0.1,port=1\r\n";
        assert_eq!(info_field(info, "role"), Some("master"));
        assert_eq!(info_field(info, "connected"), None);
        assert_eq!(info_number(info, "connected_slaves"), Some(2));
        assert_eq!(info_number(info, "master_repl_offset"), None);
        assert_eq!(info_number(info, "role"), None);
        assert_eq!(info_field(info, "slave0"), Some("ip=127.0.0.1,port=1"));
    }
}
