//! The request id on every log line of its request, without a tracing span per request.
//!
//! A `request` span per request (created, entered and left on every poll, closed) cost about
//! 8 % of the HTTP read throughput even under a static filter: the registry takes a slot for
//! it, the formatting layer renders its fields into a string, and every poll enters and leaves
//! it. Instead, the latency layer puts the request's id in a thread-local while the request's
//! future is polled ([`Scope`]: two copies of a small array, no atomics, no allocation), and
//! [`RequestIdFormat`] adds it to each log line written meanwhile, in the shape the span had:
//! `request{request_id="…"}: ` after the level in text, `"span":{"request_id":"…","name":"request"}`
//! in JSON. A line written outside a request is formatted as before, untouched.

use std::cell::Cell;
use std::fmt::{self, Write as _};

use axum::http::HeaderValue;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use super::request_id::MAX_LEN;

/// A request id, copied into a fixed array so that setting the current one costs no allocation
/// and no reference count.
#[derive(Clone, Copy)]
pub(crate) struct Id {
    /// How many bytes of `bytes` are the id; 0 for none.
    len: u8,
    /// The id's bytes (visible ASCII, as `request_id` makes sure).
    bytes: [u8; MAX_LEN],
}

impl Id {
    /// No request.
    const NONE: Id = Id {
        len: 0,
        bytes: [0; MAX_LEN],
    };

    /// The id of a request (at most [`MAX_LEN`] bytes; `request_id` never makes a longer one).
    pub(crate) fn new(value: &HeaderValue) -> Id {
        let source = value.as_bytes();
        let len = source.len().min(MAX_LEN);
        let mut id = Id::NONE;
        id.bytes[..len].copy_from_slice(&source[..len]);
        // MAX_LEN is 128, so `len` fits a u8.
        id.len = u8::try_from(len).unwrap_or(0);
        id
    }

    /// The id as text, or `None` outside a request.
    fn as_str(&self) -> Option<&str> {
        let bytes = self.bytes.get(..usize::from(self.len))?;
        std::str::from_utf8(bytes).ok().filter(|id| !id.is_empty())
    }
}

thread_local! {
    /// The id of the request whose future this thread is polling.
    static CURRENT: Cell<Id> = const { Cell::new(Id::NONE) };
}

/// The current request's id on this thread, from [`Scope::enter`] until the scope drops (which
/// restores the one before, so scopes nest).
pub(crate) struct Scope {
    /// The id this scope replaced.
    previous: Id,
}

impl Scope {
    /// Makes `id` the current request's id on this thread.
    pub(crate) fn enter(id: &Id) -> Scope {
        Scope {
            previous: CURRENT.with(|current| current.replace(*id)),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|current| current.set(self.previous));
    }
}

/// How a line is shaped, so the id goes where the span's fields went.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `… LEVEL request{request_id="…"}: target: fields`.
    Text,
    /// `{…,"span":{"request_id":"…","name":"request"}}`.
    Json,
}

/// Wraps a log line format (`tracing_subscriber::fmt::format()`, or its `.json()`): a line
/// written while a request is polled carries that request's id.
#[derive(Debug, Clone)]
pub struct RequestIdFormat<F> {
    /// The format that writes the line.
    inner: F,
    /// Where the id goes in it.
    shape: Shape,
}

impl<F> RequestIdFormat<F> {
    /// Around the text format (`tracing_subscriber::fmt::format()`; configure its colours on
    /// the format itself, with `with_ansi`, since the line is first written into a buffer).
    pub fn text(inner: F) -> RequestIdFormat<F> {
        RequestIdFormat {
            inner,
            shape: Shape::Text,
        }
    }

    /// Around the JSON format (`tracing_subscriber::fmt::format().json()`, without the current
    /// span, which this writes).
    pub fn json(inner: F) -> RequestIdFormat<F> {
        RequestIdFormat {
            inner,
            shape: Shape::Json,
        }
    }
}

impl<S, N, F> FormatEvent<S, N> for RequestIdFormat<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let current = CURRENT.with(Cell::get);
        let Some(id) = current.as_str() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        match self.shape {
            Shape::Text => insert_text(&mut line, *event.metadata().level(), id),
            Shape::Json => insert_json(&mut line, id),
        }
        writer.write_str(&line)
    }
}

/// Inserts `request{request_id="ID"}: ` after the level of a text line (after its colour reset,
/// if any), where the default format writes the current span; at the start if the level is not
/// found.
fn insert_text(line: &mut String, level: Level, id: &str) {
    const RESET: &str = "\x1b[0m";
    let name = level.as_str();
    let at = line.find(name).map_or(0, |start| {
        let mut end = start + name.len();
        if line[end..].starts_with(RESET) {
            end += RESET.len();
        }
        if line[end..].starts_with(' ') {
            end += 1;
        }
        end
    });
    line.insert_str(at, &format!("request{{request_id={id:?}}}: "));
}

/// Inserts `,"span":{"request_id":"ID","name":"request"}` before the closing brace of a JSON
/// line; appends it as a text suffix when the line does not end in one.
fn insert_json(line: &mut String, id: &str) {
    let mut span = String::from(",\"span\":{\"request_id\":\"");
    for char in id.chars() {
        if matches!(char, '"' | '\\') {
            span.push('\\');
        }
        span.push(char);
    }
    span.push_str("\",\"name\":\"request\"}");
    match line.trim_end().strip_suffix('}').map(str::len) {
        Some(at) => line.insert_str(at, &span),
        None => {
            let _ = write!(line, " request_id={id:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(text: &'static str) -> Id {
        Id::new(&HeaderValue::from_static(text))
    }

    #[test]
    fn a_scope_sets_the_id_and_restores_the_one_before() {
        let current = || CURRENT.with(Cell::get).as_str().map(str::to_owned);
        assert_eq!(current(), None);
        {
            let _outer = Scope::enter(&id("outer"));
            assert_eq!(current().as_deref(), Some("outer"));
            {
                let _inner = Scope::enter(&id("inner"));
                assert_eq!(current().as_deref(), Some("inner"));
            }
            assert_eq!(current().as_deref(), Some("outer"));
        }
        assert_eq!(current(), None);
        let longest = "a".repeat(MAX_LEN);
        let value = HeaderValue::from_str(&longest).unwrap();
        assert_eq!(Id::new(&value).as_str(), Some(longest.as_str()));
    }

    #[test]
    fn the_id_goes_where_the_request_span_went() {
        let mut plain =
            String::from("2026-11-30T18:00:00.000000Z  INFO hotsplit::read: read served key=k\n");
        insert_text(&mut plain, Level::INFO, "r-1");
        assert_eq!(
            plain,
            "2026-11-30T18:00:00.000000Z  INFO request{request_id=\"r-1\"}: hotsplit::read: read served key=k\n"
        );
        let mut coloured = String::from(
            "2026-11-30T18:00:00.000000Z \x1b[33m WARN\x1b[0m \x1b[2mhotsplit\x1b[0m: x\n",
        );
        insert_text(&mut coloured, Level::WARN, "r-2");
        assert!(
            coloured.contains("WARN\x1b[0m request{request_id=\"r-2\"}: \x1b[2mhotsplit"),
            "{coloured:?}"
        );

        let mut json = String::from("{\"timestamp\":\"t\",\"level\":\"INFO\",\"fields\":{\"message\":\"m\"},\"target\":\"hotsplit\"}\n");
        insert_json(&mut json, "a\"b\\c");
        let parsed: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed["span"]["request_id"], "a\"b\\c");
        assert_eq!(parsed["span"]["name"], "request");
        assert_eq!(parsed["fields"]["message"], "m");
    }
}
