//! The Rust client (`hotsplit::client`) against a service on real Redis.

use hotsplit::client::Client;
use hotsplit::ErrorKind;
use hotsplit_devcluster as devcluster;

use crate::harness::{self, config_with_family, Service};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_carries_its_floor_and_reads_its_own_writes() {
    let server = harness::shared_standalone();
    let service = Service::start(config_with_family(Some(&server.url()), "cl:", 8)).await;
    let client = Client::new(&service.base, "carol").unwrap();
    assert!(client.read("cl:1").await.unwrap().is_none());

    let published = client
        .publish("cl:1", Some(10), b"ten".to_vec())
        .await
        .unwrap();
    assert_eq!((published.version, published.applied), (10, 8));
    assert_eq!(client.floor("cl:1").map(|floor| floor.get()), Some(10));
    let read = client.read("cl:1").await.unwrap().expect("value");
    assert_eq!(
        (read.value.as_ref(), read.version.get()),
        (b"ten".as_slice(), 10)
    );
    assert_eq!(read.copy, hotsplit::affinity::copy_index("carol", 8));
    // The client echoes the session token: the service verified the one the read sent.
    assert!(client.session_token().is_some());
    let metrics = harness::metrics_text(&reqwest::Client::new(), &service.base).await;
    assert!(
        metrics.lines().any(|line| line
            .starts_with("hotsplit_session_tokens_total{outcome=\"valid\"} ")
            && !line.ends_with(" 0")),
        "{metrics}"
    );

    // Roll carol's copy back directly in Redis: the floor keeps her from seeing the older value.
    let copy_key = format!("cl:1#{}", read.copy);
    devcluster::cli(
        server.node.port(),
        &["HSET", &copy_key, "ver", "9", "val", "nine"],
    )
    .unwrap();
    for _ in 0..10 {
        let read = client.read("cl:1").await.unwrap().expect("value");
        assert_eq!(read.version.get(), 10, "the floor was not honoured");
        assert_eq!(read.value.as_ref(), b"ten");
    }
    // The reads that fell back repaired carol's copy in the background, so a fresh client
    // without a floor soon reads version 10 from it too.
    let fresh = Client::new(&service.base, "carol").unwrap();
    harness::poll(
        "read repair brings carol's copy to version 10",
        std::time::Duration::from_secs(5),
        || async {
            fresh
                .read("cl:1")
                .await
                .ok()
                .flatten()
                .is_some_and(|read| read.version.get() == 10)
        },
    )
    .await;

    // Errors map back to kinds; invalidation reads as None.
    let err = client
        .publish("cl:1", Some(5), b"old".to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidVersion, "{err}");
    client.invalidate("cl:1", Some(11)).await.unwrap();
    assert!(client.read("cl:1").await.unwrap().is_none());
    let err = client
        .publish("bad{key", Some(1), b"x".to_vec())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidKey);
    service.stop().await;
}

#[test]
fn bad_client_settings_are_refused() {
    assert_eq!(
        Client::new("http://127.0.0.1:1", "")
            .err()
            .map(|err| err.kind()),
        Some(ErrorKind::MissingClient)
    );
    assert_eq!(
        Client::new("127.0.0.1:1", "x").err().map(|err| err.kind()),
        Some(ErrorKind::InvalidParameter)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstones_404_names_its_version_and_the_client_holds_it_as_a_floor() {
    let server = harness::shared_standalone();
    let service = Service::start(config_with_family(Some(&server.url()), "cl:", 8)).await;
    let http = reqwest::Client::new();
    let put = http
        .put(format!("{}/v1/keys/cl:tomb?version=3", service.base))
        .body("three")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), reqwest::StatusCode::OK);
    let delete = http
        .delete(format!("{}/v1/keys/cl:tomb?version=5", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(delete.status(), reqwest::StatusCode::OK);

    let read = http
        .get(format!("{}/v1/keys/cl:tomb?client=dora", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), reqwest::StatusCode::NOT_FOUND);
    assert_eq!(
        read.headers()
            .get(hotsplit::wire::header::VERSION)
            .and_then(|value| value.to_str().ok()),
        Some("5"),
        "a tombstone's 404 names the tombstone's version"
    );
    assert!(read.headers().get("etag").is_none());
    let body: serde_json::Value = read.json().await.unwrap();
    assert_eq!(body["code"], "not_found", "{body}");

    let never = http
        .get(format!("{}/v1/keys/cl:never?client=dora", service.base))
        .send()
        .await
        .unwrap();
    assert_eq!(never.status(), reqwest::StatusCode::NOT_FOUND);
    assert!(
        never
            .headers()
            .get(hotsplit::wire::header::VERSION)
            .is_none(),
        "a key with no record names no version"
    );

    // A client that only reads holds the tombstone's version as its floor; a key it never saw
    // leaves it none.
    let reader = Client::new(&service.base, "erin").unwrap();
    assert!(reader.read("cl:tomb").await.unwrap().is_none());
    assert_eq!(reader.floor("cl:tomb").map(|floor| floor.get()), Some(5));
    assert!(reader.read("cl:never").await.unwrap().is_none());
    assert_eq!(reader.floor("cl:never"), None);
    service.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_of_one_client_each_leave_their_floor_in_its_session() {
    let server = harness::shared_standalone();
    let service = Service::start(config_with_family(Some(&server.url()), "clm:", 8)).await;
    // Reads go through another instance, which saw none of the writes.
    let other = Service::start(config_with_family(Some(&server.url()), "clm:", 8)).await;
    let client = std::sync::Arc::new(Client::new(&service.base, "carol").unwrap());
    let keys: Vec<String> = (0..16)
        .map(|n| format!("clm:{:08x}-{n}", rand::random::<u32>()))
        .collect();
    // Sixteen writes at once, each sending the tokens held when it started.
    let writes = keys.iter().map(|key| {
        let client = client.clone();
        let key = key.clone();
        tokio::spawn(async move { client.publish(&key, Some(10), b"ten".to_vec()).await })
    });
    for write in futures_util::future::join_all(writes).await {
        assert_eq!(write.unwrap().unwrap().version, 10);
    }
    let token = client.session_token().expect("a token");
    // Every key's copy that zed reads goes back to 9 in Redis: only a floor from the token
    // keeps zed's read at 10 (zed has no pin of its own, and the other instance answered and
    // accepted nothing of these keys).
    let zed_copy = hotsplit::affinity::copy_index("zed", 8);
    for key in &keys {
        devcluster::cli(
            server.node.port(),
            &[
                "HSET",
                &format!("{key}#{zed_copy}"),
                "ver",
                "9",
                "val",
                "nine",
            ],
        )
        .unwrap();
    }
    let http = reqwest::Client::new();
    let read = |key: &str, token: Option<&str>| {
        let mut request = http
            .get(format!("{}/v1/keys/{key}", other.base))
            .header("hotsplit-client", "zed");
        if let Some(token) = token {
            request = request.header("hotsplit-session", token);
        }
        async move { request.send().await.unwrap().text().await.unwrap() }
    };
    assert_eq!(read(&keys[0], None).await, "nine", "the rollback shows");
    for key in &keys {
        assert_eq!(
            read(key, Some(&token)).await,
            "ten",
            "{key}: its floor was lost"
        );
    }
    service.stop().await;
    other.stop().await;
}
