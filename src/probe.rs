//! `hotsplit probe URL`: a health check without shell tools.
//!
//! The container image has no curl and no shell, so its `HEALTHCHECK` runs the binary itself:
//! one HTTP GET, exit status 0 when the URL answers 2xx within the timeout and 1 otherwise (the
//! two statuses a container health check knows), with a one-line message on stdout that
//! `docker inspect` / `podman healthcheck run` show.
//!
//! It is a hyper HTTP/1 client over a TCP stream, or over a tokio-rustls stream for
//! `https://` (the crates the listeners serve TLS with). The server's certificate is verified
//! against `--ca-file`, else the system's roots ([`crate::tls::client_config`]), and so is its
//! name: the URL's host name or IP address must be among the certificate's subject alternative
//! names. There is no way to turn verification off. Redirects are not followed and proxies not
//! used.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use reqwest::Url;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::{timeout_at, Instant};
use tokio_rustls::TlsConnector;

/// The longest part of a failing answer's body the message repeats (the start of a
/// problem+json, which says why the instance is not ready).
const BODY_EXCERPT_CHARS: usize = 200;

/// The most of a failing answer's body the probe reads.
const BODY_READ_LIMIT: usize = 64 * 1024;

/// Arguments of `hotsplit probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL to GET, e.g. http://127.0.0.1:7070/readyz, or https://127.0.0.1:7070/readyz for
    /// a listener with server.tls_cert_file.
    pub url: String,
    /// How long connecting, the TLS handshake and answering together may take.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// PEM file of the CA(s) that sign the listener's certificate (https:// only). The
    /// certificate must name the URL's host (a DNS name or an IP address SAN); verification
    /// cannot be turned off. Default: the system's root certificates.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeReport {
    /// Whether the URL answered 2xx within the timeout.
    pub healthy: bool,
    /// One line for a person: the status and the time taken, or why there was no answer.
    pub message: String,
}

/// Runs `hotsplit probe`: prints the report's line and turns it into the exit status.
pub fn run(args: &ProbeArgs) -> ExitCode {
    // One request needs no worker threads; a current-thread runtime starts fastest.
    let report = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(probe(&args.url, args.timeout, args.ca_file.as_deref())),
        Err(err) => ProbeReport {
            healthy: false,
            message: format!("cannot start the runtime: {err}"),
        },
    };
    if report.healthy {
        println!("healthy: {}", report.message);
        ExitCode::SUCCESS
    } else {
        println!("unhealthy: {}", report.message);
        ExitCode::FAILURE
    }
}

/// Why a probe got no status line.
enum Failure {
    /// The timeout passed first.
    NoAnswer,
    /// Anything else, said in one line.
    Error(String),
}

/// A status line and, for a non-2xx one, the start of its body (empty when it did not arrive
/// in time).
struct Answer {
    /// The status line's code: 2xx is healthy.
    status: StatusCode,
    /// The start of a refusal's body, repeated in the message because it says why.
    body: Bytes,
}

/// GETs `url` once within `timeout`; an `https://` URL's certificate is verified against
/// `ca_file`, else the system's roots.
pub async fn probe(url: &str, timeout: Duration, ca_file: Option<&Path>) -> ProbeReport {
    let unhealthy = |message: String| ProbeReport {
        healthy: false,
        message,
    };
    let parsed = match Url::parse(url) {
        Ok(parsed) => parsed,
        Err(err) => return unhealthy(format!("{url}: not a URL: {err}")),
    };
    let tls = match parsed.scheme() {
        "http" => None,
        "https" => match crate::tls::client_config(ca_file, None) {
            Ok(mut config) => {
                config.alpn_protocols = vec![b"http/1.1".to_vec()];
                Some(TlsConnector::from(Arc::new(config)))
            }
            Err(err) => return unhealthy(format!("{url}: {err}")),
        },
        _ => {
            return unhealthy(format!(
                "{url}: only http:// and https:// URLs can be probed"
            ))
        }
    };
    let started = Instant::now();
    let deadline = started + timeout;
    let answer = match get(&parsed, tls, deadline).await {
        Ok(answer) => answer,
        Err(Failure::NoAnswer) => {
            return unhealthy(format!(
                "{url}: no answer within {}",
                humantime::format_duration(timeout)
            ))
        }
        Err(Failure::Error(message)) => return unhealthy(format!("{url}: {message}")),
    };
    let status = answer.status;
    let elapsed_ms = started.elapsed().as_millis();
    let mut message = format!("{url} answered {status} in {elapsed_ms} ms");
    if status.is_success() {
        return ProbeReport {
            healthy: true,
            message,
        };
    }
    // The body of a refusal (a problem+json from /readyz) says why.
    let excerpt = one_line(&String::from_utf8_lossy(&answer.body), BODY_EXCERPT_CHARS);
    if !excerpt.is_empty() {
        let _ = write!(message, ": {excerpt}");
    }
    unhealthy(message)
}

/// Connects to `url`'s host (with TLS when `tls` is given) and sends the GET, all before
/// `deadline`.
async fn get(url: &Url, tls: Option<TlsConnector>, deadline: Instant) -> Result<Answer, Failure> {
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        return Err(Failure::Error("the URL names no host".to_owned()));
    };
    // `host_str` writes an IPv6 address in brackets, as URLs do.
    let ip = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok();
    let connecting = match ip {
        Some(ip) => timeout_at(deadline, TcpStream::connect(SocketAddr::from((ip, port)))).await,
        None => timeout_at(deadline, TcpStream::connect((host, port))).await,
    };
    let tcp = connecting
        .map_err(|_| Failure::NoAnswer)?
        .map_err(|err| Failure::Error(format!("cannot connect: {err}")))?;
    let request = hyper::Request::get(path_and_query(url))
        .header(hyper::header::HOST, authority(url))
        .header(hyper::header::USER_AGENT, "hotsplit-probe")
        .header(hyper::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|err| Failure::Error(format!("cannot make the request: {err}")))?;
    let Some(connector) = tls else {
        return exchange(tcp, request, deadline).await;
    };
    let name = match ip {
        Some(ip) => ServerName::IpAddress(ip.into()),
        None => ServerName::try_from(host.to_owned())
            .map_err(|err| Failure::Error(format!("not a TLS server name: {err}")))?,
    };
    let stream = timeout_at(deadline, connector.connect(name, tcp))
        .await
        .map_err(|_| Failure::NoAnswer)?
        .map_err(|err| {
            Failure::Error(format!(
                "the TLS handshake failed: {} (the certificate is verified against --ca-file, \
                 else the system's roots, and must name the URL's host)",
                chain(&err)
            ))
        })?;
    exchange(stream, request, deadline).await
}

/// Sends `request` over `stream` as HTTP/1.1 and reads the status line before `deadline`, and
/// a non-2xx answer's body if it arrives before `deadline` too.
async fn exchange<S>(
    stream: S,
    request: hyper::Request<Empty<Bytes>>,
    deadline: Instant,
) -> Result<Answer, Failure>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|err| Failure::Error(chain(&err)))?;
    let talk = async move {
        let response = timeout_at(deadline, sender.send_request(request))
            .await
            .map_err(|_| Failure::NoAnswer)?
            .map_err(|err| Failure::Error(chain(&err)))?;
        let status = response.status();
        let body = if status.is_success() {
            Bytes::new()
        } else {
            // A body that does not arrive in time is left out rather than turning a clear
            // status into a timeout.
            let body = Limited::new(response.into_body(), BODY_READ_LIMIT).collect();
            match timeout_at(deadline, body).await {
                Ok(Ok(collected)) => collected.to_bytes(),
                _ => Bytes::new(),
            }
        };
        Ok(Answer { status, body })
    };
    tokio::pin!(talk);
    tokio::pin!(connection);
    // The connection is driven beside the exchange; it cannot outlive this function. A
    // connection that fails first fails the probe; one that ends cleanly has delivered the
    // answer, which `talk` then reads.
    tokio::select! {
        answer = &mut talk => answer,
        ended = &mut connection => match ended {
            Err(err) => Err(Failure::Error(chain(&err))),
            Ok(()) => talk.await,
        },
    }
}

/// The request target: the URL's path and query.
fn path_and_query(url: &Url) -> String {
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    }
}

/// The `Host` header: the URL's host, and its port when the URL names one.
fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// An error and its sources on one line (hyper and rustls put the useful part in a source).
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// `text` with runs of whitespace (newlines included) made one space, cut to `max` characters.
fn one_line(text: &str, max: usize) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match joined.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &joined[..at]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_joins_lines_and_cuts_long_text() {
        assert_eq!(
            one_line("{\n  \"code\": \"x\"\n}\n", 100),
            "{ \"code\": \"x\" }"
        );
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("", 3), "");
    }

    #[tokio::test]
    async fn refuses_urls_it_cannot_probe_without_sending_anything() {
        let report = probe("ftp://127.0.0.1:1/readyz", Duration::from_secs(1), None).await;
        assert!(!report.healthy);
        assert!(
            report.message.contains("only http:// and https://"),
            "{}",
            report.message
        );
        let report = probe("127.0.0.1:7070/readyz", Duration::from_secs(1), None).await;
        assert!(!report.healthy);
        assert!(report.message.contains("not a URL"), "{}", report.message);
    }
}
