//! envoyproxy/ratelimit and the sidecar given the same calls, their outputs side by side:
//! the rate-limit statistics as statsd lines, as DogStatsD lines with their tags and as
//! Prometheus series; `/json` and `/healthcheck` answers and the debug port's
//! `/rlconfig`; the error logged for a bad rule file; the exit codes of bad settings.
//!
//! `UPSTREAM_RATELIMIT_BIN=… cargo run -p ratelimit-tests --example upstream_outputs`
//! (bench/upstream/run.sh outputs). Both decide on one real Redis. Prints every
//! difference, marking those docs/compatibility.md lists as deliberate; exits 1 on any
//! other.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ratelimit_tests::free_port;
use ratelimit_tests::sidecar::{Options, Redis, Server, post, redis_env};
use ratelimit_tests::upstream::{ROUNDS, RULES, calls, upstream_binary};

/// Lines received on a statsd port: TCP (statsd, as gostats sends) or UDP (DogStatsD).
struct Collector {
    port: u16,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    fn tcp() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let sink = Arc::clone(&sink);
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(Result::ok) {
                        sink.lock().unwrap().push(line);
                    }
                });
            }
        });
        Collector { port, lines }
    }

    fn udp() -> Collector {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            let mut buffer = vec![0; 65_536];
            while let Ok(n) = socket.recv(&mut buffer) {
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                sink.lock().unwrap().extend(text.lines().map(str::to_owned));
            }
        });
        Collector { port, lines }
    }

    /// The rate-limit counters received: name (with its tags, sorted) to their sum.
    fn counters(&self) -> BTreeMap<String, u64> {
        let mut sums = BTreeMap::new();
        for line in self.lines.lock().unwrap().iter() {
            let mut fields = line.split('|');
            let (Some(point), Some("c")) = (fields.next(), fields.next()) else {
                continue;
            };
            let Some((name, value)) = point.rsplit_once(':') else {
                continue;
            };
            if !name.starts_with("ratelimit.service.rate_limit.") || name.contains(".second.") {
                continue;
            }
            let mut tags: Vec<&str> = fields
                .filter_map(|f| f.strip_prefix('#'))
                .flat_map(|t| t.split(','))
                .collect();
            tags.sort_unstable();
            let key = format!("{name} {}", tags.join(","));
            *sums.entry(key).or_insert(0) += value.parse::<u64>().unwrap_or(0);
        }
        sums
    }
}

/// Upstream (with `binary`) or the sidecar on `redis`, with the rules, `env`, and a
/// `CACHE_KEY_PREFIX` of its own (so that no two count on one counter).
fn start(binary: Option<&Path>, redis: &Redis, env: Vec<(&'static str, String)>) -> Server {
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut options = Options {
        files: vec![("fleet.yaml", RULES.to_owned())],
        binary: binary.map(Path::to_path_buf),
        ..Options::default()
    };
    options.env.extend(redis_env(redis.port));
    options.env.extend(env);
    options.env.push(("LOG_LEVEL", "warn".to_owned()));
    options
        .env
        .push(("CACHE_KEY_PREFIX", format!("outputs{n}_")));
    Server::start_with(options)
}

/// Upstream (first) and the sidecar, started alike.
fn pair(upstream: &Path, redis: &Redis, env: &[(&'static str, String)]) -> [Server; 2] {
    [Some(upstream), None].map(|binary| start(binary, redis, env.to_vec()))
}

/// Every call, ROUNDS times, to `server`.
async fn send_calls(server: &Server) {
    let mut client = server.client().await;
    for _ in 0..ROUNDS {
        for (_, call) in calls() {
            client.should_rate_limit(call).await.unwrap();
        }
    }
}

/// Prints the differences of two maps; returns how many.
fn differences<V: PartialEq + std::fmt::Debug>(
    what: &str,
    upstream: &BTreeMap<String, V>,
    ours: &BTreeMap<String, V>,
) -> usize {
    let mut n = 0;
    for key in upstream
        .keys()
        .chain(ours.keys().filter(|k| !upstream.contains_key(*k)))
    {
        let (a, b) = (upstream.get(key), ours.get(key));
        if a != b {
            println!("  {what} {key}: upstream {a:?}, sidecar {b:?}");
            n += 1;
        }
    }
    println!(
        "{what}: {} compared, {n} differences",
        upstream.len().max(ours.len())
    );
    n
}

/// The statistics through one sink (`env` chooses it; `collect` reads them after the
/// calls and a flush): returns the number of differences.
async fn compare_statistics(upstream: &Path, redis: &Redis, sink: &str) -> usize {
    let collectors = [0, 1].map(|_| {
        if sink == "dogstatsd" {
            Collector::udp()
        } else {
            Collector::tcp()
        }
    });
    let prometheus = [free_port(), free_port()];
    let servers: Vec<Server> = (0..2)
        .map(|i| {
            let env = match sink {
                "prometheus" => vec![
                    ("USE_STATSD", "false".to_owned()),
                    ("USE_PROMETHEUS", "true".to_owned()),
                    ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", prometheus[i])),
                    ("STATS_FLUSH_INTERVAL", "1s".to_owned()),
                ],
                other => vec![
                    ("USE_STATSD", (other == "statsd").to_string()),
                    ("USE_DOG_STATSD", (other == "dogstatsd").to_string()),
                    ("STATSD_HOST", "127.0.0.1".to_owned()),
                    ("STATSD_PORT", collectors[i].port.to_string()),
                    ("STATS_FLUSH_INTERVAL", "1s".to_owned()),
                ],
            };
            start((i == 0).then_some(upstream), redis, env)
        })
        .collect();
    for server in &servers {
        send_calls(server).await;
    }
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    if sink == "prometheus" {
        let [a, b] = prometheus.map(series);
        let (a, mut b) = (a.await, b.await);
        // The sidecar has every series from the start, at 0 until counted (a deliberate
        // difference); upstream's exporter makes a series with its first event.
        b.retain(|name, value| value != "0" || a.contains_key(name));
        return differences("prometheus", &a, &b);
    }
    differences(sink, &collectors[0].counters(), &collectors[1].counters())
}

/// The `ratelimit_service_rate_limit_*` series at `port`'s `/metrics`, with their values.
async fn series(port: u16) -> BTreeMap<String, String> {
    let text =
        ratelimit_tests::sidecar::get_text(&format!("http://127.0.0.1:{port}/metrics")).await;
    text.lines()
        .filter(|l| l.starts_with("ratelimit_service_rate_limit") && !l.contains("second"))
        // The limit and window gauges are the sidecar's additions (docs/statistics.md).
        .filter(|l| {
            !l.starts_with("ratelimit_service_rate_limit_limit")
                && !l.starts_with("ratelimit_service_rate_limit_window_seconds")
        })
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// `/json` for a few bodies, `/healthcheck` and the debug port's `/rlconfig`: status and
/// body (JSON compared as values, `/rlconfig` as sorted lines). Returns the differences.
async fn compare_http(upstream: &Path, redis: &Redis) -> usize {
    let servers = pair(upstream, redis, &[]);
    let bodies = [
        r#"{"domain":"fleet","descriptors":[{"entries":[{"key":"minute","value":"j"}]}]}"#,
        r#"{"domain":"fleet","descriptors":[{"entries":[{"key":"shadow","value":"j"}]},{"entries":[{"key":"user","value":"u"},{"key":"method","value":"POST"}]}]}"#,
        r#"{"domain":"fleet","descriptors":[{"entries":[{"key":"unlimited","value":"j"}]},{"entries":[{"key":"nothing","value":"j"}]}]}"#,
        r#"{"domain":"nowhere","descriptors":[{"entries":[{"key":"minute","value":"j"}]}]}"#,
    ];
    let mut answers: [BTreeMap<String, String>; 2] = Default::default();
    for (server, answers) in servers.iter().zip(answers.iter_mut()) {
        for (i, body) in bodies.iter().enumerate() {
            // Over the limit by the last calls: the answers then are 429s.
            for round in 0..8 {
                let (status, text) = post(&server.http_url("/json"), body).await;
                let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                answers.insert(
                    format!("/json body {i}, call {round}"),
                    format!("{status} {value}"),
                );
            }
        }
        let health = reqwest::get(server.http_url("/healthcheck")).await.unwrap();
        let status = health.status().as_u16();
        answers.insert(
            "/healthcheck".into(),
            format!("{status} {}", health.text().await.unwrap()),
        );
        let text = ratelimit_tests::sidecar::get_text(&server.debug_url("/rlconfig")).await;
        let mut lines: Vec<&str> = text.lines().collect();
        lines.sort_unstable();
        answers.insert("/rlconfig".into(), lines.join("\n"));
    }
    differences("http", &answers[0], &answers[1])
}

/// The error each logs for a rule file with an unknown unit: upstream's message about the
/// rule must be in the sidecar's log. The lines differ on purpose: the sidecar's names
/// the file by its path and the YAML path of the rule.
fn compare_bad_rule_file(upstream: &Path, redis: &Redis) -> usize {
    let bad = "domain: bad\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
    let logs = [Some(upstream), None].map(|binary| {
        let mut options = Options {
            files: vec![("bad.yaml", bad.to_owned())],
            binary: binary.map(Path::to_path_buf),
            ..Options::default()
        };
        options.env.extend(redis_env(redis.port));
        let server = Server::spawn(options);
        std::thread::sleep(Duration::from_secs(2));
        server.log()
    });
    let message = logs[0]
        .lines()
        .filter(|l| l.contains("fortnight"))
        .find_map(|l| l.split("bad.yaml: ").nth(1))
        .map(|m| m.split('"').next().unwrap_or(m).to_owned());
    let found = message.as_deref().is_some_and(|m| logs[1].contains(m));
    println!(
        "bad rule file: upstream logs {message:?}; the sidecar's log {}",
        if found { "has it" } else { "does not" }
    );
    if !found {
        println!("  the sidecar's log:\n{}", logs[1]);
    }
    usize::from(!found)
}

/// Exit codes for bad settings (within 10 s), upstream's and the sidecar's.
fn compare_exit_codes(upstream: &Path, redis: &Redis) -> usize {
    // Upstream exits 1 for these three, 2 for other bad settings; the sidecar 2 for all.
    const DELIBERATE: [&str; 3] = ["LOG_LEVEL", "CONFIG_TYPE", "BACKEND_TYPE"];
    let settings = [
        ("LOG_LEVEL", "loud"),
        ("CONFIG_TYPE", "SOMETHING"),
        ("BACKEND_TYPE", "floppy"),
        ("PORT", "eighty"),
        ("USE_STATSD", "maybe"),
        ("REDIS_POOL_SIZE", "-1x"),
        ("EXPIRATION_JITTER_MAX_SECONDS", "soon"),
    ];
    let mut n = 0;
    for (name, value) in settings {
        let codes = [Some(upstream), None].map(|binary| {
            let mut options = Options {
                binary: binary.map(Path::to_path_buf),
                ..Options::default()
            };
            options.env.extend(redis_env(redis.port));
            options.env.push((name, value.to_owned()));
            let mut server = Server::spawn(options);
            server.wait_exit(Duration::from_secs(10)).map(|s| s.code())
        });
        let deliberate = DELIBERATE.contains(&name);
        if codes[0] != codes[1] {
            println!(
                "  {name}={value}: upstream exits {:?}, the sidecar {:?}{}",
                codes[0],
                codes[1],
                if deliberate { " (deliberate)" } else { "" }
            );
            n += usize::from(!deliberate);
        }
    }
    println!(
        "exit codes: {} settings, {n} differences not listed as deliberate",
        settings.len()
    );
    n
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Some(upstream) = upstream_binary() else {
        return std::process::ExitCode::from(2);
    };
    let redis = Redis::start(&[]);
    let mut failed = 0;
    for sink in ["statsd", "dogstatsd", "prometheus"] {
        failed += compare_statistics(&upstream, &redis, sink).await;
    }
    failed += compare_http(&upstream, &redis).await;
    failed += compare_bad_rule_file(&upstream, &redis);
    failed += compare_exit_codes(&upstream, &redis);
    if failed == 0 {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}
