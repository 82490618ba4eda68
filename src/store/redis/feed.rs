//! The invalidation feed's connections ([`FeedStore`]): one RESP3 connection to a primary,
//! with `CLIENT TRACKING ON BCAST` and no prefix, on which Redis pushes the name of every key a
//! write changed on that primary (a copy's compare-and-set, a delete, an expiry, a heartbeat),
//! whoever wrote it. It is read by `crate::feed`.
//!
//! The connection has the store's TLS and credentials, no reconnect (the feed reconnects, and
//! flushes, itself) and no command but its handshake and `CLIENT TRACKING`: the ACL user needs
//! `+hello +client|tracking` beside what the store needs. Pushes arrive in fred's broadcast
//! channel; a receiver that falls behind it lost keys, which the feed is told as a
//! [`FeedEvent::Flush`].

use std::time::Duration;

use fred::clients::Client;
use fred::interfaces::{ClientLike, TrackingInterface};
use fred::types::config::ServerConfig;
use fred::types::RespVersion;
use futures_util::future::BoxFuture;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::mpsc;

use super::target::parse_address;
use super::{client_builder_without_reconnects, RedisStore, QUIT_AFTER_TIMEOUT};
use crate::error::{Error, ErrorKind, Result};
use crate::store::{FeedConnection, FeedEvent, FeedStore, NodeLabel};

/// How many pushes fred keeps for a receiver that has not read them yet; past it the feed is
/// told [`FeedEvent::Flush`] (safe: every client-side cache is flushed). fred makes each of a
/// client's ten broadcast channels this long at once, about 96 bytes a slot written when it is
/// made, so this costs each feed connection (one per primary) about 60 MiB of resident memory.
/// 8,192 (7.5 MiB) was tried: under the integration suite's load (every test's instance
/// tracking one shared Redis that every test writes to) the feeds then fell behind and flushed
/// often enough to empty near caches between two reads of a test. A channel for pushes sized
/// apart from the other nine would end the trade; fred 10 does not offer one.
const PUSHES_HELD: usize = 65_536;

/// How many events a feed connection holds for the feed before its reader waits.
const EVENTS_HELD: usize = 4_096;

impl FeedStore for RedisStore {
    fn open_feed<'a>(&'a self, primary: &'a NodeLabel) -> BoxFuture<'a, Result<FeedConnection>> {
        box_in_place!(self.feed_open(primary))
    }
}

/// Quits a feed connection's client when dropped.
struct Quit(Client);

impl Drop for Quit {
    fn drop(&mut self) {
        let client = self.0.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
        });
    }
}

impl RedisStore {
    /// The body of [`FeedStore::open_feed`].
    async fn feed_open(&self, primary: &NodeLabel) -> Result<FeedConnection> {
        let (host, port) = parse_address(primary.as_str())
            .map_err(|why| Error::new(ErrorKind::Config, format!("node {primary:?}: {why}")))?;
        let mut builder = client_builder_without_reconnects(
            ServerConfig::new_centralized(host, port),
            &self.replica_options,
            Vec::new(),
        )?;
        builder
            .with_config(|config| config.version = RespVersion::RESP3)
            .with_performance_config(|perf| perf.broadcast_channel_capacity = PUSHES_HELD);
        let client = builder
            .build()
            .map_err(|err| self.fail(format_args!("the feed of {primary}"), &err))?;
        let within = self.command_timeout.max(Duration::from_secs(1));
        let connected = match tokio::time::timeout(within, client.init()).await {
            Ok(Ok(task)) => task,
            Ok(Err(err)) => return Err(self.fail(format_args!("the feed of {primary}"), &err)),
            Err(_) => {
                let _ = tokio::time::timeout(QUIT_AFTER_TIMEOUT, client.quit()).await;
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("connecting the feed of {primary} timed out"),
                ));
            }
        };
        let guard = Quit(client.clone());
        // Subscribed before tracking starts: no push is sent before a receiver exists.
        let pushes = client.invalidation_rx();
        client
            .start_tracking(Vec::<String>::new(), true, false, false, false)
            .await
            .map_err(|err| {
                self.fail(
                    format_args!("CLIENT TRACKING on the feed of {primary}"),
                    &err,
                )
            })?;
        let (events, receiver) = mpsc::channel(EVENTS_HELD);
        tokio::spawn(forward(pushes, connected, events));
        Ok(FeedConnection {
            events: receiver,
            guard: Box::new(guard),
        })
    }
}

/// Forwards a feed connection's pushes as events until the connection ends or the feed drops
/// its receiver.
async fn forward(
    mut pushes: tokio::sync::broadcast::Receiver<fred::types::client::Invalidation>,
    mut connected: fred::types::ConnectHandle,
    events: mpsc::Sender<FeedEvent>,
) {
    loop {
        let event = tokio::select! {
            push = pushes.recv() => match push {
                Ok(push) if push.keys.is_empty() => FeedEvent::Flush,
                Ok(push) => FeedEvent::Keys(
                    push.keys
                        .iter()
                        .filter_map(|key| key.as_str().map(str::to_owned))
                        .collect(),
                ),
                Err(RecvError::Lagged(_)) => FeedEvent::Flush,
                Err(RecvError::Closed) => FeedEvent::Closed,
            },
            _ = &mut connected => FeedEvent::Closed,
        };
        let closed = event == FeedEvent::Closed;
        if events.send(event).await.is_err() || closed {
            return;
        }
    }
}
