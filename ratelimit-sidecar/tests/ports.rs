//! The debug port never shares a thread with decisions, and what it builds is bounded
//! (`/explain`'s descriptors and the dashboard's rules); the HTTP port answers health
//! checks however many connections clients hold open on it, or open again and again.

use std::collections::HashMap;
use std::time::Duration;

use ratelimit_tests::calls::{SilentClients, exchange, trickling_clients};

use ratelimit_tests::sidecar as support;
use serde_json::Value;
use support::{Options, Server, get_text, post};

const RULES: &str =
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

/// CPU time (clock ticks, user and system) each thread of `pid` has used, summed by the
/// thread's name.
fn cpu_by_thread_name(pid: u32) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(task.unwrap().path().join("stat")) else {
            continue;
        };
        // `tid (name) state …`: the name may hold spaces, the fields after it do not.
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_owned();
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        *out.entry(name).or_default() += ticks;
    }
    out
}

/// The ticks of the threads that decide: the main thread (worker 0) and the workers.
fn decision_ticks(cpu: &HashMap<String, u64>) -> u64 {
    cpu.iter()
        .filter(|(name, _)| *name == "ratelimit" || name.starts_with("ratelimit-worke"))
        .map(|(_, ticks)| ticks)
        .sum()
}

fn explain_body(descriptors: usize) -> String {
    let one = r#"{"entries":[{"key":"user","value":"someone"}]}"#;
    format!(
        r#"{{"domain":"d","descriptors":[{}]}}"#,
        vec![one; descriptors].join(",")
    )
}

#[tokio::test]
async fn explanations_are_built_on_the_debug_thread_not_on_a_worker() {
    let options = Options::rules(RULES).set("GRPC_WORKERS", "2");
    let server = Server::start_with(options.set("MAX_DESCRIPTORS", "2000"));
    let body = explain_body(1_000);
    let before = cpu_by_thread_name(server.pid());
    for _ in 0..30 {
        let (status, text) = post(&server.debug_url("/explain"), &body).await;
        assert_eq!(status, 200, "{text}");
    }
    let after = cpu_by_thread_name(server.pid());
    let debug = after.get("ratelimit-debug").copied().unwrap_or(0)
        - before.get("ratelimit-debug").copied().unwrap_or(0);
    let deciding = decision_ticks(&after) - decision_ticks(&before);
    // Thirty answers of 1 000 descriptors are a few hundred milliseconds of work; it must
    // have been done by the debug thread, and the workers must have done almost none.
    assert!(
        debug >= 10 && deciding * 5 <= debug,
        "debug thread {debug} ticks, deciding threads {deciding} ticks: {after:?}"
    );
    // Decisions still come from the workers.
    let response = server.ask("d", &[&[("user", "a")]]).await;
    assert_eq!(response.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn explain_refuses_more_descriptors_than_its_bound() {
    // Past MAX_DESCRIPTORS a request is refused as any request is; below it, /explain
    // has a bound of its own.
    let server = Server::start_with(Options::rules(RULES).set("MAX_DESCRIPTORS", "2000"));
    let (status, text) = post(&server.debug_url("/explain"), &explain_body(1_001)).await;
    assert_eq!(status, 413, "{text}");
    assert_eq!(
        text,
        "Payload Too Large: /explain takes at most 1000 descriptors at a time; this request has 1001\n"
    );
    let (status, text) = post(&server.debug_url("/explain"), &explain_body(1_000)).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn the_dashboard_sends_a_bounded_share_of_the_rules_with_their_total() {
    let mut rules = String::from("domain: many\ndescriptors:\n");
    for i in 0..3_000 {
        rules.push_str(&format!(
            "  - key: k{i}\n    rate_limit: {{unit: hour, requests_per_unit: 5}}\n"
        ));
    }
    let server = Server::start_with(Options::rules(&rules));
    let text = get_text(&server.debug_url("/dashboard.json")).await;
    let json: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["rulesTotal"], 3_000);
    assert_eq!(json["rules"].as_array().unwrap().len(), 1_000);
    assert_eq!(json["rules"][0]["key"], "k0");
    assert_eq!(json["lastLoad"]["domainsTotal"], 1);
    // All of them are still in the configuration dump.
    let config = get_text(&server.debug_url("/rlconfig")).await;
    assert!(config.contains("many.k2999"), "{}", &config[..200]);
}

#[tokio::test]
async fn health_is_answered_while_trickling_clients_hold_every_http_connection() {
    let held = Duration::from_secs(120).as_secs().to_string() + "s";
    let server = Server::start_with(
        Options::rules(RULES)
            .set("GRPC_WORKERS", "2")
            .set("HTTP_MAX_CONNECTIONS", "16")
            .set("HTTP_HEADER_READ_TIMEOUT", &held)
            .set("HTTP_IDLE_TIMEOUT", &held)
            .set("HTTP_REQUEST_TIMEOUT", &held),
    );
    // Sixty clients trickle bodies: sixteen hold every slot for two minutes, the others
    // are told at once that only health checks are answered past the cap.
    let (clients, refused) = trickling_clients(
        server.http,
        60,
        b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{",
        "Service Unavailable: all 16 HTTP connections are in use; past them only health checks (/healthcheck) are answered",
    );
    assert_eq!(refused, 60 - 16, "{}", server.log());
    let probe = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    for _ in 0..20 {
        let health = probe.get(server.http_url("/healthcheck")).send().await;
        let health = health.expect("health answered past the cap");
        assert_eq!(health.status(), 200);
        assert_eq!(health.text().await.unwrap(), "OK");
    }
    // Decisions on the HTTP port wait for a slot: past the cap they are refused loudly.
    let json = probe
        .post(server.http_url("/json"))
        .body(r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), 503);
    assert_eq!(json.headers()["retry-after"], "1");
    // Once the holders go, the slots serve decisions again.
    drop(clients);
    let served = ratelimit_tests::eventually(Duration::from_secs(10), || async {
        let (status, _) = post(
            &server.http_url("/json"),
            r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}"#,
        )
        .await;
        status == 200
    })
    .await;
    assert!(served, "{}", server.log());
}

#[test]
fn silent_clients_reconnecting_through_the_reserve_do_not_keep_health_probes_out() {
    let held = "120s";
    let server = Server::start_with(
        Options::rules(RULES)
            .set("GRPC_WORKERS", "2")
            .set("HTTP_MAX_CONNECTIONS", "4")
            .set("HTTP_HEADER_READ_TIMEOUT", held)
            .set("HTTP_IDLE_TIMEOUT", held),
    );
    // Four kept-alive connections, each answered a decision (which past the cap is a
    // 503), hold every slot: only the reserve's four places are left.
    let body = r#"{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"holder"}]}]}"#;
    let decide = format!(
        "POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let holders: Vec<_> = (0..4)
        .map(|_| {
            let (stream, head) =
                exchange(server.http, decide.as_bytes(), Duration::from_secs(30)).unwrap();
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            stream
        })
        .collect();
    // Twelve clients connect, send nothing, and connect again as soon as they are closed.
    let silent = SilentClients::start(server.http, 12);
    std::thread::sleep(Duration::from_millis(300));
    // Ten probes as the kubelet sends them, a little apart: each is answered within its
    // default timeout of 1 s, although it connects behind silent clients that take a
    // place of the reserve as soon as one frees.
    let probe = concat!(
        "GET /healthcheck HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: kube-probe/1.33\r\n",
        "Accept: */*\r\nConnection: close\r\n\r\n"
    );
    let mut answers = Vec::new();
    for _ in 0..10 {
        let answer = exchange(server.http, probe.as_bytes(), Duration::from_secs(1));
        answers.push(answer.map_or_else(|e| e.to_string(), |(_, head)| head));
        std::thread::sleep(Duration::from_millis(100));
    }
    let closed = silent.stop();
    let answered = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 200"))
        .count();
    assert_eq!(answered, 10, "{answers:#?}");
    assert!(
        closed > 0,
        "the silent clients took reserve places and were closed"
    );
    drop(holders);
}
