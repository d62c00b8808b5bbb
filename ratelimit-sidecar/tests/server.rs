//! The `ratelimit` binary end to end: gRPC, `/json`, health, debug, reload, signals.

use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar as support;

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use support::{Options, Server, Store, ask, codes, eventually, get_text, limit_of, request};
use tonic::Code;

const OK: i32 = 1;
const OVER: i32 = 2;

/// Starts a server on [`RULES`] (plus `options`), on the memory backend or on `redis`.
fn start(store: &Store, mut options: Options) -> Server {
    if options.files.is_empty() {
        options.files.push(("rules.yaml", RULES.to_owned()));
    }
    options.env.extend(store.env());
    Server::start_with(options)
}

const RULES: &str = include_str!("fixtures/server.yaml");

on_every_backend!(grpc_decides_counts_and_reports_errors_like_envoy_ratelimit);

async fn grpc_decides_counts_and_reports_errors_like_envoy_ratelimit(store: &Store) {
    let server = start(store, Options::default());
    let mut client = server.client().await;
    let three = request(
        "e2e",
        &[&[("user", "a")], &[("free", "x")], &[("nothing", "y")]],
    );
    let first = client
        .should_rate_limit(three.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.overall_code, OK);
    assert_eq!(codes(&first), [(OK, 1), (OK, u32::MAX), (OK, 0)]);
    let limit = first.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (2, 3), "2 per HOUR");
    assert!(first.statuses[0].duration_until_reset.is_some());
    assert!(
        first.response_headers_to_add.is_empty(),
        "headers are off by default"
    );
    client.should_rate_limit(three.clone()).await.unwrap();
    let third = client.should_rate_limit(three).await.unwrap().into_inner();
    assert_eq!(third.overall_code, OVER);

    let unknown = ask(&mut client, "nope", &[&[("a", "b")]]).await;
    assert_eq!(codes(&unknown), [(OK, 0)]);

    let empty = client
        .should_rate_limit(request("", &[&[("a", "b")]]))
        .await
        .unwrap_err();
    assert_eq!(
        (empty.code(), empty.message()),
        (Code::Unknown, "rate limit domain must not be empty")
    );
    let none = client
        .should_rate_limit(request("e2e", &[]))
        .await
        .unwrap_err();
    assert_eq!(
        none.message(),
        "rate limit descriptor list must not be empty"
    );

    let mut bad_override = request("e2e", &[&[("user", "z")]]);
    bad_override.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 5,
        unit: 0,
    });
    let error = client.should_rate_limit(bad_override).await.unwrap_err();
    assert_eq!(error.code(), Code::InvalidArgument);
    assert!(
        error.message().contains("limit override has unit 0"),
        "{}",
        error.message()
    );
    // The server survived it.
    let again = ask(&mut client, "e2e", &[&[("user", "b")]]).await;
    assert_eq!(codes(&again), [(OK, 1)]);
    let stats = server.stats().await;
    assert_eq!(
        stats["ratelimit.service.rate_limit.nope.domain_not_found"],
        1
    );
    assert_eq!(
        stats["ratelimit.service.call.should_rate_limit.service_error"],
        3
    );
    assert_eq!(stats["ratelimit_server.ShouldRateLimit.total_requests"], 8);
    assert_eq!(stats["ratelimit.service.rate_limit.e2e.user.total_hits"], 4);
}

on_every_backend!(rule_shadow_mode_response_headers_and_dynamic_metadata);

async fn rule_shadow_mode_response_headers_and_dynamic_metadata(store: &Store) {
    let server = start(
        store,
        Options {
            env: vec![
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "true".into()),
                ("LIMIT_REMAINING_HEADER", "X-Left".into()),
                ("RESPONSE_DYNAMIC_METADATA", "true".into()),
            ],
            ..Options::rules(RULES)
        },
    );
    let mut client = server.client().await;
    let r = ask(&mut client, "e2e", &[&[("user", "h")]]).await;
    let metadata = r.dynamic_metadata.as_ref().expect("dynamic metadata is on");
    assert_eq!(
        metadata.fields["domain"].kind,
        Some(envoy_types::pb::google::protobuf::value::Kind::StringValue(
            "e2e".into()
        ))
    );
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert_eq!(headers[0], ("RateLimit-Limit", "2"));
    assert_eq!(headers[1], ("X-Left", "1"));
    assert_eq!(headers[2].0, "RateLimit-Reset");
    for _ in 0..2 {
        let r = ask(&mut client, "e2e", &[&[("shadow", "s")]]).await;
        assert_eq!(r.overall_code, OK);
    }
    let stats = server.stats().await;
    assert_eq!(
        stats["ratelimit.service.rate_limit.e2e.shadow.shadow_mode"],
        1
    );
}

on_every_backend!(json_answers_200_429_and_400_with_messages);

async fn json_answers_200_429_and_400_with_messages(store: &Store) {
    let server = start(store, Options::default());
    let http = reqwest::Client::new();
    let post = |body: &'static str| http.post(server.http_url("/json")).body(body).send();
    let body = r#"{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"j"}]}]}"#;
    let ok = post(body).await.unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(ok.headers()["content-type"], "application/json");
    let json: serde_json::Value = ok.json().await.unwrap();
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(
        json["statuses"][0]["currentLimit"],
        serde_json::json!({"requestsPerUnit": 2, "unit": "HOUR"})
    );
    assert_eq!(json["statuses"][0]["limitRemaining"], 1);
    post(body).await.unwrap();
    let over = post(body).await.unwrap();
    assert_eq!(over.status(), 429);
    let json: serde_json::Value = over.json().await.unwrap();
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
    assert!(
        json["statuses"][0].get("limitRemaining").is_none(),
        "zero values are omitted"
    );

    for (body, message) in [
        ("{", "invalid JSON"),
        (
            r#"{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":1}]}]}"#,
            "descriptors[0].entries[0].value: expected a string",
        ),
        (r#"{"domain":"e2e","bogus":1}"#, "unknown field 'bogus'"),
        (
            r#"{"descriptors":[{"entries":[{"key":"user","value":"x"}]}]}"#,
            "rate limit domain must not be empty",
        ),
    ] {
        let response = post(body).await.unwrap();
        assert_eq!(response.status(), 400, "{body}");
        let text = response.text().await.unwrap();
        assert!(text.contains(message), "{body}: {text}");
    }
    let health = http
        .get(server.http_url("/healthcheck"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        (health.status().as_u16(), health.text().await.unwrap()),
        (200, "OK".to_owned())
    );
    assert_eq!(
        http.get(server.http_url("/nope"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn http_paths_are_exact_and_bodies_may_be_chunked() {
    let server = Server::start_with(Options::rules(RULES).set("MAX_JSON_BODY_BYTES", "200"));
    let exchange = |head: &str, body: &str| {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", server.http)).unwrap();
        let request = format!("{head}Host: x\r\nConnection: close\r\n\r\n{body}");
        std::io::Write::write_all(&mut stream, request.as_bytes()).unwrap();
        // A refused body may be left unread: the close can reset the connection after the
        // answer arrived, so what was read counts whatever the read ends with.
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut stream, &mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    };
    let chunked = |body: &str| format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    let one = r#"{"domain":"e2e","descriptors":[{"entries":[{"key":"user","value":"c"}]}]}"#;
    let streamed = "POST /json HTTP/1.1\r\nTransfer-Encoding: chunked\r\n";
    let answer = exchange(streamed, &chunked(one));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains(r#""overallCode":"OK""#), "{answer}");
    let big = format!(r#"{{"domain":"{}"}}"#, "d".repeat(200));
    let answer = exchange(streamed, &chunked(&big));
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    let sized = format!("POST /json HTTP/1.1\r\nContent-Length: {}\r\n", big.len());
    assert!(exchange(&sized, &big).starts_with("HTTP/1.1 413"));
    let answer = exchange("POST /json HTTP/1.1\r\n", "");
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("empty body"), "{answer}");
    for path in ["/json/", "/healthcheck/", "/json/x"] {
        let answer = exchange(&format!("GET {path} HTTP/1.1\r\n"), "");
        assert!(answer.starts_with("HTTP/1.1 404"), "{path}: {answer}");
        // As Go's http.Error writes every error answer.
        let head = answer.to_ascii_lowercase();
        assert!(head.contains("x-content-type-options: nosniff"), "{answer}");
    }
}

#[tokio::test]
async fn grpc_health_answers_as_grpc_go_does() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let server = Server::start(&[("rules.yaml", RULES)]);
    let address = format!("http://127.0.0.1:{}", server.grpc);
    let channel = tonic::transport::Channel::from_shared(address).unwrap();
    let mut health = HealthClient::new(channel.connect().await.unwrap());
    let asking = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    for service in ["", "ratelimit"] {
        let status = health.check(asking(service)).await.unwrap().into_inner();
        assert_eq!(status.status, ServingStatus::Serving as i32, "{service:?}");
    }
    let unknown = health.check(asking("bogus")).await.unwrap_err();
    assert_eq!(
        (unknown.code(), unknown.message()),
        (Code::NotFound, "unknown service")
    );
    // Watching an unknown service says so, then waits for it instead of ending.
    let mut watch = health.watch(asking("bogus")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::ServiceUnknown as i32);
    let next = tokio::time::timeout(Duration::from_millis(300), watch.message()).await;
    assert!(next.is_err(), "the stream stays open: {next:?}");
}

#[tokio::test]
async fn debug_server_lists_paths_rules_and_statistics() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let index = get_text(&server.debug_url("/")).await;
    assert!(
        index.contains("/rlconfig") && index.contains("/stats") && index.contains("/debug/pprof/")
    );
    let rules = get_text(&server.debug_url("/rlconfig")).await;
    assert!(
        rules.contains(
            "e2e.user: unit=HOUR requests_per_unit=2, shadow_mode: false, quota_mode: false"
        ),
        "{rules}"
    );
    assert!(
        rules.contains("e2e.free: unit=UNKNOWN requests_per_unit=0"),
        "{rules}"
    );
    // As upstream's, the index is sorted and answers every path no route takes.
    let paths: Vec<&str> = index.lines().filter_map(|l| l.split(':').next()).collect();
    assert!(paths.is_sorted(), "{index}");
    assert_eq!(get_text(&server.debug_url("/nope")).await, index);
    let pprof = get_text(&server.debug_url("/debug/pprof/")).await;
    assert!(pprof.contains("perf record"), "{pprof}");
    assert_eq!(
        server.stat("ratelimit.service.config_load_success").await,
        Some(1)
    );
    assert_eq!(server.stat("ratelimit.memory.counters").await, Some(0));
}

#[tokio::test]
async fn symlink_swap_reloads_and_a_broken_version_keeps_the_old_rules() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    server.swap_root("v2", &[("rules.yaml", "domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 7}\n")]);
    let reloaded = eventually(Duration::from_secs(10), || async {
        server.stat("ratelimit.service.config_load_success").await == Some(2)
    })
    .await;
    assert!(reloaded, "{}", server.log());
    assert_eq!(limit_of(&server, "e2e", &[("user", "a")]).await, Some(7));

    server.swap_root("v3", &[("rules.yaml", "domain: e2e\ndescriptors:\n  - key: user\n    rate_limit: {unit: minutes, requests_per_unit: 1}\n")]);
    let rejected = eventually(Duration::from_secs(10), || async {
        server.stat("ratelimit.service.config_load_error").await == Some(1)
    })
    .await;
    assert!(rejected, "{}", server.log());
    assert_eq!(
        limit_of(&server, "e2e", &[("user", "a")]).await,
        Some(7),
        "old rules still serve"
    );
    assert!(server.log().contains(
        "config/rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'minutes'"
    ));
}

#[tokio::test]
async fn file_edits_reload_when_not_watching_the_root() {
    let server = Server::start_with(Options {
        watch_root: false,
        env: vec![("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into())],
        ..Options::rules(RULES)
    });
    let extra = server.config_dir().join("extra.yaml");
    std::fs::write(&extra, "domain: second\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n").unwrap();
    let loaded = eventually(Duration::from_secs(10), || async {
        limit_of(&server, "second", &[("k", "v")]).await.is_some()
    })
    .await;
    assert!(loaded, "{}", server.log());
    std::fs::write(&extra, "domain: second\ndescriptors: [oops").unwrap();
    let rejected = eventually(Duration::from_secs(10), || async {
        server
            .stat("ratelimit.service.config_load_error")
            .await
            .unwrap_or(0)
            >= 1
    })
    .await;
    assert!(rejected, "{}", server.log());
    let kept = limit_of(&server, "second", &[("k", "v")]).await;
    assert_eq!(kept, Some(3), "the last good configuration keeps serving");
    // Removing every file leaves no domain: unhealthy, as HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED asks.
    std::fs::remove_file(&extra).unwrap();
    std::fs::remove_file(server.config_dir().join("rules.yaml")).unwrap();
    let unhealthy = eventually(Duration::from_secs(10), || async {
        let r = reqwest::get(server.http_url("/healthcheck")).await.unwrap();
        r.status() == 500
    })
    .await;
    assert!(unhealthy, "{}", server.log());
}

#[tokio::test]
async fn health_needs_a_config_when_asked_to() {
    let server = Server::start_with(Options {
        env: vec![("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true".into())],
        watch_root: false,
        ..Options::default()
    });
    let r = reqwest::get(server.http_url("/healthcheck")).await.unwrap();
    assert_eq!(r.status(), 500);
    assert_eq!(r.headers()["x-unhealthy"], "config");
    assert_eq!(r.text().await.unwrap(), "", "upstream's 500 has no body");
    std::fs::write(server.config_dir().join("a.yaml"), "domain: a\n").unwrap();
    let healthy = eventually(Duration::from_secs(10), || async {
        reqwest::get(server.http_url("/healthcheck"))
            .await
            .unwrap()
            .status()
            == 200
    })
    .await;
    assert!(healthy, "{}", server.log());
}

#[tokio::test]
async fn sigterm_fails_health_drains_and_exits_zero() {
    let mut server = Server::start(&[("rules.yaml", RULES)]);
    let mut client = server.client().await;
    ask(&mut client, "e2e", &[&[("user", "a")]]).await;
    server.signal("TERM");
    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", server.log());
    assert!(
        server.log().contains("signal=\"SIGTERM\""),
        "{}",
        server.log()
    );
    assert!(
        reqwest::get(server.http_url("/healthcheck")).await.is_err(),
        "listeners are closed"
    );
}

on_every_backend!(concurrent_clients_never_get_more_than_the_limit);

async fn concurrent_clients_never_get_more_than_the_limit(store: &Store) {
    let server = start(store, Options::default());
    let hour = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() / 3600
    };
    let started = hour(std::time::SystemTime::now());
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for _ in 0..100 {
                let r = ask(&mut client, "e2e", &[&[("hot", "k")]]).await;
                ok += u32::from(r.overall_code == OK);
            }
            ok
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let windows = hour(std::time::SystemTime::now()) - started + 1;
    assert!(admitted <= 500 * windows as u32, "{admitted} admitted");
    if windows == 1 {
        assert_eq!(admitted, 500);
    }
}

#[tokio::test]
async fn grpc_over_a_unix_socket() {
    let server = Server::start_with(Options {
        uds: true,
        ..Options::rules(RULES)
    });
    let mut client = server.uds_client().await;
    let r = ask(&mut client, "e2e", &[&[("user", "u")]]).await;
    assert_eq!(codes(&r), [(OK, 1)]);
}

#[test]
fn bad_settings_stop_start_up_naming_the_variable() {
    for (key, value) in [
        ("NEAR_LIMIT_RATIO", "1.5"),
        ("BACKEND_TYPE", "etcd"),
        ("STATS_FLUSH_INTERVAL", "10"),
        ("RUNTIME_WATCH_ROOT", "maybe"),
        ("GRPC_WORKERS", "0"),
    ] {
        let log = Server::refused(Options {
            env: vec![(key, value.to_owned())],
            ..Options::default()
        });
        assert!(log.contains(key), "{key}: {}", log);
    }
}

#[test]
fn the_tools_print_their_usage_and_say_what_is_missing() {
    let client = env!("CARGO_BIN_EXE_ratelimit-client");
    let check = env!("CARGO_BIN_EXE_ratelimit-config-check");
    for (tool, help) in [
        (client, "-help"),
        (client, "--help"),
        (check, "-h"),
        (check, "--help"),
    ] {
        let output = std::process::Command::new(tool).arg(help).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{tool} {help}: {stdout}");
        assert!(
            stdout.starts_with("usage: ratelimit-"),
            "{tool} {help}: {stdout}"
        );
    }
    // No domain: refused before anything is sent (the port is closed; no connection
    // error is reported, because none is attempted).
    let port = support::free_port().to_string();
    let output = std::process::Command::new(client)
        .args([
            "--dial_string",
            &format!("127.0.0.1:{port}"),
            "--descriptors",
            "user=a",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.starts_with("-domain is required: nothing was sent"),
        "{stderr}"
    );
}

#[test]
fn client_and_config_check_tools() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-client"))
        .args([
            "-dial_string",
            &format!("127.0.0.1:{}", server.grpc),
            "-domain",
            "e2e",
            "-descriptors",
            "user=tool",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains(r#"response: {"overallCode":"OK""#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""limitRemaining":1"#), "{stdout}");

    let check = |dir: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ratelimit-config-check"))
            .args(["-config_dir", dir.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let good = check(&server.config_dir());
    assert!(good.status.success());
    assert!(String::from_utf8_lossy(&good.stdout).contains("all rate limit configs ok"));
    // Accepted, as upstream accepts it, but most likely a mistake: said so.
    let shallow = tempfile::tempdir().unwrap();
    std::fs::write(
        shallow.path().join("w.yaml"),
        "domain: w\ndescriptors:\n  - key: user\n    rate_limit:\n    unit: second\n    requests_per_unit: 5\n",
    )
    .unwrap();
    let warned = check(shallow.path());
    let stdout = String::from_utf8_lossy(&warned.stdout);
    assert!(warned.status.success(), "{stdout}");
    assert!(
        stdout.contains("warning: ")
            && stdout.contains("w.yaml: descriptors[0].rate_limit is empty"),
        "{stdout}"
    );
    std::fs::write(
        server.config_dir().join("bad.yaml"),
        "domain: x\ndescriptors:\n  - key: k\n    ratelimit: {}\n",
    )
    .unwrap();
    let bad = check(&server.config_dir());
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bad.stdout)
            .contains("bad.yaml: descriptors[0].ratelimit: config error, unknown key 'ratelimit' (line 4, column 5)")
    );
    // Every error is listed, not only the first.
    std::fs::write(
        server.config_dir().join("worse.yaml"),
        "domain: y\ndescriptors:\n  - key: k\n    rate_limitz: {}\n",
    )
    .unwrap();
    let worse = check(&server.config_dir());
    let stdout = String::from_utf8_lossy(&worse.stdout);
    assert_eq!(worse.status.code(), Some(1));
    assert!(
        stdout.contains("unknown key 'ratelimit' (line 4, column 5)")
            && stdout.contains("worse.yaml: descriptors[0].rate_limitz: config error, unknown key 'rate_limitz' (line 4, column 5)"),
        "{stdout}"
    );
}
