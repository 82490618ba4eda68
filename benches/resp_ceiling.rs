//! The ceiling for a Redis-protocol read on this machine: the least a tokio server can do to
//! answer `GET`, beside which the RESP door's `redis-benchmark` figures are read (as
//! `proxy_baseline` is the HTTP door's ceiling).
//!
//! Not a criterion bench: a script starts it with
//! `cargo bench --bench resp_ceiling -- --listen ADDR [--value-bytes N]` (port 0 picks a free
//! port), reads the `listening on ADDR` line it prints, and drives it with
//! `redis-benchmark -p PORT -c 64 -P 16 -t get`. Each connection reads into one buffer, takes
//! every whole command out of it (multibulk or inline, no hotsplit code), answers every `GET`
//! with the same `N` bytes held in memory (64 by default, as the measurements), and
//! writes the batch's replies in one write. `PING` answers `+PONG`, `CONFIG GET` an empty array
//! (what `redis-benchmark` asks first), anything else an error. Nothing is bounded or logged: it
//! is a ceiling, not a server. Run without `--listen` (as `cargo bench` and
//! `cargo test --benches` do) it exits at once.

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn argument(name: &str) -> Option<String> {
    let mut args = std::env::args();
    args.position(|arg| arg == name)?;
    args.next()
}

/// One command's name, as the reply needs it.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Get,
    Ping,
    Config,
    Other,
}

impl Command {
    fn of(name: &[u8]) -> Command {
        if name.eq_ignore_ascii_case(b"GET") {
            Command::Get
        } else if name.eq_ignore_ascii_case(b"PING") {
            Command::Ping
        } else if name.eq_ignore_ascii_case(b"CONFIG") {
            Command::Config
        } else {
            Command::Other
        }
    }
}

/// The index just past the `\r\n` line starting at `at`, and the line, if it has arrived.
fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let end = at + buf.get(at..)?.windows(2).position(|pair| pair == b"\r\n")?;
    Some((&buf[at..end], end + 2))
}

fn number(text: &[u8]) -> Option<usize> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// The first whole command in `buf`: its name and the bytes it took; `Ok(None)` when it has not
/// all arrived; `Err` on input that is not RESP.
fn next_command(buf: &[u8]) -> Result<Option<(Command, usize)>, ()> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        let Some(end) = buf.iter().position(|byte| *byte == b'\n') else {
            return Ok(None);
        };
        let name = buf[..end]
            .split(|byte| byte.is_ascii_whitespace())
            .find(|word| !word.is_empty())
            .unwrap_or_default();
        return Ok(Some((Command::of(name), end + 1)));
    }
    let Some((count, mut at)) = line(buf, 1) else {
        return Ok(None);
    };
    let count = number(count).ok_or(())?;
    let mut name = Command::Other;
    for index in 0..count {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(());
        }
        let Some((len, start)) = line(buf, at + 1) else {
            return Ok(None);
        };
        let len = number(len).ok_or(())?;
        if buf.len() < start + len + 2 {
            return Ok(None);
        }
        if index == 0 {
            name = Command::of(&buf[start..start + len]);
        }
        at = start + len + 2;
    }
    Ok(Some((name, at)))
}

async fn serve(mut stream: TcpStream, reply: &'static [u8]) {
    let _ = stream.set_nodelay(true);
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut output = Vec::with_capacity(16 * 1024);
    loop {
        match stream.read_buf(&mut input).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        loop {
            match next_command(&input) {
                Ok(Some((command, used))) => {
                    input.advance(used);
                    output.extend_from_slice(match command {
                        Command::Get => reply,
                        Command::Ping => b"+PONG\r\n",
                        Command::Config => b"*0\r\n",
                        Command::Other => b"-ERR unknown command\r\n",
                    });
                }
                Ok(None) => break,
                Err(()) => {
                    let _ = stream.write_all(b"-ERR Protocol error\r\n").await;
                    return;
                }
            }
        }
        if !output.is_empty() {
            if stream.write_all(&output).await.is_err() {
                return;
            }
            output.clear();
        }
        input.reserve(16 * 1024);
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(listen) = argument("--listen") else {
        return Ok(());
    };
    let value_bytes: usize = match argument("--value-bytes") {
        Some(text) => text.parse()?,
        None => 64,
    };
    let mut reply = format!("${value_bytes}\r\n").into_bytes();
    reply.extend(std::iter::repeat_n(b'v', value_bytes));
    reply.extend_from_slice(b"\r\n");
    let reply: &'static [u8] = reply.leak();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(&listen).await?;
        println!("listening on {}", listener.local_addr()?);
        loop {
            let (stream, _) = listener.accept().await?;
            tokio::spawn(serve(stream, reply));
        }
    })
}
