//! Concurrency limits through the real server on every backend: places taken up to the
//! limit, given back by each request's refund (`is_negative_hits`), never by another
//! request's, lapsing after the lease; and, on a shared store, given back through another
//! replica.

use std::time::Duration;

use envoy_types::pb::google::protobuf::UInt64Value;
use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;
use serde_json::Value;
use support::{Options, Server, Store, post, request};

const OK: i32 = 1;
const OVER: i32 = 2;

/// Two requests in flight per model; a place lapses two seconds after it was taken.
const RULES: &str = "domain: llm
descriptors:
  - key: model
    value: chat
    descriptors:
      - key: request_id
        rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 2, algorithm: concurrency}
";

fn start(store: &Store) -> Server {
    let mut options = Options::rules(RULES);
    options.env.extend(store.env());
    Server::start_with(options)
}

/// The code for request `id`: `hits` 1 starts it, 0 only checks; `refund` ends it.
async fn send(server: &Server, id: &str, hits: u64, refund: bool) -> i32 {
    let mut call = request("llm", &[&[("model", "chat"), ("request_id", id)]]);
    call.descriptors[0].hits_addend = Some(UInt64Value { value: hits });
    call.descriptors[0].is_negative_hits = refund;
    let mut client = server.client().await;
    let response = client.should_rate_limit(call).await.unwrap().into_inner();
    response.overall_code
}

async fn start_request(server: &Server, id: &str) -> i32 {
    send(server, id, 1, false).await
}

async fn end_request(server: &Server, id: &str) {
    assert_eq!(
        send(server, id, 1, true).await,
        OK,
        "a refund is answered OK"
    );
}

async fn places_are_held_until_each_request_ends_or_its_lease_lapses(store: &Store) {
    let server = start(store);
    assert_eq!(start_request(&server, "a").await, OK);
    assert_eq!(start_request(&server, "b").await, OK);
    assert_eq!(start_request(&server, "c").await, OVER);
    // The refused request ends: it held no place, so none frees.
    end_request(&server, "c").await;
    assert_eq!(start_request(&server, "d").await, OVER);
    assert_eq!(
        send(&server, "e", 0, false).await,
        OK,
        "a check takes no place"
    );
    end_request(&server, "a").await;
    end_request(&server, "a").await;
    assert_eq!(start_request(&server, "d").await, OK);
    assert_eq!(
        start_request(&server, "e").await,
        OVER,
        "a's second refund freed nothing"
    );
    // b and d are never given back: their places lapse two seconds after they were taken.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(start_request(&server, "f").await, OK);
    assert_eq!(start_request(&server, "g").await, OK);
    assert_eq!(start_request(&server, "h").await, OVER);
    // An explanation reads the places in use and takes none.
    for _ in 0..2 {
        let body = r#"{"domain":"llm","descriptors":[{"entries":[{"key":"model","value":"chat"},{"key":"request_id","value":"x"}]}]}"#;
        let (status, text) = post(&server.debug_url("/explain"), body).await;
        assert_eq!(status, 200, "{text}");
        let json: Value = serde_json::from_str(&text).unwrap();
        let explained = &json["descriptors"][0];
        assert_eq!(explained["current"], 2, "{text}");
        assert_eq!(explained["code"], "OVER_LIMIT", "{text}");
        assert_eq!(explained["cacheKey"], "llm_model_chat_request_id__cc2");
    }
    if matches!(store, Store::Memory) {
        return;
    }
    // A second replica on the same store sees the places, and its refund frees one.
    let other = start(store);
    assert_eq!(start_request(&other, "h").await, OVER);
    end_request(&other, "f").await;
    assert_eq!(start_request(&other, "h").await, OK);
    assert_eq!(start_request(&server, "i").await, OVER);
}
on_every_backend!(places_are_held_until_each_request_ends_or_its_lease_lapses);
