//! The handshake and connection commands: `HELLO`, `AUTH`, `PING`, `ECHO`, `SELECT`, `RESET`,
//! `CLIENT …`, `HOTSPLIT.CLIENT`, `HOTSPLIT.CLASS`, `HOTSPLIT.SESSION`.

use bytes::Bytes;

use super::errors::{Prefix, RespError};
use super::table;
use super::{Authenticated, ConnState, Door, Secret};
use crate::auth::Verdict;
use crate::resp::reply::{Proto, Reply};
use crate::store::now_unix_ms;

/// The Redis version the door says it is: new enough for every client's feature checks.
pub(crate) const REDIS_VERSION: &str = "7.2.0";

/// The longest name, class or client id a connection may set.
const MAX_LABEL: usize = 512;

/// The argument as text, or an `ERR` naming `what` when it is not UTF-8.
pub(crate) fn text(arg: &Bytes, what: &str) -> Result<String, RespError> {
    std::str::from_utf8(arg)
        .map(str::to_owned)
        .map_err(|_| RespError::err(format!("{what} is not valid UTF-8")))
}

/// A label (name, client id, class): at most 512 printable ASCII bytes, no spaces.
fn label(arg: &Bytes, what: &str) -> Result<String, RespError> {
    if arg.len() > MAX_LABEL || !arg.iter().all(|byte| (0x21..=0x7e).contains(byte)) {
        return Err(RespError::err(format!(
            "{what} must be 1..={MAX_LABEL} printable ASCII bytes without spaces"
        )));
    }
    text(arg, what)
}

/// `PING [message]`.
pub(crate) fn ping(args: &[Bytes]) -> Result<Reply, RespError> {
    match args {
        [_] => Ok(Reply::Simple("PONG")),
        [_, message] => Ok(Reply::Bulk(message.clone())),
        _ => Err(RespError::arity("ping")),
    }
}

/// `SELECT 0`.
pub(crate) fn select(args: &[Bytes]) -> Result<Reply, RespError> {
    let index: i64 = std::str::from_utf8(&args[1])
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(RespError::not_integer)?;
    if index == 0 {
        Ok(Reply::OK)
    } else {
        Err(RespError::err("DB index is out of range"))
    }
}

/// `HOTSPLIT.CLIENT [id]`: answers the explicit client id (nil when none), sets it, or drops
/// it (`""`).
pub(crate) fn hotsplit_client(conn: &mut ConnState, args: &[Bytes]) -> Result<Reply, RespError> {
    match args {
        [_] => Ok(conn.client.clone().map_or(Reply::Nil, Reply::bulk)),
        [_, id] if id.is_empty() => {
            conn.client = None;
            Ok(Reply::OK)
        }
        [_, id] => {
            conn.client = Some(label(id, "a client id")?);
            Ok(Reply::OK)
        }
        _ => Err(RespError::arity("hotsplit.client")),
    }
}

/// `HOTSPLIT.CLASS [name]`: answers, sets or drops (`""`) the connection's read class. A name
/// no class has is refused when a read uses it (`ERR unknown read class …`).
pub(crate) fn hotsplit_class(conn: &mut ConnState, args: &[Bytes]) -> Result<Reply, RespError> {
    match args {
        [_] => Ok(conn.class.clone().map_or(Reply::Nil, Reply::bulk)),
        [_, name] if name.is_empty() => {
            conn.class = None;
            Ok(Reply::OK)
        }
        [_, name] => {
            conn.class = Some(label(name, "a class name")?);
            Ok(Reply::OK)
        }
        _ => Err(RespError::arity("hotsplit.class")),
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

    /// `AUTH [user] password`.
    pub(crate) fn auth(&self, conn: &mut ConnState, args: &[Bytes]) -> Result<Reply, RespError> {
        match args {
            [_, password] => self.authenticate(conn, None, password)?,
            [_, user, password] => self.authenticate(conn, Some(user), password)?,
            _ => return Err(RespError::syntax()),
        }
        Ok(Reply::OK)
    }

    /// `HELLO [protover [AUTH user password] [SETNAME name]]`.
    pub(crate) fn hello(&self, conn: &mut ConnState, args: &[Bytes]) -> Result<Reply, RespError> {
        let mut proto = conn.proto;
        if let Some(version) = args.get(1) {
            let version: i64 = std::str::from_utf8(version)
                .ok()
                .and_then(|text| text.parse().ok())
                .ok_or_else(|| {
                    RespError::err("Protocol version is not an integer or out of range")
                })?;
            proto = match version {
                2 => Proto::Resp2,
                3 => Proto::Resp3,
                _ => {
                    return Err(RespError::new(
                        Prefix::NoProto,
                        "unsupported protocol version",
                    ))
                }
            };
        }
        let mut auth = None;
        let mut setname = None;
        let mut at = 2;
        while at < args.len() {
            let option = &args[at];
            if option.eq_ignore_ascii_case(b"AUTH") && at + 2 < args.len() {
                auth = Some((&args[at + 1], &args[at + 2]));
                at += 3;
            } else if option.eq_ignore_ascii_case(b"SETNAME") && at + 1 < args.len() {
                setname = Some(&args[at + 1]);
                at += 2;
            } else {
                return Err(RespError::err(format!(
                    "Syntax error in HELLO option '{}'",
                    String::from_utf8_lossy(option)
                )));
            }
        }
        if let Some((user, password)) = auth {
            self.authenticate(conn, Some(user), password)?;
        } else if conn.auth.is_none() && self.tokens_configured() {
            return Err(RespError::new(
                Prefix::NoAuth,
                "HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time",
            ));
        }
        if let Some(name) = setname {
            conn.name = Some(label(name, "a client name")?);
        }
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

    /// `RESET`: the connection as it was when it opened, but for its id.
    pub(crate) fn reset(&self, conn: &mut ConnState) -> Reply {
        *conn = ConnState::new(conn.id);
        Reply::Simple("RESET")
    }

    /// `HOTSPLIT.SESSION [token…]`: several tokens are merged, a floor only ever rising.
    pub(crate) fn hotsplit_session(
        &self,
        conn: &mut ConnState,
        args: &[Bytes],
    ) -> Result<Reply, RespError> {
        let ops = self.core.ops();
        match args {
            [_] => Ok(Reply::Bulk(ops.session_token(&conn.session))),
            [_, tokens @ ..] => {
                let lines: Vec<&[u8]> = tokens.iter().map(Bytes::as_ref).collect();
                conn.session = ops.session(&lines, now_unix_ms());
                Ok(Reply::OK)
            }
            [] => Err(RespError::arity("hotsplit.session")),
        }
    }

    /// `CLIENT subcommand …`.
    pub(crate) fn client(&self, conn: &mut ConnState, args: &[Bytes]) -> Result<Reply, RespError> {
        let sub = &args[1];
        let upper = sub.to_ascii_uppercase();
        let arity = |ok: bool, name: &str| {
            if ok {
                Ok(())
            } else {
                Err(RespError::arity(&format!("client|{name}")))
            }
        };
        match upper.as_slice() {
            b"SETNAME" => {
                arity(args.len() == 3, "setname")?;
                let name = &args[2];
                if name.is_empty() {
                    conn.name = None;
                } else if name.iter().all(|byte| (0x21..=0x7e).contains(byte)) {
                    conn.name = Some(label(name, "a client name")?);
                } else {
                    return Err(RespError::err(
                        "Client names cannot contain spaces, newlines or special characters.",
                    ));
                }
                Ok(Reply::OK)
            }
            b"GETNAME" => {
                arity(args.len() == 2, "getname")?;
                Ok(conn.name.clone().map_or(Reply::Nil, Reply::bulk))
            }
            b"ID" => {
                arity(args.len() == 2, "id")?;
                Ok(Reply::Int(conn.id as i64))
            }
            b"INFO" => {
                arity(args.len() == 2, "info")?;
                Ok(Reply::Verbatim(self.client_line(conn)))
            }
            b"SETINFO" => {
                arity(args.len() == 4, "setinfo")?;
                let value = label(&args[3], "a library name or version")?;
                let attribute = args[2].to_ascii_uppercase();
                match attribute.as_slice() {
                    b"LIB-NAME" => conn.lib_name = Some(value),
                    b"LIB-VER" => conn.lib_ver = Some(value),
                    _ => {
                        return Err(RespError::err(format!(
                            "Unrecognized option '{}'",
                            String::from_utf8_lossy(&args[2])
                        )))
                    }
                }
                Ok(Reply::OK)
            }
            b"NO-EVICT" | b"NO-TOUCH" => {
                arity(args.len() == 3, &String::from_utf8_lossy(&upper).to_lowercase())?;
                let flag = args[2].to_ascii_uppercase();
                if flag == b"ON" || flag == b"OFF" {
                    Ok(Reply::OK)
                } else {
                    Err(RespError::syntax())
                }
            }
            b"TRACKING" | b"CACHING" | b"GETREDIR" | b"TRACKINGINFO" => Err(RespError::err(
                "CLIENT TRACKING is not supported by hotsplit: the near cache bounds the age of what this instance answers instead",
            )),
            _ => Err(table::unknown_subcommand("client", sub)),
        }
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
