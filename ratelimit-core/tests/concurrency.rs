//! Concurrency limits: places taken by requests in flight, given back by each request's
//! refund, lapsing after the lease; in process, and planned as a remote store runs them.

use ratelimit_core::{Code, Config, Descriptor, Limiter, MemoryStore, Request, UnixMillis};

mod support;
use support::{NOW, limiter};

/// Two requests in flight per model, each place held for at most a minute.
const RULES: &str = "
domain: llm
descriptors:
  - key: model
    value: chat
    descriptors:
      - key: request_id
        rate_limit: {unit: minute, requests_per_unit: 2, algorithm: concurrency}
";

fn start(id: &str) -> Descriptor {
    Descriptor::new([("model", "chat"), ("request_id", id)])
}

fn ask(limiter: &Limiter, store: &MemoryStore, d: Descriptor, ms: u64) -> (Code, u32) {
    let request = Request::new("llm", vec![d]);
    let response = limiter
        .should_rate_limit(&request, store, UnixMillis(NOW * 1_000 + ms))
        .unwrap();
    (response.overall_code, response.statuses[0].limit_remaining)
}

#[test]
fn a_place_is_held_until_its_refund_and_a_refused_request_holds_none() {
    let (limiter, store) = (limiter(RULES), MemoryStore::default());
    assert_eq!(ask(&limiter, &store, start("a"), 0), (Code::Ok, 1));
    assert_eq!(ask(&limiter, &store, start("b"), 0), (Code::Ok, 0));
    assert_eq!(ask(&limiter, &store, start("c"), 0).0, Code::OverLimit);
    // The refused request's own refund frees nothing.
    ask(&limiter, &store, start("c").refunding(), 1);
    assert_eq!(ask(&limiter, &store, start("d"), 2).0, Code::OverLimit);
    // A check of 0 hits at the limit passes and takes nothing.
    assert_eq!(
        ask(&limiter, &store, start("e").with_hits(0), 2),
        (Code::Ok, 0)
    );
    ask(&limiter, &store, start("a").refunding(), 3);
    ask(&limiter, &store, start("a").refunding(), 3);
    assert_eq!(ask(&limiter, &store, start("d"), 4), (Code::Ok, 0));
    assert_eq!(ask(&limiter, &store, start("e"), 4).0, Code::OverLimit);
}

#[test]
fn a_place_never_given_back_lapses_after_the_lease() {
    let (limiter, store) = (limiter(RULES), MemoryStore::default());
    ask(&limiter, &store, start("lost-1"), 0);
    ask(&limiter, &store, start("lost-2"), 30_000);
    assert_eq!(ask(&limiter, &store, start("x"), 59_999).0, Code::OverLimit);
    assert_eq!(ask(&limiter, &store, start("x"), 60_000), (Code::Ok, 0));
    assert_eq!(ask(&limiter, &store, start("y"), 89_999).0, Code::OverLimit);
    assert_eq!(ask(&limiter, &store, start("y"), 90_000), (Code::Ok, 0));
}

#[test]
fn the_counter_key_leaves_the_request_out_and_the_plan_runs_on_any_store() {
    let limiter = limiter(RULES);
    let store = MemoryStore::default();
    let at = UnixMillis(NOW * 1_000);
    let plan = |d: Descriptor| limiter.plan(&Request::new("llm", vec![d]), at).unwrap();
    let first = plan(start("a"));
    let keys: Vec<&str> = first.increments().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(keys, ["llm_model_chat_request_id__cc60"]);
    let decide = |plan: ratelimit_core::Plan| {
        let totals: Vec<u64> = plan.increments().iter().map(|i| store.apply(i)).collect();
        plan.decide(&totals).overall_code
    };
    assert_eq!(decide(first), Code::Ok);
    assert_eq!(decide(plan(start("b"))), Code::Ok);
    assert_eq!(decide(plan(start("c"))), Code::OverLimit);
    assert_eq!(store.current(&plan(start("z")).increments()[0]), 2);
    decide(plan(start("b").refunding()));
    assert_eq!(decide(plan(start("c"))), Code::Ok);
}

#[test]
fn a_concurrency_limit_on_a_value_is_refused_by_name() {
    let yaml = RULES.replace(
        "- key: request_id",
        "- key: request_id\n        value: fixed",
    );
    let error = Config::from_yaml("r.yaml", &yaml).unwrap_err().to_string();
    assert_eq!(
        error,
        "r.yaml: descriptors[0].descriptors[0].value: a concurrency limit's entry 'request_id_fixed' takes no value: the request's value there names the request (Envoy's x-request-id)"
    );
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    assert_eq!(
        config.rule_using("concurrency").as_deref(),
        Some("llm.model_chat.request_id")
    );
    assert_eq!(config.rule_using("token_bucket"), None);
}
