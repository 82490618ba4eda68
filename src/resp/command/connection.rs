//! The handshake and connection commands: `HELLO`, `AUTH`, `PING`, `ECHO`, `SELECT`, `RESET`,
//! `CLIENT …`, `HOTSPLIT.CLIENT`, `HOTSPLIT.CLASS`, `HOTSPLIT.SESSION`: each a struct parsed from
//! its arguments ([`super::parse`]; a label is checked there) and applied to the connection's
//! state. `AUTH` and `HELLO … AUTH` check the token when applied, `HELLO … SETNAME` after it.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::parse::{text, Args, Local, Parse};
use super::table;
use super::tracking::ClientTracking;
use super::{Authenticated, ConnState, Door, Secret};
use crate::auth::Verdict;
use crate::resp::reply::{Proto, Reply};
use crate::store::now_unix_ms;

/// The Redis version the door says it is: new enough for every client's feature checks
/// (redis-py and Jedis offer client-side caching only from 7.4.0).
pub(crate) const REDIS_VERSION: &str = "7.4.0";

/// The longest name, class or client id a connection may set.
const MAX_LABEL: usize = 512;

/// A label (name, client id, class): at most 512 printable ASCII bytes, no spaces.
fn label(arg: &[u8], what: &str) -> Result<String, RespError> {
    if arg.len() > MAX_LABEL || !arg.iter().all(|byte| (0x21..=0x7e).contains(byte)) {
        return Err(RespError::err(format!(
            "{what} must be 1..={MAX_LABEL} printable ASCII bytes without spaces"
        )));
    }
    text(arg, what)
}

/// `PING [message]`.
pub(crate) struct Ping {
    /// The message to echo; `None`: `+PONG`.
    message: Option<Bytes>,
}

impl Parse for Ping {
    fn parse(args: &mut Args) -> Result<Ping, RespError> {
        Ok(Ping {
            message: args.next_optional(),
        })
    }
}

impl Local for Ping {
    fn apply(self, _door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        if conn.tracking.in_subscribed_mode(conn.proto) {
            // As Redis answers a subscribed RESP2 connection.
            let message = self.message.unwrap_or_default();
            return Ok(Reply::Array(vec![
                Reply::bulk("pong"),
                Reply::Bulk(message),
            ]));
        }
        Ok(self.message.map_or(Reply::Simple("PONG"), Reply::Bulk))
    }
}

/// `ECHO message`.
pub(crate) struct Echo {
    /// What comes back.
    message: Bytes,
}

impl Parse for Echo {
    fn parse(args: &mut Args) -> Result<Echo, RespError> {
        Ok(Echo {
            message: args.next_bytes()?,
        })
    }
}

impl Local for Echo {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(Reply::Bulk(self.message))
    }
}

/// `SELECT index`: only 0 exists.
pub(crate) struct Select {
    /// The database asked for.
    index: i64,
}

impl Parse for Select {
    fn parse(args: &mut Args) -> Result<Select, RespError> {
        Ok(Select {
            index: args.next_int()?,
        })
    }
}

impl Local for Select {
    fn apply(self, _door: &Door, _conn: &mut ConnState) -> Result<Reply, RespError> {
        match self.index {
            0 => Ok(Reply::OK),
            _ => Err(RespError::err("DB index is out of range")),
        }
    }
}

/// What `HOTSPLIT.CLIENT` and `HOTSPLIT.CLASS` do with their label.
#[derive(Debug)]
pub(crate) enum LabelCall {
    /// No argument: answer the label (nil when none).
    Show,
    /// `""`: drop it.
    Drop,
    /// Set it (checked: [`label`]).
    Set(String),
}

impl LabelCall {
    /// The call from `args`, the label named `what` in its error.
    fn parse(args: &mut Args, what: &str) -> Result<LabelCall, RespError> {
        Ok(match args.next_optional() {
            None => LabelCall::Show,
            Some(arg) if arg.is_empty() => LabelCall::Drop,
            Some(arg) => LabelCall::Set(label(&arg, what)?),
        })
    }

    /// Applies the call to `slot`.
    fn apply(self, slot: &mut Option<String>) -> Reply {
        match self {
            LabelCall::Show => slot.clone().map_or(Reply::Nil, Reply::bulk),
            LabelCall::Drop => {
                *slot = None;
                Reply::OK
            }
            LabelCall::Set(label) => {
                *slot = Some(label);
                Reply::OK
            }
        }
    }
}

/// `HOTSPLIT.CLIENT [id]`: answers the explicit client id (nil when none), sets it, or drops
/// it (`""`).
pub(crate) struct HotsplitClient(LabelCall);

impl Parse for HotsplitClient {
    fn parse(args: &mut Args) -> Result<HotsplitClient, RespError> {
        LabelCall::parse(args, "a client id").map(HotsplitClient)
    }
}

impl Local for HotsplitClient {
    fn apply(self, _door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(self.0.apply(&mut conn.client))
    }
}

/// `HOTSPLIT.CLASS [name]`: answers, sets or drops (`""`) the connection's read class. A name
/// no class has is refused when a read uses it (`ERR unknown read class …`).
pub(crate) struct HotsplitClass(LabelCall);

impl Parse for HotsplitClass {
    fn parse(args: &mut Args) -> Result<HotsplitClass, RespError> {
        LabelCall::parse(args, "a class name").map(HotsplitClass)
    }
}

impl Local for HotsplitClass {
    fn apply(self, _door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(self.0.apply(&mut conn.class))
    }
}

/// `HOTSPLIT.SESSION [token…]`: answers the connection's session token, or takes the tokens'
/// (several are merged, a floor only ever rising).
pub(crate) struct HotsplitSession {
    /// The tokens to take; `None`: answer the token.
    tokens: Option<Vec<Bytes>>,
}

impl Parse for HotsplitSession {
    fn parse(args: &mut Args) -> Result<HotsplitSession, RespError> {
        let tokens = (!args.is_empty()).then(|| args.rest().collect());
        Ok(HotsplitSession { tokens })
    }
}

impl Local for HotsplitSession {
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        let ops = door.core.ops();
        match self.tokens {
            None => Ok(Reply::Bulk(ops.session_token(&conn.session))),
            Some(tokens) => {
                let lines: Vec<&[u8]> = tokens.iter().map(Bytes::as_ref).collect();
                conn.session = ops.session(&lines, now_unix_ms());
                Ok(Reply::OK)
            }
        }
    }
}

/// `AUTH [user] password`.
pub(crate) struct Auth {
    /// The user, when sent (only `default` is one).
    user: Option<Bytes>,
    /// The API token.
    password: Bytes,
}

impl Parse for Auth {
    fn parse(args: &mut Args) -> Result<Auth, RespError> {
        let first = args.next_bytes()?;
        let second = args.next_optional();
        if !args.is_empty() {
            return Err(RespError::syntax());
        }
        Ok(match second {
            Some(password) => Auth {
                user: Some(first),
                password,
            },
            None => Auth {
                user: None,
                password: first,
            },
        })
    }
}

impl Local for Auth {
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        door.authenticate(conn, self.user.as_ref(), &self.password)?;
        Ok(Reply::OK)
    }
}

/// `HELLO [protover [AUTH user password] [SETNAME name]]`.
pub(crate) struct Hello {
    /// The protocol asked for; `None`: the connection's.
    proto: Option<Proto>,
    /// `AUTH user password`.
    auth: Option<(Bytes, Bytes)>,
    /// `SETNAME name` (checked once the connection is authenticated).
    setname: Option<Bytes>,
}

impl Parse for Hello {
    fn parse(args: &mut Args) -> Result<Hello, RespError> {
        let proto = match args.next_optional() {
            None => None,
            Some(version) => Some(hello_proto(&version)?),
        };
        let mut auth = None;
        let mut setname = None;
        while let Some(option) = args.next_optional() {
            if option.eq_ignore_ascii_case(b"AUTH") && args.len() >= 2 {
                auth = Some((args.next_bytes()?, args.next_bytes()?));
            } else if option.eq_ignore_ascii_case(b"SETNAME") && !args.is_empty() {
                setname = Some(args.next_bytes()?);
            } else {
                return Err(RespError::err(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(&option)
                )));
            }
        }
        Ok(Hello {
            proto,
            auth,
            setname,
        })
    }
}

/// `HELLO`'s protocol version: 2 or 3.
fn hello_proto(version: &[u8]) -> Result<Proto, RespError> {
    let version: i64 = std::str::from_utf8(version)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| RespError::err("Protocol version is not an integer or out of range"))?;
    match version {
        2 => Ok(Proto::Resp2),
        3 => Ok(Proto::Resp3),
        _ => Err(RespError::new(
            Prefix::NoProto,
            "unsupported protocol version",
        )),
    }
}

impl Local for Hello {
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        if let Some((user, password)) = &self.auth {
            door.authenticate(conn, Some(user), password)?;
        } else if conn.auth.is_none() && door.tokens_configured() {
            return Err(RespError::new(
                Prefix::NoAuth,
                "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            ));
        }
        if let Some(name) = self.setname {
            conn.name = Some(label(&name, "a client name")?);
        }
        let proto = self.proto.unwrap_or(conn.proto);
        conn.proto = proto;
        let proto_number = match proto {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        };
        Ok(Reply::Map(vec![
            (Reply::bulk("server"), Reply::bulk("redis")),
            (Reply::bulk("version"), Reply::bulk(REDIS_VERSION)),
            (Reply::bulk("proto"), Reply::Int(proto_number)),
            (Reply::bulk("id"), Reply::Int(conn.id as i64)),
            (Reply::bulk("mode"), Reply::bulk("standalone")),
            (Reply::bulk("role"), Reply::bulk("master")),
            (Reply::bulk("modules"), Reply::Array(Vec::new())),
        ]))
    }
}

/// `CLIENT subcommand …`.
#[derive(Debug)]
pub(crate) enum Client {
    /// `SETNAME name`: a label (`None`: `""`, which drops it).
    SetName(Option<String>),
    /// `GETNAME`.
    GetName,
    /// `ID`.
    Id,
    /// `INFO`.
    Info,
    /// `SETINFO LIB-NAME name`.
    LibName(String),
    /// `SETINFO LIB-VER version`.
    LibVer(String),
    /// `NO-EVICT on|off`, `NO-TOUCH on|off`: nothing to do.
    Flag,
    /// `TRACKING`, `CACHING`, `GETREDIR`, `TRACKINGINFO`.
    Tracking(ClientTracking),
}

/// `ERR wrong number of arguments for 'client|SUB' command` unless exactly `wanted` arguments
/// follow the subcommand.
fn client_arity(args: &Args, wanted: usize, sub: &str) -> Result<(), RespError> {
    match args.len() == wanted {
        true => Ok(()),
        false => Err(RespError::arity(&format!("client|{sub}"))),
    }
}

impl Parse for Client {
    fn parse(args: &mut Args) -> Result<Client, RespError> {
        let sub = args.next_bytes()?;
        let upper = sub.to_ascii_uppercase();
        match upper.as_slice() {
            b"SETNAME" => {
                client_arity(args, 1, "setname")?;
                client_setname(&args.next_bytes()?)
            }
            b"GETNAME" => client_arity(args, 0, "getname").map(|()| Client::GetName),
            b"ID" => client_arity(args, 0, "id").map(|()| Client::Id),
            b"INFO" => client_arity(args, 0, "info").map(|()| Client::Info),
            b"SETINFO" => {
                client_arity(args, 2, "setinfo")?;
                let attribute = args.next_bytes()?;
                let value = label(&args.next_bytes()?, "a library name or version")?;
                match attribute.to_ascii_uppercase().as_slice() {
                    b"LIB-NAME" => Ok(Client::LibName(value)),
                    b"LIB-VER" => Ok(Client::LibVer(value)),
                    _ => Err(RespError::err(format!(
                        "Unrecognized option '{}'",
                        String::from_utf8_lossy(&attribute)
                    ))),
                }
            }
            b"NO-EVICT" | b"NO-TOUCH" => {
                client_arity(args, 1, &String::from_utf8_lossy(&upper).to_lowercase())?;
                match args.next_bytes()?.to_ascii_uppercase().as_slice() {
                    b"ON" | b"OFF" => Ok(Client::Flag),
                    _ => Err(RespError::syntax()),
                }
            }
            b"TRACKING" | b"CACHING" | b"GETREDIR" | b"TRACKINGINFO" => {
                ClientTracking::parse(&upper, args).map(Client::Tracking)
            }
            _ => Err(table::unknown_subcommand("client", &sub)),
        }
    }
}

/// `CLIENT SETNAME name`'s name: `""` drops it; spaces and the like are refused in Redis's words.
fn client_setname(name: &[u8]) -> Result<Client, RespError> {
    if name.is_empty() {
        Ok(Client::SetName(None))
    } else if name.iter().all(|byte| (0x21..=0x7e).contains(byte)) {
        Ok(Client::SetName(Some(label(name, "a client name")?)))
    } else {
        Err(RespError::err(
            "Client names cannot contain spaces, newlines or special characters.",
        ))
    }
}

impl Local for Client {
    fn apply(self, door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Ok(match self {
            Client::SetName(name) => {
                conn.name = name;
                Reply::OK
            }
            Client::GetName => conn.name.clone().map_or(Reply::Nil, Reply::bulk),
            Client::Id => Reply::Int(conn.id as i64),
            Client::Info => Reply::Verbatim(door.client_line(conn)),
            Client::LibName(name) => {
                conn.lib_name = Some(name);
                Reply::OK
            }
            Client::LibVer(version) => {
                conn.lib_ver = Some(version);
                Reply::OK
            }
            Client::Flag => Reply::OK,
            Client::Tracking(command) => return door.client_tracking(conn, command),
        })
    }
}

impl Door {
    /// Whether the instance has tokens configured.
    fn tokens_configured(&self) -> bool {
        self.core.tokens().load().is_some()
    }

    /// Authenticates `conn` with `user` and `password` (an API token).
    fn authenticate(
        &self,
        conn: &mut ConnState,
        user: Option<&Bytes>,
        password: &Bytes,
    ) -> Result<(), RespError> {
        let tokens = self.core.tokens().load();
        let Some(tokens) = tokens.as_ref() else {
            // No tokens: nothing to check, as a Redis default user with `nopass`.
            return Ok(());
        };
        if user.is_some_and(|user| user.as_ref() != b"default") {
            conn.auth_failures += 1;
            return Err(RespError::wrong_pass());
        }
        match tokens.verify(password) {
            Verdict::Known(id) => {
                conn.auth = Some(Authenticated {
                    name: id.name.to_owned(),
                    scopes: id.scopes,
                    token: Secret(password.clone()),
                });
                Ok(())
            }
            Verdict::Unknown => {
                conn.auth_failures += 1;
                Err(RespError::wrong_pass())
            }
        }
    }

    /// `RESET`: the connection as it was when it opened, but for its id.
    pub(crate) fn reset(&self, conn: &mut ConnState) -> Reply {
        self.tracking_reset(conn);
        let tracking = std::mem::take(&mut conn.tracking);
        *conn = ConnState::new(conn.id);
        conn.tracking = tracking;
        Reply::Simple("RESET")
    }

    /// The connection's `CLIENT INFO` line, as Redis writes it (the fields a client reads).
    pub(crate) fn client_line(&self, conn: &ConnState) -> String {
        let proto = match conn.proto {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        };
        format!(
            "id={} name={} db=0 multi={} user={} lib-name={} lib-ver={} resp={proto}\n",
            conn.id,
            conn.name.as_deref().unwrap_or_default(),
            if conn.in_transaction() { 0 } else { -1 },
            conn.auth
                .as_ref()
                .map_or("default", |auth| auth.name.as_str()),
            conn.lib_name.as_deref().unwrap_or_default(),
            conn.lib_ver.as_deref().unwrap_or_default(),
        )
    }
}
