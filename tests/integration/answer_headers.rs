//! The read answer's head, byte for byte, on real Redis: a near-cache hit, a fill (a store read
//! of a near-cache class), a read of a class that never uses the cache, a 304, a 404 with its
//! problem body, and a session token sent back unchanged. The read handler renders these headers
//! from pre-rendered parts; these tests pin what goes on the wire, so a faster rendering that
//! changes one byte (a header's order, case, spacing or value) fails here.
//!
//! Each request goes over its own TCP connection with `Connection: close`, and the raw head is
//! compared whole, after masking what varies by run: the `date`, the request id, the
//! `age_ms=N` of a near-cache route, the Redis port, and the session token (whose bytes depend
//! on the deployment's random key; the token is checked by what it does instead: sent back, it
//! comes back byte-identical when the answer adds nothing to it).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::harness::{self, config_from_toml, Edit, Service};

/// One answer, read off the socket.
struct RawAnswer {
    /// The status line and headers, as sent (CRLF line ends), without the blank line.
    head: String,
    /// The body.
    body: Vec<u8>,
}

impl RawAnswer {
    /// The value of the first header line named `name` (case-insensitive).
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|line| {
            let (found, value) = line.split_once(':')?;
            found.eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// Sends `GET target` with `headers` until the near cache answers it (its route names
/// `source=near-cache`), reading `target` plainly between tries so the entry is filled again:
/// a flush of the invalidation feed (a silence on a loaded machine) may empty the near cache at
/// any moment, and what this file pins is the head of each kind of answer, not when the cache
/// holds an entry. At most 50 tries.
async fn from_near_cache(base: &str, target: &str, headers: &[(&str, &str)]) -> RawAnswer {
    let mut last = String::new();
    for _ in 0..50 {
        let answer = raw_get(base, target, headers).await;
        let from_memory = answer
            .header("hotsplit-route")
            .is_some_and(|route| route.contains("source=near-cache"));
        if from_memory {
            return answer;
        }
        last = answer.head;
        raw_get(base, target, &[]).await;
    }
    panic!("GET {target} was never answered from the near cache; the last head:\n{last}");
}

/// Sends `GET target` with `headers` on a new connection to `base` and reads the whole answer.
async fn raw_get(base: &str, target: &str, headers: &[(&str, &str)]) -> RawAnswer {
    let address = base.strip_prefix("http://").expect("an http base");
    let mut stream = TcpStream::connect(address).await.expect("connect");
    let mut request = format!("GET {target} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .expect("send the request");
    let mut bytes = Vec::new();
    stream
        .read_to_end(&mut bytes)
        .await
        .expect("read the answer");
    let end = bytes
        .windows(4)
        .position(|window| window == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of head in {:?}", String::from_utf8_lossy(&bytes)));
    RawAnswer {
        head: String::from_utf8(bytes[..end].to_vec()).expect("an ASCII head"),
        body: bytes[end + 4..].to_vec(),
    }
}

/// `head` with what varies by run replaced: the date, the request id, a near-cache route's
/// `age_ms`, the session token, and `port` (the Redis server's).
fn masked(head: &str, port: u16) -> String {
    head.split("\r\n")
        .map(|line| {
            let Some((name, value)) = line.split_once(": ") else {
                return line.to_owned();
            };
            let value = match name.to_ascii_lowercase().as_str() {
                "date" => "<date>".to_owned(),
                "x-request-id" => "<request id>".to_owned(),
                "hotsplit-session" => format!("<token of {} chars>", value.len()),
                "hotsplit-route" => match value.split_once(";age_ms=") {
                    Some((before, age)) if age.bytes().all(|b| b.is_ascii_digit()) => {
                        format!("{before};age_ms=<ms>")
                    }
                    _ => value.to_owned(),
                },
                _ => value.replace(&format!(":{port};"), ":<port>;"),
            };
            format!("{name}: {value}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The config of these tests: family `ah:` of 4 copies read with a near-cache class whose
/// entries stay young for the whole test.
fn config(url: &str) -> hotsplit::config::Config {
    config_from_toml(&format!(
        "[store]\nredis = \"{url}\"\ncommand_timeout = \"{timeout}\"\n[[family]]\nprefix = \"ah:\"\ncopies = 4\nttl = \"10m\"\ndefault_class = \"patient\"\n[classes.patient]\nroute = \"replica\"\nreason = \"x\"\nstaleness_budget = \"60s\"\nnear_cache_max_age = \"60s\"\n",
        timeout = harness::command_timeout_toml()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reads_head_is_pinned_byte_for_byte_for_a_fill_a_hit_a_304_and_a_404() {
    let server = harness::shared_standalone();
    let port: u16 = server
        .url()
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("the server's port");
    // The writer is another instance, so the reader's first read of the copy is a fill (a
    // store read), not an entry the publish left.
    let writer = Service::start(config(&server.url())).await;
    let reader = Service::start(config(&server.url())).await;
    let key = format!("ah:pinned-{}", std::process::id());
    let http = reqwest::Client::new();
    harness::publish_expecting(
        &http,
        &writer.base,
        Edit::new(&key, 7, "seven"),
        reqwest::StatusCode::OK,
    )
    .await;
    let copy = hotsplit::affinity::copy_index("alice", 4);
    let target = format!("/v1/keys/{key}?client=alice");

    let fill = raw_get(&reader.base, &target, &[]).await;
    assert_eq!(fill.body, b"seven");
    assert_eq!(
        masked(&fill.head, port),
        fill_head(copy),
        "a fill: {}",
        fill.head
    );

    let hit = from_near_cache(&reader.base, &target, &[]).await;
    assert_eq!(hit.body, b"seven");
    assert_eq!(
        masked(&hit.head, port),
        hit_head(copy),
        "a hit: {}",
        hit.head
    );

    // The token sent back: the answer adds nothing it does not hold, so it comes back as sent.
    let token = hit.header("hotsplit-session").expect("a token").to_owned();
    let again = from_near_cache(&reader.base, &target, &[("hotsplit-session", &token)]).await;
    assert_eq!(again.header("hotsplit-session"), Some(token.as_str()));
    assert_eq!(masked(&again.head, port), masked(&hit.head, port));

    let not_modified = from_near_cache(&reader.base, &target, &[("if-none-match", "\"7\"")]).await;
    assert!(not_modified.body.is_empty());
    assert_eq!(
        masked(&not_modified.head, port),
        not_modified_head(copy),
        "a 304: {}",
        not_modified.head
    );

    // A class that never uses the near cache: a store read every time.
    let primary = raw_get(&reader.base, &format!("{target}&class=primary"), &[]).await;
    assert_eq!(
        masked(&primary.head, port),
        primary_class_head(copy),
        "a primary-class read: {}",
        primary.head
    );

    let missing = raw_get(
        &reader.base,
        &format!("/v1/keys/ah:missing-{}?client=alice", std::process::id()),
        &[],
    )
    .await;
    let content_length = missing.body.len();
    assert_eq!(
        masked(&missing.head, port),
        format!(
            "HTTP/1.1 404 Not Found\n\
             content-type: application/problem+json\n\
             x-request-id: <request id>\n\
             content-length: {content_length}\n\
             connection: close\n\
             date: <date>"
        ),
        "a 404: {}",
        missing.head
    );
    reader.stop().await;
    writer.stop().await;
}

/// The head of a fill (a store read) of copy `copy`.
fn fill_head(copy: u32) -> String {
    format!(
        "HTTP/1.1 200 OK\n\
         content-type: application/octet-stream\n\
         etag: \"7\"\n\
         hotsplit-version: 7\n\
         hotsplit-copy: {copy}\n\
         hotsplit-served-by: 127.0.0.1:<port>;role=primary\n\
         hotsplit-route: class=patient;reason=no-replica\n\
         vary: Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session\n\
         hotsplit-session: <token of 46 chars>\n\
         cache-control: private\n\
         x-request-id: <request id>\n\
         content-length: 5\n\
         connection: close\n\
         date: <date>"
    )
}

/// The head of a near-cache hit of copy `copy`.
fn hit_head(copy: u32) -> String {
    format!(
        "HTTP/1.1 200 OK\n\
         content-type: application/octet-stream\n\
         etag: \"7\"\n\
         hotsplit-version: 7\n\
         hotsplit-copy: {copy}\n\
         hotsplit-served-by: 127.0.0.1:<port>;role=primary\n\
         hotsplit-route: class=patient;reason=no-replica;source=near-cache;age_ms=<ms>\n\
         age: 0\n\
         vary: Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session\n\
         hotsplit-session: <token of 46 chars>\n\
         cache-control: private\n\
         x-request-id: <request id>\n\
         content-length: 5\n\
         connection: close\n\
         date: <date>"
    )
}

/// The head of a 304 for copy `copy`, answered from the near cache.
fn not_modified_head(copy: u32) -> String {
    format!(
        "HTTP/1.1 304 Not Modified\n\
         etag: \"7\"\n\
         hotsplit-version: 7\n\
         hotsplit-copy: {copy}\n\
         hotsplit-served-by: 127.0.0.1:<port>;role=primary\n\
         hotsplit-route: class=patient;reason=no-replica;source=near-cache;age_ms=<ms>\n\
         age: 0\n\
         vary: Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session\n\
         hotsplit-session: <token of 46 chars>\n\
         cache-control: private\n\
         x-request-id: <request id>\n\
         connection: close\n\
         date: <date>"
    )
}

/// The head of a `primary`-class read of copy `copy` (a store read every time).
fn primary_class_head(copy: u32) -> String {
    format!(
        "HTTP/1.1 200 OK\n\
         content-type: application/octet-stream\n\
         etag: \"7\"\n\
         hotsplit-version: 7\n\
         hotsplit-copy: {copy}\n\
         hotsplit-served-by: 127.0.0.1:<port>;role=primary\n\
         hotsplit-route: class=primary;reason=class\n\
         vary: Hotsplit-Client, Hotsplit-Min-Version, Hotsplit-Read-Class, Hotsplit-Session\n\
         hotsplit-session: <token of 46 chars>\n\
         cache-control: private\n\
         x-request-id: <request id>\n\
         content-length: 5\n\
         connection: close\n\
         date: <date>"
    )
}
