//! Authenticated clients, scopes, keys and rules changed on disk while the service runs,
//! and the statistics: against a real broker (tansu), each message read back by an
//! independent client.

use std::path::{Path, PathBuf};

use ratelimit_tests::intake as support;
use support::{Intake, Tansu, batch, bearer, health, keygen, post, read_topic, replace_file};

struct Setup {
    tansu: Tansu,
    service: Intake,
    keys: PathBuf,
    rules: PathBuf,
    _dir: tempfile::TempDir,
}

/// Ten operations per client per hour.
const RULES: &str = "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 10}\n";

async fn start(topic: &str, keys: &str) -> Setup {
    let tansu = Tansu::start();
    tansu.create_topic(topic, 1).await;
    let dir = tempfile::tempdir().unwrap();
    let (key_file, rules) = (dir.path().join("keys.yaml"), dir.path().join("limits.yaml"));
    std::fs::write(&key_file, keys).unwrap();
    std::fs::write(&rules, RULES).unwrap();
    let bootstrap = tansu.bootstrap();
    let service = Intake::start(&[
        ("AUTH", "api-keys"),
        ("API_KEYS_FILE", key_file.to_str().unwrap()),
        ("RATELIMIT_CONFIG", rules.to_str().unwrap()),
        ("KAFKA_BOOTSTRAP_SERVERS", &bootstrap),
        ("KAFKA_TOPIC", topic),
    ]);
    Setup {
        tansu,
        service,
        keys: key_file,
        rules,
        _dir: dir,
    }
}

async fn post_as(
    service: &Intake,
    key: &str,
    body: &str,
    extra: &[(&str, &str)],
) -> support::Answer {
    let (name, value) = bearer(key);
    let mut headers = vec![(name, value.as_str())];
    headers.extend_from_slice(extra);
    post(service, body, &headers).await
}

/// Polls until `path`'s last load (in `/health`) is `outcome`.
async fn reloaded(service: &Intake, file: &str, outcome: &str, loads: usize) {
    let what = format!("{file} {outcome} (load {loads})");
    support::wait_until(&what, || async {
        let metrics = reqwest::get(service.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let line = format!("intake_reloads_total{{file=\"{file}\",outcome=\"{outcome}\"}} {loads}");
        metrics.lines().any(|l| l == line)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_authenticate_and_scope_clients_and_rotate_without_restart() {
    let (acme, acme_entry) = keygen("acme", None);
    let (buyer, buyer_entry) = keygen("buyer", Some("buy"));
    let setup = start("auth", &format!("{acme_entry}{buyer_entry}")).await;
    let service = &setup.service;

    let none = post(service, &batch("buy", 1), &[]).await;
    assert_eq!(none.status, 401, "{}", none.body);
    assert_eq!(
        none.header("www-authenticate"),
        Some(r#"Bearer realm="operations-intake""#)
    );
    assert!(none.body["message"].as_str().unwrap().contains("Bearer"));
    assert_eq!(none.body["error"], "Authentication required.");
    let unknown = post_as(service, "oik_not-a-key", &batch("buy", 1), &[]).await;
    assert_eq!(unknown.status, 401);
    assert!(
        unknown
            .header("www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    let basic = post(
        service,
        &batch("buy", 1),
        &[("authorization", &format!("Basic {acme}"))],
    )
    .await;
    assert_eq!(basic.status, 401);
    // A header naming another client changes nothing: the key says who is sending.
    let spoof = [("x-client-id", "buyer")];
    let forbidden = post_as(
        service,
        &buyer,
        &format!(
            "[{},{}]",
            support::operation("buy", "1", 1),
            support::operation("sell", "1", 1)
        ),
        &[],
    )
    .await;
    assert_eq!(forbidden.status, 403, "{}", forbidden.body);
    assert_eq!(
        forbidden.body["error"],
        "Operation not allowed for this client."
    );
    assert!(
        forbidden.body["message"]
            .as_str()
            .unwrap()
            .contains("may not send sell operations (its scopes: buy)")
    );
    let bought = post_as(service, &buyer, &batch("buy", 2), &[]).await;
    assert_eq!(bought.status, 202, "{}", bought.body);
    let acme_sold = post_as(service, &acme, &batch("sell", 1), &spoof).await;
    assert_eq!(acme_sold.status, 202, "{}", acme_sold.body);

    // Rotation: acme gets a new key and the old one goes, by editing the file.
    let (rotated, rotated_entry) = keygen("acme", None);
    replace_file(&setup.keys, &format!("{rotated_entry}{buyer_entry}"));
    reloaded(service, "api_keys", "loaded", 2).await;
    assert_eq!(
        post_as(service, &acme, &batch("buy", 1), &[]).await.status,
        401
    );
    let after = post_as(service, &rotated, &batch("buy", 1), &[]).await;
    assert_eq!(after.status, 202, "{}", after.body);
    // A broken file keeps the keys in use, and says so.
    replace_file(&setup.keys, "- client_id: acme\n  key_sha256: nothex\n");
    reloaded(service, "api_keys", "rejected", 1).await;
    assert_eq!(
        post_as(service, &rotated, &batch("buy", 1), &[])
            .await
            .status,
        202
    );
    let state = health(service).await;
    assert_eq!(
        state.body["files"]["api_keys"]["outcome"], "rejected",
        "{}",
        state.body
    );
    assert!(
        state.body["files"]["api_keys"]["error"]
            .as_str()
            .unwrap()
            .contains("64 hexadecimal")
    );
    assert!(
        service.log().contains("API_KEYS_FILE"),
        "the refusal is logged"
    );
    // The previous keys are still in use, so the service stays ready.
    let ready = support::get(service, "/health/ready").await;
    assert_eq!(ready.status, 200, "{}", ready.body);
    assert_eq!(ready.body["checks"]["api_keys"]["status"], "up");
    assert_eq!(ready.body["checks"]["ratelimit_config"]["status"], "up");

    // Only the 202s reached the topic, each recording its authenticated client.
    let records = read_topic(&setup.tansu.bootstrap(), "auth");
    let clients: Vec<&str> = records
        .iter()
        .map(|r| r.header("client-id").unwrap())
        .collect();
    assert_eq!(clients, ["buyer", "acme", "acme", "acme"]);
    for record in &records {
        let id = record.header("request-id").unwrap();
        let client = record.header("client-id").unwrap();
        assert_eq!(record.key, format!("{client} {id}").as_bytes());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_cannot_spend_another_clients_limit() {
    let (acme, acme_entry) = keygen("acme", None);
    let (globex, globex_entry) = keygen("globex", None);
    let setup = start("spend", &format!("{acme_entry}{globex_entry}")).await;
    let service = &setup.service;
    // acme claims to be globex: its own limit is spent.
    let claimed = post_as(
        service,
        &acme,
        &batch("buy", 10),
        &[("x-client-id", "globex")],
    )
    .await;
    assert_eq!(claimed.status, 202, "{}", claimed.body);
    let over = post_as(
        service,
        &acme,
        &batch("buy", 1),
        &[("x-client-id", "globex")],
    )
    .await;
    assert_eq!(over.status, 429, "{}", over.body);
    let theirs = post_as(service, &globex, &batch("buy", 10), &[]).await;
    assert_eq!(
        theirs.status, 202,
        "globex's limit is untouched: {}",
        theirs.body
    );
    // Idempotency keys belong to their client: the same key is two batches.
    let (first, second) = (batch("sell", 1), batch("sell", 2));
    let key = [("idempotency-key", "shared-key")];
    let a = post_as(service, &globex, &first, &key).await;
    assert_eq!(a.status, 429, "globex's hour is spent: {}", a.body);
    replace_file(&setup.rules, &RULES.replace("10}", "100}"));
    reloaded(service, "ratelimit_config", "loaded", 2).await;
    let a = post_as(service, &globex, &first, &key).await;
    let b = post_as(service, &acme, &second, &key).await;
    assert_eq!((a.status, b.status), (202, 202), "{} {}", a.body, b.body);
    assert_eq!(
        (a.body["id"].as_str(), b.body["id"].as_str()),
        (Some("shared-key"), Some("shared-key"))
    );
    let keys: Vec<Vec<u8>> = read_topic(&setup.tansu.bootstrap(), "spend")
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert!(
        keys.contains(&b"globex shared-key".to_vec())
            && keys.contains(&b"acme shared-key".to_vec()),
        "{keys:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rule_change_is_picked_up_without_restart_and_a_bad_one_is_refused() {
    let (acme, entry) = keygen("acme", None);
    let setup = start("rules", &entry).await;
    let service = &setup.service;
    assert_eq!(
        post_as(service, &acme, &batch("buy", 10), &[]).await.status,
        202
    );
    assert_eq!(
        post_as(service, &acme, &batch("buy", 1), &[]).await.status,
        429
    );

    // The refused operation counted too (as upstream counts it): 11 used of 13.
    replace_file(&setup.rules, &RULES.replace("10}", "13}"));
    reloaded(service, "ratelimit_config", "loaded", 2).await;
    let raised = post_as(service, &acme, &batch("buy", 2), &[]).await;
    assert_eq!(
        raised.status, 202,
        "the new limit counts on from the same window: {}",
        raised.body
    );
    assert_eq!(raised.header("ratelimit-limit"), Some("13"));
    assert!(
        service.log().contains("loaded rate limit configuration"),
        "the sidecar's message"
    );

    // Rules for another domain would allow everything: refused, the old ones stay.
    replace_file(&setup.rules, "domain: elsewhere\n");
    reloaded(service, "ratelimit_config", "rejected", 1).await;
    assert_eq!(
        post_as(service, &acme, &batch("buy", 1), &[]).await.status,
        429
    );
    let log = service.log();
    assert!(
        log.contains("rate limit configuration rejected; the previous configuration stays in use"),
        "{log}"
    );
    let state = health(service).await;
    assert_eq!(state.status, 200);
    assert!(
        state.body["files"]["ratelimit_config"]["error"]
            .as_str()
            .unwrap()
            .contains("no domain `operations`")
    );

    let metrics = reqwest::get(service.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "intake_requests_total{status=\"202\"} 2",
        "intake_requests_total{status=\"429\"} 2",
        "intake_limit_refusals_total 2",
        "intake_operations_produced_total 12",
        "intake_batches_produced_total 2",
        "intake_produce_latency_seconds_count 2",
        "intake_kafka_up 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing from\n{metrics}"
        );
    }
    assert!(
        metrics.contains(
            "ratelimit_service_rate_limit_over_limit{domain=\"operations\",key1=\"client_id\"} 2"
        ),
        "{metrics}"
    );
}

fn start_up_error(env: &[(&str, &Path)], plain: &[(&str, &str)]) -> String {
    let mut command = std::process::Command::new(support::binary("operations-intake"));
    command
        .env_clear()
        .env("PORT", support::free_port().to_string());
    for (name, value) in env {
        command.env(name, value);
    }
    for (name, value) in plain {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn authentication_and_idempotency_misconfigurations_stop_start_up() {
    let missing = start_up_error(&[], &[]);
    assert!(
        missing.contains("needs API_KEYS_FILE") && missing.contains("keygen"),
        "{missing}"
    );
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("keys.yaml");
    std::fs::write(&keys, "- client_id: a\n  key_sha256: 12\n").unwrap();
    let bad = start_up_error(&[("API_KEYS_FILE", &keys)], &[]);
    assert!(
        bad.contains("API_KEYS_FILE") && bad.contains("64 hexadecimal"),
        "{bad}"
    );
    let ignored = start_up_error(&[("API_KEYS_FILE", &keys)], &[("AUTH", "none")]);
    assert!(ignored.contains("AUTH=none would ignore it"), "{ignored}");
    let absent = start_up_error(&[("API_KEYS_FILE", &dir.path().join("absent.yaml"))], &[]);
    assert!(absent.contains("cannot read API_KEYS_FILE"), "{absent}");
    let no_url = start_up_error(&[], &[("AUTH", "none"), ("IDEMPOTENCY_STORE", "redis")]);
    assert!(no_url.contains("needs IDEMPOTENCY_REDIS_URL"), "{no_url}");
    let mtls = start_up_error(&[], &[("AUTH", "mtls")]);
    assert!(
        mtls.contains("AUTH=mtls names clients by their certificates"),
        "{mtls}"
    );
    let short = start_up_error(
        &[],
        &[
            ("AUTH", "none"),
            ("IDEMPOTENCY_STORE", "redis"),
            ("IDEMPOTENCY_REDIS_URL", "redis://127.0.0.1:1"),
            ("IDEMPOTENCY_CLAIM_TTL", "5s"),
        ],
    );
    assert!(
        short.contains("IDEMPOTENCY_CLAIM_TTL (5s) must exceed"),
        "{short}"
    );
    let tls = start_up_error(
        &[],
        &[
            ("AUTH", "none"),
            ("IDEMPOTENCY_STORE", "redis"),
            ("IDEMPOTENCY_REDIS_URL", "rediss://127.0.0.1:6380"),
        ],
    );
    assert!(tls.contains("rediss://, is not supported"), "{tls}");
    let unreachable = start_up_error(
        &[],
        &[
            ("AUTH", "none"),
            ("IDEMPOTENCY_STORE", "redis"),
            (
                "IDEMPOTENCY_REDIS_URL",
                &format!("redis://127.0.0.1:{}", support::free_port()),
            ),
        ],
    );
    assert!(
        unreachable.contains("cannot reach Redis at IDEMPOTENCY_REDIS_URL"),
        "{unreachable}"
    );
}

/// `curl` over HTTPS to the intake, trusting `ca.crt` in `pki`, with the client
/// certificate when `client` is set: its exit status and output.
fn curl_tls(service: &Intake, pki: &Path, client: bool, args: &[&str]) -> (bool, String) {
    let mut command = std::process::Command::new("curl");
    command
        .args(["-sS", "--cacert"])
        .arg(pki.join("ca.crt"))
        .args(args);
    if client {
        command
            .arg("--cert")
            .arg(pki.join("client.crt"))
            .arg("--key")
            .arg(pki.join("client.key"));
    }
    let output = command
        .arg(format!("https://127.0.0.1:{}/operations", service.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_names_the_client_by_its_certificate() {
    let tansu = Tansu::start();
    tansu.create_topic("mtls", 1).await;
    let pki = tempfile::tempdir().unwrap();
    ratelimit_tests::pki::make_pki(pki.path());
    let file = |name: &str| pki.path().join(name).to_str().unwrap().to_owned();
    let bootstrap = tansu.bootstrap();
    let service = Intake::start(&[
        ("AUTH", "mtls"),
        ("TLS_CERT", &file("server.crt")),
        ("TLS_KEY", &file("server.key")),
        ("TLS_CLIENT_CA", &file("ca.crt")),
        ("KAFKA_BOOTSTRAP_SERVERS", &bootstrap),
        ("KAFKA_TOPIC", "mtls"),
    ]);
    let body = batch("buy", 2);
    let post_args = [
        "-H",
        "content-type: application/json",
        "-H",
        "x-client-id: someone-else",
        "--data-binary",
        body.as_str(),
    ];
    let (ok, answer) = curl_tls(&service, pki.path(), true, &post_args);
    assert!(
        ok && answer.contains("Operations received and processing initiated."),
        "{answer}"
    );
    let (ok, answer) = curl_tls(&service, pki.path(), false, &post_args);
    assert!(!ok, "no certificate, no connection: {answer}");
    let records = read_topic(&tansu.bootstrap(), "mtls");
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].header("client-id"),
        Some(ratelimit_tests::pki::CLIENT_NAME)
    );
    // Plain HTTP is not served on the port.
    let plain = reqwest::get(service.url("/health")).await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
}
