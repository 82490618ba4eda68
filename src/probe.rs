//! `hotsplit probe URL`: a health check without shell tools.
//!
//! The container image has no curl and no shell, so its `HEALTHCHECK` runs the binary itself:
//! one HTTP GET, exit status 0 when the URL answers 2xx within the timeout and 1 otherwise (the
//! two statuses a container health check knows), with a one-line message on stdout that
//! `docker inspect` / `podman healthcheck run` show. Plain `http://` only: the crate's `reqwest`
//! is built without TLS, and the probe is meant for the instance's own loopback listener.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The longest part of a failing answer's body the message repeats (the start of a
/// problem+json, which says why the instance is not ready).
const BODY_EXCERPT_CHARS: usize = 200;

/// Arguments of `hotsplit probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// The URL to GET, e.g. http://127.0.0.1:7070/readyz (http:// only).
    pub url: String,
    /// How long connecting and answering together may take.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
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
        Ok(runtime) => runtime.block_on(probe(&args.url, args.timeout)),
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

/// GETs `url` once, redirects not followed and proxies not used, within `timeout`.
pub async fn probe(url: &str, timeout: Duration) -> ProbeReport {
    let unhealthy = |message: String| ProbeReport {
        healthy: false,
        message,
    };
    let parsed = match reqwest::Url::parse(url) {
        Ok(parsed) => parsed,
        Err(err) => return unhealthy(format!("{url}: not a URL: {err}")),
    };
    if parsed.scheme() != "http" {
        return unhealthy(format!(
            "{url}: only http:// URLs can be probed (this build has no TLS client)"
        ));
    }
    let client = match reqwest::Client::builder()
        .timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(client) => client,
        Err(err) => return unhealthy(format!("cannot build the HTTP client: {}", chain(&err))),
    };
    let started = Instant::now();
    let answer = match client.get(parsed).send().await {
        Ok(answer) => answer,
        Err(err) if err.is_timeout() => {
            return unhealthy(format!(
                "{url}: no answer within {}",
                humantime::format_duration(timeout)
            ))
        }
        Err(err) => return unhealthy(format!("{url}: {}", chain(&err))),
    };
    let status = answer.status();
    let elapsed_ms = started.elapsed().as_millis();
    if status.is_success() {
        return ProbeReport {
            healthy: true,
            message: format!("{url} answered {status} in {elapsed_ms} ms"),
        };
    }
    // The body of a refusal (a problem+json from /readyz) says why; a body that does not arrive
    // in time is left out rather than turning a clear status into a timeout.
    let body = answer.text().await.unwrap_or_default();
    let mut message = format!("{url} answered {status} in {elapsed_ms} ms");
    let excerpt = one_line(&body, BODY_EXCERPT_CHARS);
    if !excerpt.is_empty() {
        let _ = write!(message, ": {excerpt}");
    }
    unhealthy(message)
}

/// An error and its sources on one line (`reqwest` puts the useful part, such as "Connection
/// refused", in a source).
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
        let report = probe("https://127.0.0.1:1/readyz", Duration::from_secs(1)).await;
        assert!(!report.healthy);
        assert!(
            report.message.contains("only http://"),
            "{}",
            report.message
        );
        let report = probe("127.0.0.1:7070/readyz", Duration::from_secs(1)).await;
        assert!(!report.healthy);
        assert!(report.message.contains("not a URL"), "{}", report.message);
    }
}
