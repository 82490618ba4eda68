//! Client-side caching through the door: `CLIENT TRACKING`, `CLIENT CACHING`,
//! `CLIENT GETREDIR`, `CLIENT TRACKINGINFO`, `SUBSCRIBE __redis__:invalidate` (a `REDIRECT`
//! target's channel, the only one the door accepts), and how a read of a tracking connection
//! is tracked ([`Door::track_begin`], [`Door::track_settle`]). The table is
//! [`crate::tracking`]; what a lease is, [`crate::ops::Ops::lease`]; the pushes are written by
//! the connection loop between replies (`resp::conn`).
//!
//! Modes as Redis has them: the default (every read key tracked), `OPTIN` (only after
//! `CLIENT CACHING YES`, for the next command or a whole `MULTI … EXEC`), `OPTOUT` (all but
//! after `CLIENT CACHING NO`), `BCAST [PREFIX p…]` (every change under the prefixes, and the
//! keys the connection reads, so their leases are kept), `NOLOOP`, `REDIRECT id` (a RESP2
//! client's invalidations go to connection `id` of this instance, subscribed to
//! `__redis__:invalidate`). A RESP2 connection must name `REDIRECT`: it cannot be pushed to.

use std::sync::Arc;

use bytes::Bytes;

use super::errors::RespError;
use super::parse::{Args, Local, Parse};
use super::{ConnState, Door};
use crate::error::ErrorKind;
use crate::key::Key;
use crate::read::ReadAnswer;
use crate::resp::codec::{PushForm, INVALIDATE_CHANNEL};
use crate::resp::reply::{Proto, Reply};
use crate::store::now_unix_ms;
use crate::tracking::{Mode, Outbox, Refused};

/// A connection's client-side caching state.
#[derive(Debug, Default)]
pub struct TrackingState {
    /// Where its invalidations (its own, or those redirected to it) wait to be written.
    pub outbox: Arc<Outbox>,
    /// `CLIENT TRACKING ON`.
    on: bool,
    /// Its mode (`BCAST`, prefixes, `NOLOOP`, `REDIRECT`).
    mode: Mode,
    /// `OPTIN`.
    optin: bool,
    /// `OPTOUT`.
    optout: bool,
    /// `CLIENT CACHING YES|NO`, for the next command (or transaction).
    caching: Option<bool>,
    /// Set by `CLIENT CACHING`, so the command itself does not clear it.
    caching_just_set: bool,
    /// Subscribed to `__redis__:invalidate`.
    subscribed: bool,
}

impl TrackingState {
    /// Whether this connection's next read is tracked.
    pub(super) fn wants(&self) -> bool {
        self.on
            && (self.mode.bcast
                || match (self.optin, self.optout) {
                    (true, _) => self.caching == Some(true),
                    (_, true) => self.caching != Some(false),
                    _ => true,
                })
    }

    /// How this connection is given invalidations, speaking `proto`; `None`: it cannot be (a
    /// RESP2 connection not subscribed to the channel: Redis drops them too).
    pub fn push_form(&self, proto: Proto) -> Option<PushForm> {
        match (proto, self.subscribed) {
            (Proto::Resp3, _) => Some(PushForm::Push),
            (Proto::Resp2, true) => Some(PushForm::Message),
            (Proto::Resp2, false) => None,
        }
    }

    /// Whether a RESP2 connection is subscribed (only pub/sub commands, `PING`, `QUIT` and
    /// `RESET` may run).
    pub(super) fn in_subscribed_mode(&self, proto: Proto) -> bool {
        self.subscribed && proto == Proto::Resp2
    }

    /// After a command: `CLIENT CACHING`'s word lasts for one command, or for a transaction.
    pub(super) fn after_command(&mut self, in_transaction: bool) {
        if self.caching_just_set {
            self.caching_just_set = false;
        } else if !in_transaction {
            self.caching = None;
        }
    }
}

/// `CLIENT TRACKING|CACHING|GETREDIR|TRACKINGINFO …`.
#[derive(Debug)]
pub(crate) enum ClientTracking {
    /// `TRACKING ON …` with the mode asked.
    On {
        /// `BCAST`, `PREFIX`, `NOLOOP`, `REDIRECT`.
        mode: Mode,
        /// `OPTIN`.
        optin: bool,
        /// `OPTOUT`.
        optout: bool,
    },
    /// `TRACKING OFF`.
    Off,
    /// `CACHING YES|NO`.
    Caching(bool),
    /// `GETREDIR`.
    GetRedir,
    /// `TRACKINGINFO`.
    Info,
}

impl ClientTracking {
    /// The subcommand `sub` (upper-cased) with its arguments.
    pub(crate) fn parse(sub: &[u8], args: &mut Args) -> Result<ClientTracking, RespError> {
        match sub {
            b"TRACKING" => Self::tracking(args),
            b"CACHING" => {
                let word = args.next_bytes()?;
                args.finish()?;
                match word.to_ascii_uppercase().as_slice() {
                    b"YES" => Ok(ClientTracking::Caching(true)),
                    b"NO" => Ok(ClientTracking::Caching(false)),
                    _ => Err(RespError::syntax()),
                }
            }
            b"GETREDIR" => args.finish().map(|()| ClientTracking::GetRedir),
            _ => args.finish().map(|()| ClientTracking::Info),
        }
    }

    /// `TRACKING ON|OFF [REDIRECT id] [PREFIX p]… [BCAST] [OPTIN] [OPTOUT] [NOLOOP]`.
    fn tracking(args: &mut Args) -> Result<ClientTracking, RespError> {
        let on = match args.next_bytes()?.to_ascii_uppercase().as_slice() {
            b"ON" => true,
            b"OFF" => false,
            _ => return Err(RespError::syntax()),
        };
        let (mut mode, mut optin, mut optout) = (Mode::default(), false, false);
        while let Some(option) = args.next_option() {
            match option.as_slice() {
                b"BCAST" => mode.bcast = true,
                b"OPTIN" => optin = true,
                b"OPTOUT" => optout = true,
                b"NOLOOP" => mode.noloop = true,
                b"REDIRECT" => {
                    mode.redirect = args
                        .next_int::<u64>()
                        .map_err(|_| RespError::err("Invalid client ID"))?;
                }
                b"PREFIX" => mode.prefixes.push(args.next_bytes()?.to_vec()),
                _ => return Err(RespError::syntax()),
            }
        }
        if !on {
            return Ok(ClientTracking::Off);
        }
        if optin && optout {
            return Err(RespError::err("You can't use both OPTIN and OPTOUT"));
        }
        if mode.bcast && (optin || optout) {
            return Err(RespError::err(
                "OPTIN and OPTOUT are not compatible with BCAST",
            ));
        }
        if !mode.bcast && !mode.prefixes.is_empty() {
            return Err(RespError::err(
                "PREFIX option requires BCAST mode to be enabled",
            ));
        }
        Ok(ClientTracking::On {
            mode,
            optin,
            optout,
        })
    }
}

impl Door {
    /// Runs a `CLIENT` tracking subcommand for `conn`.
    pub(crate) fn client_tracking(
        &self,
        conn: &mut ConnState,
        command: ClientTracking,
    ) -> Result<Reply, RespError> {
        let tracking = self.core.ops().tracking();
        match command {
            ClientTracking::On {
                mode,
                optin,
                optout,
            } => self.tracking_on(conn, mode, optin, optout),
            ClientTracking::Off => {
                tracking.stop(conn.id);
                let outbox = conn.tracking.outbox.clone();
                let subscribed = conn.tracking.subscribed;
                conn.tracking = TrackingState {
                    outbox,
                    subscribed,
                    ..TrackingState::default()
                };
                Ok(Reply::OK)
            }
            ClientTracking::Caching(yes) => {
                let state = &mut conn.tracking;
                if !state.on || !(state.optin || state.optout) {
                    return Err(RespError::err("CLIENT CACHING can be called only when the client is in tracking mode with OPTIN or OPTOUT mode enabled"));
                }
                if yes && !state.optin {
                    return Err(RespError::err(
                        "CLIENT CACHING YES is only valid when tracking is enabled in OPTIN mode.",
                    ));
                }
                if !yes && !state.optout {
                    return Err(RespError::err(
                        "CLIENT CACHING NO is only valid when tracking is enabled in OPTOUT mode.",
                    ));
                }
                state.caching = Some(yes);
                state.caching_just_set = true;
                Ok(Reply::OK)
            }
            ClientTracking::GetRedir => Ok(Reply::Int(redirect_of(&conn.tracking))),
            ClientTracking::Info => Ok(tracking_info(&conn.tracking)),
        }
    }

    /// `CLIENT TRACKING ON …`.
    fn tracking_on(
        &self,
        conn: &mut ConnState,
        mut mode: Mode,
        optin: bool,
        optout: bool,
    ) -> Result<Reply, RespError> {
        if conn.proto == Proto::Resp2 && mode.redirect == 0 {
            return Err(RespError::err("CLIENT TRACKING ON on a RESP2 connection needs REDIRECT id (a connection of this instance SUBSCRIBEd to __redis__:invalidate): invalidations are pushed only to RESP3 connections; switch with HELLO 3"));
        }
        let state = &conn.tracking;
        if state.on {
            if state.mode.bcast != mode.bcast {
                return Err(RespError::err("You can't switch BCAST mode on/off before disabling tracking for this client, and then re-enabling it with a different mode."));
            }
            if state.optin != optin || state.optout != optout {
                return Err(RespError::err("You can't switch OPTIN/OPTOUT mode before disabling tracking for this client, and then re-enabling it with a different mode."));
            }
            // As Redis: prefixes given again are added to those the connection has.
            let mut prefixes = state.mode.prefixes.clone();
            for prefix in mode.prefixes {
                if !prefixes.contains(&prefix) {
                    prefixes.push(prefix);
                }
            }
            mode.prefixes = prefixes;
        }
        let tracking = self.core.ops().tracking();
        tracking
            .start(conn.id, &conn.tracking.outbox, mode.clone())
            .map_err(|refused| match refused {
                Refused::NoSuchClient => {
                    RespError::err("The client ID you want redirect to does not exist")
                }
                Refused::TooManyPrefixes(most) => RespError::err(format!(
                    "CLIENT TRACKING takes at most {most} prefixes (resp.tracking_max_prefixes)"
                )),
            })?;
        let state = &mut conn.tracking;
        state.on = true;
        state.mode = mode;
        state.optin = optin;
        state.optout = optout;
        Ok(Reply::OK)
    }

    /// Tracks `key` (read with `class`) for `conn` from before its read, when the connection
    /// tracks it: what [`Door::track_settle`] settles.
    pub(crate) fn track_begin(
        &self,
        conn: &ConnState,
        key: &Key,
        class: Option<&String>,
    ) -> Option<Tracked> {
        if !conn.tracking.wants() {
            return None;
        }
        let seq = self.core.ops().tracking().begin(conn.id, key.as_str())?;
        Some(Tracked {
            seq,
            key: key.clone(),
            class: class.cloned(),
        })
    }

    /// Settles a tracked read with what it answered: kept with its lease, or invalidated now
    /// (before the reply) when it has none.
    pub(crate) fn track_settle(
        &self,
        conn: &ConnState,
        tracked: Tracked,
        answer: &crate::error::Result<ReadAnswer>,
    ) {
        let ops = self.core.ops();
        let lease = match answer {
            Ok(answer) => ops.lease(&tracked.key, answer, now_unix_ms()),
            Err(error) if error.kind() == ErrorKind::NotFound => {
                ops.miss_lease(&tracked.key, tracked.class.as_deref())
            }
            Err(_) => None,
        };
        ops.tracking()
            .settle(conn.id, tracked.key.as_str(), tracked.seq, lease);
    }

    /// Ends `conn`'s tracking and subscription (`RESET`), keeping its outbox.
    pub(crate) fn tracking_reset(&self, conn: &mut ConnState) {
        if conn.tracking.on {
            self.core.ops().tracking().stop(conn.id);
        }
        let outbox = conn.tracking.outbox.clone();
        conn.tracking = TrackingState {
            outbox,
            ..TrackingState::default()
        };
    }
}

/// A read being tracked: its entry's number, its key and the class it asked for.
pub(crate) struct Tracked {
    /// The entry's number ([`crate::tracking::Tracking::begin`]).
    seq: u64,
    /// The key read.
    key: Key,
    /// The class it asked for; `None`: the family's default.
    class: Option<String>,
}

/// `CLIENT GETREDIR`: the target's id, 0 without one, -1 when tracking is off.
fn redirect_of(state: &TrackingState) -> i64 {
    match state.on {
        true => i64::try_from(state.mode.redirect).unwrap_or(i64::MAX),
        false => -1,
    }
}

/// `CLIENT TRACKINGINFO`: `flags`, `redirect`, `prefixes`, as Redis answers it.
fn tracking_info(state: &TrackingState) -> Reply {
    let mut flags = Vec::new();
    if state.on {
        flags.push("on");
        for (set, flag) in [
            (state.mode.bcast, "bcast"),
            (state.optin, "optin"),
            (state.optout, "optout"),
            (state.caching == Some(true), "caching-yes"),
            (state.caching == Some(false), "caching-no"),
            (state.mode.noloop, "noloop"),
        ] {
            if set {
                flags.push(flag);
            }
        }
    } else {
        flags.push("off");
    }
    let prefixes = state
        .mode
        .prefixes
        .iter()
        .map(|prefix| Reply::Bulk(Bytes::copy_from_slice(prefix)))
        .collect();
    Reply::Map(vec![
        (
            Reply::bulk("flags"),
            Reply::Array(flags.into_iter().map(Reply::Simple).collect()),
        ),
        (Reply::bulk("redirect"), Reply::Int(redirect_of(state))),
        (Reply::bulk("prefixes"), Reply::Array(prefixes)),
    ])
}

/// `SUBSCRIBE channel…` / `UNSUBSCRIBE [channel…]`: only [`INVALIDATE_CHANNEL`].
pub(crate) struct Subscribe {
    /// `SUBSCRIBE` (else `UNSUBSCRIBE`).
    on: bool,
}

/// The refusal of any other channel.
const ONLY_INVALIDATE: &str = "pub/sub is not supported by hotsplit: SUBSCRIBE takes only __redis__:invalidate (client-side caching's REDIRECT target)";

/// Checks that every argument left names the invalidation channel.
fn only_invalidate(args: &mut Args) -> Result<(), RespError> {
    for channel in args.rest() {
        if channel.as_ref() != INVALIDATE_CHANNEL.as_bytes() {
            return Err(RespError::err(ONLY_INVALIDATE));
        }
    }
    Ok(())
}

/// `SUBSCRIBE`.
pub(crate) struct SubscribeOn;

/// `UNSUBSCRIBE`.
pub(crate) struct SubscribeOff;

impl Parse for SubscribeOn {
    fn parse(args: &mut Args) -> Result<SubscribeOn, RespError> {
        only_invalidate(args).map(|()| SubscribeOn)
    }
}

impl Parse for SubscribeOff {
    fn parse(args: &mut Args) -> Result<SubscribeOff, RespError> {
        only_invalidate(args).map(|()| SubscribeOff)
    }
}

impl Local for SubscribeOn {
    fn apply(self, _door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Subscribe { on: true }.apply(conn)
    }
}

impl Local for SubscribeOff {
    fn apply(self, _door: &Door, conn: &mut ConnState) -> Result<Reply, RespError> {
        Subscribe { on: false }.apply(conn)
    }
}

impl Subscribe {
    /// Subscribes or unsubscribes `conn`, answering Redis's confirmation.
    fn apply(self, conn: &mut ConnState) -> Result<Reply, RespError> {
        conn.tracking.subscribed = self.on;
        let (word, count) = match self.on {
            true => ("subscribe", 1),
            false => ("unsubscribe", 0),
        };
        Ok(Reply::Push(vec![
            Reply::bulk(word),
            Reply::bulk(INVALIDATE_CHANNEL),
            Reply::Int(count),
        ]))
    }
}

/// The refusal of a command a subscribed RESP2 connection sends, in Redis's words.
pub(crate) fn subscribed_refusal(name: &str) -> RespError {
    RespError::err(format!("Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / PING / QUIT / RESET are allowed in this context"))
}
