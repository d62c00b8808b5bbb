//! The service against a real Kafka-compatible broker (tansu), each message read back by
//! an independent client and compared byte for byte.

use ratelimit_tests::intake as support;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::{batch, health, operation, post, read_topic};

mod common;

use common::{broker_with_topic, intake, limited_intake};

#[tokio::test(flavor = "multi_thread")]
async fn accepted_batches_reach_the_topic_byte_for_byte() {
    let tansu = broker_with_topic("ops", 3).await;
    let service = intake(&tansu, "ops", &[]);
    let answer = health(&service).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.body["status"], "up");
    assert_eq!(answer.body["kafka"]["partitions"], 3);

    let bodies = [
        format!(
            "[{},{},{}]",
            operation("buy", "10.10", 100),
            operation("sell", "0.000001", 1),
            operation("buy", "123456789012345678.99", 18_446_744_073_709_551_615)
        ),
        // Spacing, field order and escapes are kept: the value is the body as received.
        "[ {\"quantity\": 5,\n \"unit-cost\": 1.50000, \"operation\": \"s\\u0065ll\"} ]".to_owned(),
        batch("sell", 1),
        // The bounds of unit-cost: 38 digits, 38 nines, 1e-38, exponents of magnitude 38.
        format!(
            "[{},{},{},{}]",
            operation("buy", "12345678901234567890.123456789012345678", 1),
            operation("sell", "99999999999999999999999999999999999999", 2),
            operation("buy", "9.9999999999999999999999999999999999999E+37", 3),
            operation("sell", "1e-38", 4)
        ),
    ];
    let mut accepted = HashMap::new();
    for (i, body) in bodies.iter().enumerate() {
        let client = format!("client-{i}");
        let answer = post(&service, body, &[("x-client-id", &client)]).await;
        assert_eq!(answer.status, 202, "{}", answer.body);
        assert_eq!(
            answer.body["message"],
            "Operations received and processing initiated."
        );
        let id = answer.body["id"].as_str().unwrap().to_owned();
        accepted.insert(id, (body.clone(), client, answer.body.clone()));
    }
    assert_eq!(
        accepted
            .values()
            .map(|(_, _, a)| a["count"].as_u64().unwrap())
            .sum::<u64>(),
        9
    );

    let records = read_topic(&tansu.bootstrap(), "ops");
    assert_eq!(records.len(), bodies.len());
    for record in &records {
        let id = record.header("request-id").unwrap().to_owned();
        let (body, client, answer) = accepted
            .get(&id)
            .expect("every message is an accepted request");
        assert_eq!(
            record.key,
            format!("{client} {id}").as_bytes(),
            "the message key is the client id and the batch id"
        );
        assert_eq!(record.value, body.as_bytes(), "value changed on the way");
        assert_eq!(answer["partition"], record.partition);
        assert_eq!(answer["offset"], record.offset);
        assert_eq!(record.header("client-id"), Some(client.as_str()));
        assert_eq!(record.header("content-type"), Some("application/json"));
        let received = record.header("received-at").unwrap();
        let received = humantime::parse_rfc3339(received).expect("received-at is RFC 3339");
        let age = SystemTime::now().duration_since(received).unwrap();
        assert!(
            age < Duration::from_secs(120),
            "received-at is now-ish: {age:?}"
        );
    }
}

type Case = (&'static str, u16, &'static [(&'static str, &'static str)]);

#[tokio::test(flavor = "multi_thread")]
async fn rejected_requests_produce_nothing() {
    let tansu = broker_with_topic("rejects", 1).await;
    let service = intake(
        &tansu,
        "rejects",
        &[("MAX_BODY_BYTES", "2000"), ("MAX_OPERATIONS", "3")],
    );
    // (body, status, the (index, field) of each problem listed)
    let cases: [Case; 10] = [
        ("not json", 400, &[("", "")]),
        (
            r#"{"operation":"buy","unit-cost":1,"quantity":1}"#,
            400,
            &[("", "")],
        ),
        (
            r#"[{"operation":"buy","quantity":1}]"#,
            400,
            &[("0", "unit-cost")],
        ),
        (
            r#"[{"operation":"buy","unit_cost":1,"quantity":1}]"#,
            400,
            &[("0", "unit_cost"), ("0", "unit-cost")],
        ),
        (
            r#"[{"operation":"buy","unit-cost":"1.00","quantity":1}]"#,
            400,
            &[("0", "unit-cost")],
        ),
        (
            r#"[{"operation":"buy","unit-cost":1,"quantity":-1}, {"operation":"buy","unit-cost":-1,"quantity":2.5}]"#,
            400,
            &[("0", "quantity"), ("1", "unit-cost"), ("1", "quantity")],
        ),
        (
            r#"[{"operation":"hold","unit-cost":1,"quantity":1}]"#,
            400,
            &[("0", "operation")],
        ),
        (
            r#"[{"operation":"buy","unit-cost":1,"quantity":18446744073709551616}]"#,
            400,
            &[("0", "quantity")],
        ),
        ("", 413, &[]),
        ("", 413, &[]),
    ];
    let too_many = batch("buy", 4);
    let too_big = format!("[{}]", vec![" "; 2001].join(""));
    for (i, (body, status, problems)) in cases.iter().enumerate() {
        let body = match i {
            8 => too_many.as_str(),
            9 => too_big.as_str(),
            _ => body,
        };
        let answer = post(&service, body, &[]).await;
        assert_eq!(answer.status, *status, "{body}: {}", answer.body);
        assert!(answer.body["message"].is_string());
        if *status == 400 {
            let errors = answer.body["errors"].as_array().unwrap();
            let found: Vec<(String, String)> = errors
                .iter()
                .map(|e| {
                    (
                        e["index"]
                            .as_u64()
                            .map(|i| i.to_string())
                            .unwrap_or_default(),
                        e["field"].as_str().unwrap_or_default().to_owned(),
                    )
                })
                .collect();
            let expected: Vec<(String, String)> = problems
                .iter()
                .map(|(i, f)| ((*i).to_owned(), (*f).to_owned()))
                .collect();
            assert_eq!(found, expected, "{body}");
            assert!(errors.iter().all(|e| e["message"].is_string()));
        }
    }
    let client = reqwest::Client::new();
    let wrong_type = client
        .post(service.url("/operations"))
        .header("content-type", "text/plain")
        .body(batch("buy", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong_type.status(), 415);
    let wrong_method = client.get(service.url("/operations")).send().await.unwrap();
    assert_eq!(wrong_method.status(), 405);
    // Header and body problems come in one list.
    let both = post(
        &service,
        r#"[{"operation":"buy","unit-cost":1}]"#,
        &[("x-client-id", "has space"), ("idempotency-key", "")],
    )
    .await;
    assert_eq!(both.status, 400);
    let fields: Vec<&str> = both.body["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["field"].as_str().unwrap())
        .collect();
    assert_eq!(fields, ["X-Client-Id", "Idempotency-Key", "quantity"]);
    // unit-cost is bounded: at most 38 digits, an exponent within -38..=38, and a value
    // of 0 or from 1e-38 to 38 nines (MAX_OPERATIONS is 3 here: two batches).
    let nines = "9".repeat(39);
    for costs in [["1e400", &nines, "1e-39"], ["1e38", "5E+38", "0.5e-38"]] {
        let bounds = format!(
            "[{},{},{}]",
            operation("buy", costs[0], 1),
            operation("sell", costs[1], 1),
            operation("buy", costs[2], 1)
        );
        let unbounded = post(&service, &bounds, &[]).await;
        assert_eq!(unbounded.status, 400, "{}", unbounded.body);
        let errors = unbounded.body["errors"].as_array().unwrap();
        assert_eq!(errors.len(), 3, "{}", unbounded.body);
        for (i, error) in errors.iter().enumerate() {
            assert_eq!(error["index"], i);
            assert_eq!(error["field"], "unit-cost");
            assert!(error["message"].as_str().unwrap().contains("38"), "{error}");
        }
    }

    // One good batch, so the reader has something to find: only it is on the topic.
    let good = post(&service, &batch("buy", 1), &[]).await;
    assert_eq!(good.status, 202);
    let records = read_topic(&tansu.bootstrap(), "rejects");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, batch("buy", 1).as_bytes());
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_count_operations_and_roll_over_with_the_window() {
    let (tansu, _rules, service) = limited_intake("limited", "second", &[]).await;

    // Start at the beginning of a second so the whole exchange fits in one window.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    tokio::time::sleep(Duration::from_nanos(
        1_000_000_000 - u64::from(now.subsec_nanos()),
    ))
    .await;
    let first = post(&service, &batch("buy", 6), &[("x-client-id", "a")]).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.header("ratelimit-limit"), Some("10"));
    assert_eq!(first.header("ratelimit-remaining"), Some("4"));
    let over = post(&service, &batch("buy", 6), &[("x-client-id", "a")]).await;
    assert_eq!(over.status, 429, "{}", over.body);
    assert_eq!(over.body["error"], "Rate limit exceeded.");
    assert_eq!(over.header("ratelimit-limit"), Some("10"));
    assert_eq!(over.header("ratelimit-remaining"), Some("0"));
    assert_eq!(over.header("ratelimit-reset"), Some("1"));
    assert_eq!(over.header("retry-after"), Some("1"));
    let sells = post(&service, &batch("sell", 3), &[("x-client-id", "b")]).await;
    assert_eq!(sells.status, 429, "sells are capped apart: {}", sells.body);
    assert_eq!(sells.header("ratelimit-limit"), Some("2"));
    assert_eq!(
        sells.header("retry-after"),
        None,
        "3 sells never fit a limit of 2"
    );
    assert!(sells.body["message"].as_str().unwrap().contains("split it"));
    let other = post(&service, &batch("buy", 10), &[("x-client-id", "c")]).await;
    assert_eq!(other.status, 202, "another client has its own counter");

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let next = post(&service, &batch("buy", 6), &[("x-client-id", "a")]).await;
    assert_eq!(
        next.status, 202,
        "the next window starts afresh: {}",
        next.body
    );

    let records = read_topic(&tansu.bootstrap(), "limited");
    let ids: Vec<String> = records
        .iter()
        .map(|r| r.header("request-id").unwrap().to_owned())
        .collect();
    let mut expected: Vec<String> = [&first, &other, &next]
        .iter()
        .map(|a| a.body["id"].as_str().unwrap().to_owned())
        .collect();
    expected.sort();
    let mut ids = ids;
    ids.sort();
    assert_eq!(ids, expected, "refused batches were not produced");
}

#[tokio::test(flavor = "multi_thread")]
async fn idempotent_retries_produce_once() {
    let tansu = broker_with_topic("idem", 1).await;
    let service = intake(&tansu, "idem", &[]);
    let body = batch("sell", 2);
    let first = post(&service, &body, &[("idempotency-key", "order-7")]).await;
    assert_eq!(first.status, 202, "{}", first.body);
    assert_eq!(first.body["id"], "order-7");
    let retry = post(&service, &body, &[("idempotency-key", "order-7")]).await;
    assert_eq!(retry.status, 202);
    assert_eq!(retry.body, first.body, "the retry gets the first answer");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    let changed = post(
        &service,
        &batch("sell", 3),
        &[("idempotency-key", "order-7")],
    )
    .await;
    assert_eq!(changed.status, 409, "{}", changed.body);
    assert!(
        changed.body["message"]
            .as_str()
            .unwrap()
            .contains("different body")
    );
    let bad_key = post(&service, &body, &[("idempotency-key", "has space")]).await;
    assert_eq!(bad_key.status, 400);

    let records = read_topic(&tansu.bootstrap(), "idem");
    assert_eq!(records.len(), 1, "produced once");
    // Keys belong to their client (here the peer's address): the message key says whose.
    assert_eq!(records[0].key, b"127.0.0.1 order-7");
    assert_eq!(records[0].header("request-id"), Some("order-7"));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_loses_no_answered_batch() {
    let tansu = broker_with_topic("drain", 2).await;
    let mut service = intake(&tansu, "drain", &[]);
    let url = service.url("/operations");
    let client = reqwest::Client::new();
    let senders: Vec<_> = (0..40)
        .map(|i| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i * 5)).await;
                let response = client
                    .post(url)
                    .header("content-type", "application/json")
                    .body(batch("buy", 3))
                    .send()
                    .await
                    .ok()?;
                let ok = response.status() == 202;
                let body: serde_json::Value = response.json().await.ok()?;
                ok.then(|| body["id"].as_str().unwrap().to_owned())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(60)).await;
    service.terminate();
    let mut answered = Vec::new();
    for sender in senders {
        if let Some(id) = sender.await.unwrap() {
            answered.push(id);
        }
    }
    let status = service
        .wait_exit(Duration::from_secs(30))
        .expect("exits after draining");
    assert!(status.success(), "exit status {status:?}");
    assert!(
        !answered.is_empty(),
        "some requests were answered before the signal"
    );
    // A clean shutdown is quiet: no error from the service or from librdkafka.
    let log = service.log();
    assert!(
        !log.contains("level=error") && !log.contains("ERROR"),
        "{log}"
    );

    let records = read_topic(&tansu.bootstrap(), "drain");
    let keys: std::collections::HashSet<String> = records
        .iter()
        .map(|r| r.header("request-id").unwrap().to_owned())
        .collect();
    for id in &answered {
        assert!(
            keys.contains(id),
            "batch {id} was answered 202 but is not on the topic"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn schemathesis_finds_no_failures() {
    let tansu = broker_with_topic("fuzz", 1).await;
    let (key, entry) = support::keygen("fuzzer", None);
    let keys = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys.path(), entry).unwrap();
    let service = intake(
        &tansu,
        "fuzz",
        &[
            ("AUTH", "api-keys"),
            ("API_KEYS_FILE", keys.path().to_str().unwrap()),
        ],
    );
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.yaml");
    // Schemathesis and Hypothesis keep caches in the working directory: not in the tree.
    let scratch = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(
        std::env::var("SCHEMATHESIS_BIN").expect("SCHEMATHESIS_BIN is set by scripts/test.sh"),
    )
    .current_dir(scratch.path())
    .arg("run")
    .arg(&spec)
    .args([
        "--url",
        &service.url(""),
        "--checks",
        "all",
        "--max-examples",
        "60",
        // The declared security scheme's credentials; the `ignored_auth` check also
        // sends requests without them and with made-up ones, expecting 401.
        "--header",
        &format!("Authorization: Bearer {key}"),
    ])
    .args(["--generation-deterministic", "--no-color"])
    .output()
    .await
    .expect("schemathesis runs");
    let report: String = format!(
        "{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
    .lines()
    .map(|line| format!("{}\n", line.chars().take(400).collect::<String>()))
    .collect();
    assert!(
        output.status.success(),
        "schemathesis found failures:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_topic_is_reported_not_created() {
    let tansu = broker_with_topic("present", 1).await;
    let service = intake(&tansu, "absent", &[]);
    for _ in 0..3 {
        let answer = health(&service).await;
        assert_eq!(answer.status, 503, "{}", answer.body);
        assert!(
            answer.body["kafka"]["reason"]
                .as_str()
                .unwrap()
                .contains("absent")
        );
        let refused = post(&service, &batch("buy", 1), &[]).await;
        assert_eq!(refused.status, 503, "{}", refused.body);
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
}
