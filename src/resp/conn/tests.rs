//! The connection loop over an in-memory pipe, on a real door over the embedded store: the
//! in-flight bound, the output bound, the write timeout, the input bound, shutdown, the idle
//! timeout, and a protocol error after good commands.
//!
//! Every command sent is one no command table knows (`NOSUCHCMD`), so each reply is one `-ERR`
//! line whatever the commands answer: these tests judge the loop only.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;
use crate::resp::slots::Connections;

/// How long a test waits for the loop.
const WITHIN: Duration = Duration::from_secs(10);

fn door(max_in_flight: usize) -> Door {
    let server = crate::door::ServerConfig {
        max_in_flight,
        ..crate::door::ServerConfig::default()
    };
    crate::resp::fixture::door("", &server)
}

fn settings() -> Settings {
    Settings {
        limits: Limits {
            max_bulk: 1024,
            max_args: 16,
            max_inline: 1024,
        },
        max_pending: 64 * 1024,
        max_receiving: None,
        receive_timeout: Duration::from_secs(5),
        auth_timeout: Duration::from_secs(5),
        max_output: 64 * 1024,
        write_timeout: Duration::from_secs(5),
        idle_timeout: None,
        handshake_timeout: Duration::from_secs(1),
    }
}

/// A connection of `door` with `settings` serving one end of a pipe of `pipe` bytes; the other
/// end, the task, the connection's signal and the table it is in.
fn serve(
    door: &Door,
    settings: Settings,
    pipe: usize,
) -> (
    DuplexStream,
    tokio::task::JoinHandle<()>,
    Arc<Signal>,
    Arc<Connections>,
) {
    let metrics = RespMetrics::register(door.core().metrics());
    let connections = Connections::new(4, 4, metrics.clone());
    let signal = Arc::new(Signal::default());
    let slot = connections.admit(signal.clone(), true).expect("room");
    let connection = Connection {
        id: 7,
        peer: None,
        door: door.clone(),
        settings: Arc::new(settings),
        overload: door.core().in_flight().clone(),
        metrics,
        signal: signal.clone(),
        slot,
    };
    let (client, server) = tokio::io::duplex(pipe);
    let task = tokio::spawn(connection.serve(server));
    (client, task, signal, connections)
}

/// Reads `count` reply lines.
async fn lines(client: &mut DuplexStream, count: usize) -> Vec<String> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 1024];
    while bytes.windows(2).filter(|pair| *pair == b"\r\n").count() < count {
        let read = tokio::time::timeout(WITHIN, client.read(&mut chunk))
            .await
            .expect("a reply in time")
            .expect("read");
        assert!(
            read > 0,
            "closed after {:?}",
            String::from_utf8_lossy(&bytes)
        );
        bytes.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8_lossy(&bytes)
        .split_terminator("\r\n")
        .map(str::to_owned)
        .collect()
}

/// Asserts the connection's task ends in time.
async fn ends(task: tokio::task::JoinHandle<()>) {
    tokio::time::timeout(WITHIN, task)
        .await
        .expect("the connection ends in time")
        .expect("the connection task");
}

#[tokio::test]
async fn a_command_over_the_in_flight_bound_is_refused_and_the_next_one_runs() {
    let door = door(1);
    let (mut client, task, _signal, _table) = serve(&door, settings(), 4096);
    let held = door
        .core()
        .in_flight()
        .enter()
        .expect("the one slot")
        .expect("a bound");
    client.write_all(b"NOSUCHCMD\r\n").await.unwrap();
    assert_eq!(lines(&mut client, 1).await, [format!("-{OVERLOADED}")]);
    drop(held);
    client
        .write_all(b"NOSUCHCMD\r\nNOSUCHCMD\r\n")
        .await
        .unwrap();
    for line in lines(&mut client, 2).await {
        assert!(line.starts_with("-ERR "), "{line}");
    }
    // The refused and the run commands gave their slots back.
    assert!(door.core().in_flight().enter().is_ok());
    drop(client);
    ends(task).await;
}

#[tokio::test]
async fn a_batch_larger_than_the_output_bound_is_answered_whole_in_order_through_a_small_pipe() {
    let door = door(0);
    let settings = Settings {
        max_output: 16,
        ..settings()
    };
    let (mut client, task, _signal, _table) = serve(&door, settings, 64);
    let batch = b"NOSUCHCMD\r\n".repeat(500);
    let (mut reader, mut writer) = tokio::io::split(client);
    let send = tokio::spawn(async move {
        writer.write_all(&batch).await.unwrap();
        writer
    });
    let mut replies = 0;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 256];
    while replies < 500 {
        let read = tokio::time::timeout(WITHIN, reader.read(&mut chunk))
            .await
            .expect("replies in time")
            .expect("read");
        assert!(read > 0);
        bytes.extend_from_slice(&chunk[..read]);
        replies = bytes.windows(2).filter(|pair| *pair == b"\r\n").count();
    }
    assert_eq!(replies, 500);
    let writer = send.await.unwrap();
    client = reader.unsplit(writer);
    drop(client);
    ends(task).await;
}

#[tokio::test]
async fn a_client_that_does_not_read_its_replies_is_closed_after_the_write_timeout() {
    let door = door(0);
    let settings = Settings {
        write_timeout: Duration::from_millis(100),
        ..settings()
    };
    let (client, task, _signal, _table) = serve(&door, settings, 64);
    let (_reader, mut writer) = tokio::io::split(client);
    // More replies than the pipe holds; nothing reads them.
    let _ = tokio::time::timeout(
        Duration::from_millis(500),
        writer.write_all(&b"NOSUCHCMD\r\n".repeat(100)),
    )
    .await;
    ends(task).await;
}

#[tokio::test]
async fn a_command_over_the_pending_bound_is_a_protocol_error() {
    let door = door(0);
    let settings = Settings {
        max_pending: 100,
        ..settings()
    };
    let (mut client, task, _signal, _table) = serve(&door, settings, 4096);
    client
        .write_all(b"*2\r\n$3\r\nSET\r\n$500\r\n")
        .await
        .unwrap();
    client.write_all(&[b'v'; 200]).await.unwrap();
    assert_eq!(
        lines(&mut client, 1).await,
        ["-ERR Protocol error: too big request"]
    );
    client.shutdown().await.unwrap();
    ends(task).await;
}

#[tokio::test]
async fn a_protocol_error_is_answered_after_the_replies_before_it_then_the_connection_closes() {
    let door = door(0);
    let (mut client, task, _signal, _table) = serve(&door, settings(), 4096);
    client
        .write_all(b"NOSUCHCMD\r\n*1\r\n$x\r\nNOSUCHCMD\r\n")
        .await
        .unwrap();
    let replies = lines(&mut client, 2).await;
    assert!(replies[0].starts_with("-ERR "), "{replies:?}");
    assert_eq!(replies[1], "-ERR Protocol error: invalid bulk length");
    client.shutdown().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(WITHIN, client.read_to_end(&mut rest))
        .await
        .expect("closed in time")
        .unwrap();
    assert!(rest.is_empty(), "nothing after the error: {rest:?}");
    ends(task).await;
}

#[tokio::test]
async fn shutdown_closes_an_idle_connection_and_a_token_change_alone_does_not() {
    let door = door(0);
    let (mut client, task, signal, table) = serve(&door, settings(), 4096);
    client.write_all(b"NOSUCHCMD\r\n").await.unwrap();
    lines(&mut client, 1).await;
    // Every token is still admitted (none was given): the connection stays.
    table.tell_all(|signal| &signal.recheck);
    client.write_all(b"NOSUCHCMD\r\n").await.unwrap();
    lines(&mut client, 1).await;
    table.tell_all(|signal| &signal.shut_down);
    assert!(signal.is_shut_down());
    ends(task).await;
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn on_shutdown_the_batch_in_flight_is_answered_whole_before_the_close() {
    let door = door(0);
    // 80 commands arrive in one read (880 bytes); their replies do not fit the 1024-byte pipe,
    // so the loop is still writing its batch when it is told to shut down.
    let (client, task, _signal, table) = serve(&door, settings(), 1024);
    let (mut reader, mut writer) = tokio::io::split(client);
    writer
        .write_all(&b"NOSUCHCMD\r\n".repeat(80))
        .await
        .unwrap();
    let mut first = [0u8; 1];
    reader.read_exact(&mut first).await.unwrap();
    table.tell_all(|signal| &signal.shut_down);
    let mut rest = first.to_vec();
    tokio::time::timeout(WITHIN, reader.read_to_end(&mut rest))
        .await
        .expect("the batch and the close in time")
        .unwrap();
    let replies = rest.windows(2).filter(|pair| *pair == b"\r\n").count();
    assert_eq!(replies, 80, "every reply of the batch, then the close");
    assert!(rest.ends_with(b"\r\n"));
    ends(task).await;
}

#[tokio::test]
async fn the_idle_timeout_closes_a_connection_that_sends_nothing() {
    let door = door(0);
    let settings = Settings {
        idle_timeout: Some(Duration::from_millis(50)),
        ..settings()
    };
    let (_client, task, _signal, _table) = serve(&door, settings, 4096);
    ends(task).await;
}
