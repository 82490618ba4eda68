//! A real headless Chromium for the status page test, driven over the Chrome DevTools Protocol:
//! JSON commands and events on the browser's WebSocket, one page target attached in flat mode.
//!
//! [`Browser::launch`] starts Debian's `chromium` (or `HOTSPLIT_CHROMIUM`) with a throwaway
//! profile and `--remote-debugging-port=0`, reads the WebSocket address it prints, and opens
//! one page. Before any page script runs, the test's own script records every
//! `securitypolicyviolation` event, every `alert`/`confirm`/`prompt` call and every
//! `/v1/fleet` answer body (by its `at_ms`), so the test can compare what was rendered with
//! what the page was given. Console errors, uncaught exceptions, log entries of level `error`
//! and JavaScript dialogs are collected from the protocol's events. The process is killed by
//! PID when the `Browser` drops.
//!
//! Without chromium the test is skipped with a message, except in CI (`CI` or
//! `HOTSPLIT_REQUIRE_CHROMIUM` set), where it must run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Runs in every document before its own scripts (`Page.addScriptToEvaluateOnNewDocument`,
/// which the page's CSP does not govern): records CSP violations, dialogs, and `/v1/fleet`
/// bodies by `at_ms`.
const WATCH: &str = r#"
window.__violations = [];
window.__dialogs = [];
window.__fleet = {};
document.addEventListener("securitypolicyviolation", (e) => {
  window.__violations.push(e.violatedDirective + " " + e.blockedURI);
});
for (const name of ["alert", "confirm", "prompt"]) {
  window[name] = (message) => { window.__dialogs.push(name + ": " + message); };
}
const pageFetch = window.fetch.bind(window);
window.fetch = async (...args) => {
  const answer = await pageFetch(...args);
  if (String(args[0]).includes("v1/fleet")) {
    const text = await answer.clone().text();
    try { window.__fleet[String(JSON.parse(text).at_ms)] = text; } catch (e) {}
  }
  return answer;
};
"#;

/// How long one protocol command may take: a limit against a hang, not a speed check.
const COMMAND_LIMIT: Duration = Duration::from_secs(30);

/// A headless Chromium with one page open.
pub struct Browser {
    /// The browser process, killed by PID on drop.
    child: Child,
    /// The throwaway profile directory.
    _profile: tempfile::TempDir,
    /// The browser's DevTools WebSocket.
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The next command id.
    next_id: u64,
    /// The page's flat session id.
    session: String,
    /// Every event received so far, in order.
    pub events: Vec<Value>,
}

/// The chromium binary, or `None` when there is none and the test may be skipped.
fn chromium() -> Option<String> {
    let program = std::env::var("HOTSPLIT_CHROMIUM").unwrap_or_else(|_| "chromium".to_owned());
    let found = Command::new(&program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if found {
        return Some(program);
    }
    let required =
        std::env::var_os("CI").is_some() || std::env::var_os("HOTSPLIT_REQUIRE_CHROMIUM").is_some();
    assert!(
        !required,
        "{program} is not installed, and CI requires the status page test (.ci/run installs Debian's chromium)"
    );
    println!("skipped: {program} is not installed (apt-get install chromium); CI runs this test");
    None
}

impl Browser {
    /// Starts chromium and opens a blank page with the watcher installed; `None` (after a
    /// message) when chromium is absent outside CI.
    pub async fn launch() -> Option<Browser> {
        let program = chromium()?;
        let profile = tempfile::Builder::new()
            .prefix("hotsplit-chromium-")
            .tempdir()
            .expect("a profile dir");
        let mut child = Command::new(&program)
            .args([
                "--headless=new",
                // The tests run as root in CI containers, where the sandbox cannot start.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-port=0",
                "--remote-debugging-address=127.0.0.1",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("start {program}: {err}"));
        let stderr = child.stderr.take().expect("chromium's stderr");
        // The address comes on stderr; the rest of stderr (dbus complaints on a machine without
        // a session bus) is drained by the same thread so chromium never blocks on it.
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(at) = line.find("ws://") {
                        let _ = address_tx.send(line[at..].trim().to_owned());
                        sent = true;
                    }
                }
            }
        });
        let address = address_rx
            .recv_timeout(COMMAND_LIMIT)
            .expect("chromium prints its DevTools address");
        let (socket, _) = tokio_tungstenite::connect_async(address.as_str())
            .await
            .expect("connect to chromium's DevTools socket");
        let mut browser = Browser {
            child,
            _profile: profile,
            socket,
            next_id: 0,
            session: String::new(),
            events: Vec::new(),
        };
        let target = browser
            .command(None, "Target.createTarget", json!({"url": "about:blank"}))
            .await;
        let target_id = target["targetId"].as_str().expect("targetId").to_owned();
        let attached = browser
            .command(
                None,
                "Target.attachToTarget",
                json!({"targetId": target_id, "flatten": true}),
            )
            .await;
        browser.session = attached["sessionId"]
            .as_str()
            .expect("sessionId")
            .to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({})).await;
        }
        browser
            .call(
                "Page.addScriptToEvaluateOnNewDocument",
                json!({"source": WATCH}),
            )
            .await;
        Some(browser)
    }

    /// Sends `method` to the page and returns its result.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.command(Some(&session), method, params).await
    }

    /// Sends one command (to the browser, or to `session`) and waits for its answer, keeping
    /// every event that arrives meanwhile; panics on a protocol error.
    async fn command(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .unwrap_or_else(|err| panic!("send {method}: {err}"));
        let answer = tokio::time::timeout(COMMAND_LIMIT, async {
            loop {
                let frame = self
                    .socket
                    .next()
                    .await
                    .unwrap_or_else(|| panic!("chromium closed its socket during {method}"))
                    .unwrap_or_else(|err| panic!("read during {method}: {err}"));
                let Message::Text(text) = frame else {
                    continue;
                };
                let value: Value = serde_json::from_str(text.as_str()).expect("a JSON message");
                if value["id"] == json!(id) {
                    return value;
                }
                if value.get("method").is_some() {
                    self.events.push(value);
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{method} did not answer within {COMMAND_LIMIT:?}"));
        assert!(
            answer.get("error").is_none(),
            "{method} failed: {}",
            answer["error"]
        );
        answer["result"].clone()
    }

    /// Opens `url` in the page.
    pub async fn navigate(&mut self, url: &str) {
        let result = self.call("Page.navigate", json!({"url": url})).await;
        assert!(
            result.get("errorText").is_none(),
            "navigate to {url}: {result}"
        );
    }

    /// Evaluates `expression` in the page and returns its value (promises awaited).
    pub async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Console errors, uncaught exceptions, error log entries (a CSP refusal is one) and
    /// JavaScript dialogs seen so far, as text.
    pub fn errors(&self) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|event| {
                let params = &event["params"];
                match event["method"].as_str()? {
                    "Runtime.consoleAPICalled"
                        if matches!(params["type"].as_str(), Some("error" | "assert")) =>
                    {
                        Some(format!("console.{}: {}", params["type"], params["args"]))
                    }
                    "Runtime.exceptionThrown" => {
                        Some(format!("exception: {}", params["exceptionDetails"]))
                    }
                    "Log.entryAdded" if params["entry"]["level"] == "error" => Some(format!(
                        "log ({}): {} {}",
                        params["entry"]["source"], params["entry"]["text"], params["entry"]["url"]
                    )),
                    "Page.javascriptDialogOpening" => {
                        Some(format!("dialog: {}", params["message"]))
                    }
                    _ => None,
                }
            })
            .collect()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // By PID: this browser only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
