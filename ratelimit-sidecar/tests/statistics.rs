//! Statistics outputs on the real binary: statsd over UDP and TCP to a collector in the
//! test, DogStatsD with mogrifiers, Prometheus scraped and parsed, the log, and the bound
//! on names built from request data.

use ratelimit_tests::sidecar as support;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{Options, Server, ask, eventually, free_port, get_text, post};

const RULES: &str = "domain: s\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n  - key: detailed\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

/// Lines received by a statsd collector.
#[derive(Clone, Default)]
struct Collector {
    lines: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    /// A collector of the lines `receive` appends, on a thread of its own.
    fn receiving(receive: impl FnOnce(Arc<Mutex<Vec<String>>>) + Send + 'static) -> Collector {
        let collector = Collector::default();
        let lines = Arc::clone(&collector.lines);
        std::thread::spawn(move || receive(lines));
        collector
    }

    fn udp() -> (Collector, u16) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = socket.local_addr().unwrap().port();
        let collector = Collector::receiving(move |lines| {
            let mut buffer = [0u8; 65_536];
            while let Ok(n) = socket.recv(&mut buffer) {
                let text = String::from_utf8_lossy(&buffer[..n]).into_owned();
                lines
                    .lock()
                    .unwrap()
                    .extend(text.lines().map(str::to_owned));
            }
        });
        (collector, port)
    }

    fn tcp() -> (Collector, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let collector = Collector::receiving(move |lines| {
            for stream in listener.incoming().flatten() {
                let lines = Arc::clone(&lines);
                std::thread::spawn(move || {
                    for line in BufReader::new(stream).lines().map_while(Result::ok) {
                        lines.lock().unwrap().push(line);
                    }
                });
            }
        });
        (collector, port)
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Waits up to `timeout` for the counter `name` to sum to `expected`.
    async fn wait_for(&self, name: &str, expected: u64, timeout: Duration) {
        let reached = eventually(timeout, || async { self.counter(name) == expected }).await;
        assert!(
            reached,
            "{name}: {} of {expected}; {:?}",
            self.counter(name),
            self.lines()
        );
    }

    /// The sum of the `|c` lines of `name` (the text before `:`).
    fn counter(&self, name: &str) -> u64 {
        self.lines()
            .iter()
            .filter_map(|line| {
                let (head, kind) = line.split_once('|')?;
                let (metric, value) = head.rsplit_once(':')?;
                (metric == name && kind.starts_with('c')).then(|| value.parse::<u64>().ok())?
            })
            .sum()
    }
}

/// A server sending statsd lines to the collector on `port`, with `extra` settings.
fn to_collector(port: u16, extra: &[(&'static str, &str)]) -> Server {
    let port = port.to_string();
    let mut env = vec![("STATSD_HOST", "127.0.0.1"), ("STATSD_PORT", port.as_str())];
    env.extend_from_slice(extra);
    start(&env)
}

fn start(env: &[(&'static str, &str)]) -> Server {
    Server::start_with(Options {
        env: env.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        ..Options::rules(RULES)
    })
}

/// Three requests for one user (the third is over the limit of 2).
async fn traffic(server: &Server) {
    let mut client = server.client().await;
    for _ in 0..3 {
        ask(&mut client, "s", &[&[("user", "alice")]]).await;
    }
}

#[tokio::test]
async fn statsd_over_udp_receives_upstream_names_as_differences() {
    let (collector, port) = Collector::udp();
    let server = to_collector(
        port,
        &[
            ("USE_STATSD", "true"),
            ("STATSD_PROTOCOL", "udp"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
        ],
    );
    traffic(&server).await;
    let hits = "ratelimit.service.rate_limit.s.user.total_hits";
    collector.wait_for(hits, 3, Duration::from_secs(10)).await;
    // Every counter the collector summed is what the server counted.
    for name in [
        hits,
        "ratelimit.service.rate_limit.s.user.over_limit",
        "ratelimit.service.rate_limit.s.user.within_limit",
        "ratelimit.service.rate_limit.s.user.near_limit",
        "ratelimit_server.ShouldRateLimit.total_requests",
        "ratelimit.service.config_load_success",
    ] {
        assert_eq!(
            Some(collector.counter(name)),
            server.stat(name).await,
            "{name}"
        );
    }
    assert_eq!(
        collector.counter("ratelimit.service.rate_limit.s.user.over_limit"),
        1
    );
    // `/json` is not a gRPC call: upstream's interceptor does not count it.
    let body = r#"{"domain":"s","descriptors":[{"entries":[{"key":"user","value":"bob"}]}]}"#;
    post(&server.http_url("/json"), body).await;
    let stats = server.stats().await;
    assert_eq!(stats["ratelimit_server.ShouldRateLimit.total_requests"], 3);
    assert_eq!(stats["ratelimit.service.rate_limit.s.user.total_hits"], 4);
    let lines = collector.lines();
    assert!(
        lines.iter().any(
            |l| l.starts_with("ratelimit_server.ShouldRateLimit.response_time:")
                && l.contains("|ms")
        ),
        "{lines:?}"
    );
    // What upstream's runtime loader reports: one read of the rules, of one file.
    assert_eq!(collector.counter("runtime.load_attempts"), 1, "{lines:?}");
    assert!(
        lines.iter().any(|l| l == "runtime.num_values:1|g"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ratelimit.memory.counters:") && l.ends_with("|g")),
        "{lines:?}"
    );
    assert!(
        !lines.iter().any(|l| l.contains(":0|c")),
        "zero differences are not sent"
    );
}

#[tokio::test]
async fn statsd_over_tcp_is_the_default_and_the_last_flush_happens_at_shutdown() {
    let (collector, port) = Collector::tcp();
    let mut server = to_collector(
        port,
        &[
            ("USE_STATSD", "true"),
            ("STATS_FLUSH_INTERVAL", "1h"),
            ("EXTRA_TAGS", "env:ci,zone:a"),
        ],
    );
    traffic(&server).await;
    server.signal("TERM");
    let status = server.wait_exit(Duration::from_secs(15));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        server.log()
    );
    let name = "ratelimit.service.rate_limit.s.user.total_hits.__env=ci.__zone=a";
    collector.wait_for(name, 3, Duration::from_secs(5)).await;
}

#[tokio::test]
async fn dogstatsd_tags_come_from_extra_tags_and_mogrifiers() {
    let (collector, port) = Collector::udp();
    let server = to_collector(
        port,
        &[
            ("USE_DOG_STATSD", "true"),
            ("STATS_FLUSH_INTERVAL", "100ms"),
            ("EXTRA_TAGS", "env:ci"),
            ("USE_DOG_STATSD_MOGRIFIERS", "RULE"),
            (
                "DOG_STATSD_MOGRIFIER_RULE_PATTERN",
                r"^ratelimit\.service\.rate_limit\.([^.]+)\.(.+)\.(total_hits|over_limit)$",
            ),
            ("DOG_STATSD_MOGRIFIER_RULE_NAME", "ratelimit.rule.$3"),
            ("DOG_STATSD_MOGRIFIER_RULE_TAGS", "domain:$1,descriptor:$2"),
        ],
    );
    traffic(&server).await;
    let expected = "ratelimit.rule.over_limit:1|c|#env:ci,domain:s,descriptor:user";
    assert!(
        eventually(Duration::from_secs(10), || async {
            collector.lines().iter().any(|l| l == expected)
        })
        .await,
        "{:?}",
        collector.lines()
    );
    assert!(
        collector
            .lines()
            .iter()
            .any(|l| l.starts_with("ratelimit.service.config_load_success:1|c|#env:ci")),
        "names no mogrifier matches keep the extra tags: {:?}",
        collector.lines()
    );
}

#[tokio::test]
async fn prometheus_exports_the_default_mapping() {
    let port = free_port();
    let server = start(&[
        ("USE_PROMETHEUS", "true"),
        ("PROMETHEUS_ADDR", &format!("127.0.0.1:{port}")),
        ("EXTRA_TAGS", "env:ci"),
    ]);
    traffic(&server).await;
    let text = get_text(&format!("http://127.0.0.1:{port}/metrics")).await;
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_owned()))).unwrap();
    let value = |name: &str, labels: &[(&str, &str)]| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| s.value.clone())
    };
    use prometheus_parse::Value::{Counter, Gauge};
    let rule = [("domain", "s"), ("key1", "user"), ("env", "ci")];
    let requests = [("grpc_method", "ShouldRateLimit")];
    for (name, labels, expected) in [
        (
            "ratelimit_service_rate_limit_total_hits",
            &rule[..],
            Counter(3.0),
        ),
        (
            "ratelimit_service_rate_limit_over_limit",
            &rule[..],
            Counter(1.0),
        ),
        // The configured limit of every rule, with its window.
        ("ratelimit_service_rate_limit_limit", &rule[..], Gauge(2.0)),
        (
            "ratelimit_service_rate_limit_window_seconds",
            &rule[..],
            Gauge(3600.0),
        ),
        (
            "ratelimit_service_total_requests",
            &requests[..],
            Counter(3.0),
        ),
    ] {
        assert_eq!(value(name, labels), Some(expected), "{name}\n{text}");
    }
    match value(
        "ratelimit_service_response_time_seconds",
        &[("grpc_method", "ShouldRateLimit")],
    ) {
        Some(prometheus_parse::Value::Histogram(buckets)) => {
            assert_eq!(buckets.last().map(|b| b.count), Some(3.0), "{buckets:?}");
        }
        other => panic!("no response-time histogram: {other:?}\n{text}"),
    }
    let missing = reqwest::get(format!("http://127.0.0.1:{port}/other"))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn a_bad_mapping_file_stops_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let mapping = dir.path().join("mapping.yaml");
    std::fs::write(&mapping, "mappings:\n- match: a.*\n  nmae: x\n").unwrap();
    let log = Server::refused(Options {
        env: vec![
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
            ("PROMETHEUS_MAPPER_YAML", mapping.display().to_string()),
        ],
        ..Options::rules(RULES)
    });
    assert!(
        log.contains("PROMETHEUS_MAPPER_YAML") && log.contains("nmae"),
        "{log}"
    );
}

#[tokio::test]
async fn without_a_sink_statistics_are_logged_at_debug_level() {
    let server = start(&[("STATS_FLUSH_INTERVAL", "100ms")]);
    traffic(&server).await;
    assert!(
        eventually(Duration::from_secs(10), || async {
            let log = server.log();
            log.contains("flushing counter")
                && log.contains("ratelimit.service.rate_limit.s.user.total_hits")
        })
        .await,
        "{}",
        server.log()
    );
}

#[tokio::test]
async fn names_from_requests_fold_into_overflow_past_max_stat_keys() {
    let server = start(&[("MAX_STAT_KEYS", "50")]);
    let mut client = server.client().await;
    for i in 0..120 {
        let _ = ask(&mut client, &format!("unknown{i}"), &[&[("user", "x")]]).await;
        let _ = ask(&mut client, "s", &[&[("detailed", &format!("v{i}"))]]).await;
    }
    let kept_domains = server
        .stat("ratelimit.service.rate_limit.unknown0.domain_not_found")
        .await;
    assert_eq!(kept_domains, Some(1));
    let stats = server.stats().await;
    assert!(
        !stats.contains_key("ratelimit.service.rate_limit.unknown119.domain_not_found"),
        "{stats:?}"
    );
    let folded_domains = server
        .stat("ratelimit.service.rate_limit._overflow.domain_not_found")
        .await
        .unwrap();
    let folded_values = server
        .stat("ratelimit.service.rate_limit.s.detailed_overflow.total_hits")
        .await
        .unwrap();
    assert_eq!(folded_domains + folded_values, 240 - 50);
    assert_eq!(
        server.stat("ratelimit.service.stats_overflow").await,
        Some(240 - 50)
    );
}
