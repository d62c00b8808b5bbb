//! The sidecar as Envoy AI Gateway deploys its quota rate limit service: the
//! environment of its `envoy-ai-gateway-ratelimit` Deployment (rules over xDS from the
//! controller, node id `envoy-ai-gateway-ratelimit`, Redis), the `ai-gateway-quota`
//! domain as its translator writes it (`backend_name` → `model_name_override`, quota
//! mode), and a real Envoy configured as its extension server configures a route
//! (`ai_gateway.yaml`): a zero-cost check of every candidate backend on the request, and
//! the cost the backend reports charged to it when the stream ends. With the sidecar's
//! dynamic metadata on, Envoy routes to a backend whose quota is left.

use std::time::Duration;

use ratelimit_core::Config;
use ratelimit_proto::xds::from_domain;
use ratelimit_tests::envoy::start_envoy_with;
use ratelimit_tests::sidecar::{Options, Redis, Server, eventually, free_port};
use ratelimit_xds_example::{ControlPlane, Snapshot};
use warp::Filter;

/// The domain as AI Gateway's translator publishes it for a QuotaPolicy giving each of
/// two backends 10 tokens a minute per model, with the `metadata` quota-aware routing
/// reads (AI Gateway's translator writes none; envoyproxy/ratelimit's example does).
const RULES: &str = "domain: ai-gateway-quota
descriptors:
  - key: backend_name
    value: default/backend-a
    descriptors:
      - key: model_name_override
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 10}
        metadata: {backend: a}
  - key: backend_name
    value: default/backend-b
    descriptors:
      - key: model_name_override
        quota_mode: true
        rate_limit: {unit: minute, requests_per_unit: 10}
        metadata: {backend: b}
";

/// A backend answering with the cost the request asks for (`x-cost` → `x-usage`), its
/// own name (`x-backend`) and the model (`x-model`), as AI Gateway's filter would report
/// them when the response ends.
async fn backend(name: &'static str) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let route = warp::header::<String>("x-cost")
        .and(warp::header::<String>("x-model"))
        .map(move |cost: String, model: String| {
            let reply = warp::reply::with_header(format!("answered by {name}\n"), "x-usage", cost);
            let reply =
                warp::reply::with_header(reply, "x-backend", format!("default/backend-{name}"));
            warp::reply::with_header(reply, "x-model", model)
        });
    tokio::spawn(warp::serve(route).incoming(listener).run());
    port
}

/// The tokens counted over every counter in Redis.
fn counted(redis: &Redis) -> u64 {
    redis
        .keys()
        .iter()
        .map(|key| redis.cli(&["GET", key]).parse::<u64>().unwrap_or(0))
        .sum()
}

/// Asks for `model` at `cost` through Envoy; the status and the backend that answered.
async fn ask(port: u16, model: &str, cost: u64) -> (u16, String) {
    let response = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header("x-model", model)
        .header("x-cost", cost.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let backend = response
        .headers()
        .get("x-backend")
        .map_or("", |v| v.to_str().unwrap())
        .to_owned();
    (status, backend)
}

/// Waits until the stream-end charges add up to `tokens`.
async fn charged(redis: &Redis, tokens: u64) {
    let reached = eventually(Duration::from_secs(10), || async {
        counted(redis) == tokens
    })
    .await;
    assert!(reached, "{} tokens counted, not {tokens}", counted(redis));
}

/// The sidecar with the environment of AI Gateway's rate limit Deployment (the xDS
/// server's address and the Redis URL are the test's), and dynamic metadata on.
fn sidecar(xds_port: u16, redis: &Redis, root: &std::path::Path) -> Server {
    let env = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        (
            "CONFIG_GRPC_XDS_NODE_ID",
            "envoy-ai-gateway-ratelimit".to_owned(),
        ),
        // ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002 there.
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("127.0.0.1:{xds_port}"),
        ),
        ("REDIS_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_URL", format!("127.0.0.1:{}", redis.port)),
        ("RUNTIME_ROOT", root.join("data").display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("LOG_LEVEL", "debug".to_owned()),
        ("BACKEND_TYPE", "redis".to_owned()),
        ("RESPONSE_DYNAMIC_METADATA", "true".to_owned()),
    ];
    Server::start_with(Options {
        env: env.into(),
        ..Options::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_backend_sends_traffic_to_the_next_and_both_spent_refuse() {
    // The budgets are per minute: the whole run in one.
    ratelimit_tests::within_one_minute(20).await;
    let plane = ControlPlane::default();
    let config = Config::from_files([("quota.yaml", RULES)], false).unwrap();
    let resources: Vec<_> = config
        .domains()
        .iter()
        .map(|d| from_domain(&d.domain, d).0)
        .collect();
    plane.publish(Snapshot::of("1", &resources));
    let xds_port = free_port();
    let service = plane.service();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve(([127, 0, 0, 1], xds_port).into()),
    );
    let (redis, root) = (Redis::start(&[]), tempfile::tempdir().unwrap());
    let server = sidecar(xds_port, &redis, root.path());
    let acked = eventually(Duration::from_secs(10), || async {
        plane.acknowledged("envoy-ai-gateway-ratelimit", "1")
    })
    .await;
    assert!(acked, "the rules were not acknowledged:\n{}", server.log());

    let (a, b) = (backend("a").await, backend("b").await);
    let more = [
        ("BACKEND_A_PORT", a.to_string()),
        ("BACKEND_B_PORT", b.to_string()),
    ];
    let envoy = start_envoy_with(
        "../tests/tests/ai_gateway.yaml",
        a,
        server.grpc,
        false,
        &more,
    );
    // backend-a first while its 10 tokens last (6, then 12: the check at 6 passes).
    let mut spent = 0;
    for (expected, cost) in [
        ("default/backend-a", 6),
        ("default/backend-a", 6),
        ("default/backend-b", 6),
        ("default/backend-b", 6),
    ] {
        assert_eq!(
            ask(envoy.port, "gpt-4o", cost).await,
            (200, expected.to_owned()),
            "{}",
            server.log()
        );
        spent += cost;
        charged(&redis, spent).await;
    }
    // Both spent for this model: refused, and nothing is charged.
    assert_eq!(ask(envoy.port, "gpt-4o", 6).await.0, 429);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(counted(&redis), spent);
    // Another model has budgets of its own: backend-a again.
    assert_eq!(
        ask(envoy.port, "gpt-4o-mini", 1).await,
        (200, "default/backend-a".to_owned())
    );
}
