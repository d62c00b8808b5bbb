//! What the limits tell a client, end to end on a real broker (tansu): the draft-11
//! `RateLimit` and `RateLimit-Policy` fields on every answer the limits decided, and the
//! domain checks that refuse a batch before the limits count it.

use ratelimit_tests::intake as support;
use ratelimit_tests::sf_list;

use support::{batch, operation, post, read_topic};

mod common;

use common::limited_intake;

#[tokio::test(flavor = "multi_thread")]
async fn draft_11_headers_list_every_limit_that_applied() {
    let format = [("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf-draft-11")];
    let (_tansu, _rules, service) = limited_intake("drafted", "hour", &format).await;
    let params = |list: &[(String, Vec<(String, i64)>)]| -> Vec<Vec<(String, i64)>> {
        list.iter().map(|(_, p)| p.clone()).collect()
    };
    let p = |pairs: &[(&str, i64)]| -> Vec<(String, i64)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    };
    let buys = post(&service, &batch("buy", 4), &[("x-client-id", "d")]).await;
    assert_eq!(buys.status, 202, "{}", buys.body);
    assert_eq!(buys.header("ratelimit-limit"), None, "not the other format");
    let policy = sf_list(buys.header("ratelimit-policy").unwrap());
    assert_eq!(params(&policy), [p(&[("q", 10), ("w", 3600)])]);
    let current = sf_list(buys.header("ratelimit").unwrap());
    assert_eq!(current[0].0, policy[0].0, "the one that decided");
    assert_eq!(current[0].1[0], ("r".to_owned(), 6));
    let sells = post(&service, &batch("sell", 3), &[("x-client-id", "d")]).await;
    assert_eq!(sells.status, 429, "{}", sells.body);
    let policy = sf_list(sells.header("ratelimit-policy").unwrap());
    assert_eq!(
        params(&policy),
        [p(&[("q", 10), ("w", 3600)]), p(&[("q", 2), ("w", 3600)])]
    );
    let current = sf_list(sells.header("ratelimit").unwrap());
    assert_eq!(current[0].0, policy[1].0, "the sell limit decided");
    assert_eq!(current[0].1[0], ("r".to_owned(), 0));
}

/// A `RateLimit-Policy` member: its name, `q` and `w`.
type Policy = (String, i64, i64);

/// The draft-11 fields of an answer, parsed as Structured Field lists: each policy's
/// name with `q` and `w`, and the deciding one's name with `r` (what remains).
fn draft_11(answer: &support::Answer) -> (Vec<Policy>, (String, i64)) {
    let param = |params: &[(String, i64)], name: &str| {
        let found = params.iter().find(|(k, _)| k == name);
        found.unwrap_or_else(|| panic!("no {name} in {params:?}")).1
    };
    let fields = || format!("{} {:?}: {}", answer.status, answer.headers, answer.body);
    let policy = answer
        .header("ratelimit-policy")
        .unwrap_or_else(|| panic!("no RateLimit-Policy: {}", fields()));
    let current = answer
        .header("ratelimit")
        .unwrap_or_else(|| panic!("no RateLimit: {}", fields()));
    let policies = sf_list(policy)
        .into_iter()
        .map(|(name, params)| {
            let (q, w) = (param(&params, "q"), param(&params, "w"));
            (name, q, w)
        })
        .collect();
    let mut current = sf_list(current);
    assert_eq!(current.len(), 1, "one limit decides: {}", fields());
    let (name, params) = current.remove(0);
    assert!(param(&params, "t") > 0, "{}", fields());
    (policies, (name.clone(), param(&params, "r")))
}

/// Once the limits counted a batch, the answer says where they stand, whatever comes of
/// the batch after: accepted, refused by the broker as too large (413) or not
/// acknowledged (503), in the service's JSON and in problem details alike.
#[tokio::test(flavor = "multi_thread")]
async fn draft_11_headers_ride_every_answer_the_limits_decided() {
    let env = [
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf-draft-11"),
        // The producer refuses a message over 2000 bytes; the body limit is far above.
        ("KAFKA_PROPERTIES", "message.max.bytes=2000"),
        ("KAFKA_DELIVERY_TIMEOUT", "3s"),
    ];
    let (tansu, _rules, service) = limited_intake("decided", "hour", &env).await;
    let client = [("x-client-id", "e")];
    let padded = format!("[{}{}]", operation("buy", "1", 1), " ".repeat(3000));
    let problem = [("x-client-id", "e"), ("accept", "application/problem+json")];

    let accepted = post(&service, &batch("buy", 1), &client).await;
    assert_eq!(accepted.status, 202, "{}", accepted.body);
    let (policies, decided) = draft_11(&accepted);
    assert_eq!(policies.len(), 1, "{policies:?}");
    assert_eq!((policies[0].1, policies[0].2), (10, 3600));
    assert_eq!(decided, (policies[0].0.clone(), 9));

    let too_large = post(&service, &padded, &client).await;
    assert_eq!(too_large.status, 413, "{}", too_large.body);
    assert_eq!(too_large.body["error"], "Request too large.");
    assert_eq!(draft_11(&too_large).1.1, 8, "the batch was counted");

    let as_problem = post(&service, &padded, &problem).await;
    assert_eq!(as_problem.status, 413, "{}", as_problem.body);
    assert_eq!(
        as_problem.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(draft_11(&as_problem).1.1, 7);

    // A frozen broker: the batch goes out before the probe notices, and times out.
    tansu.pause();
    let unacknowledged = post(&service, &batch("buy", 1), &client).await;
    tansu.resume();
    assert_eq!(unacknowledged.status, 503, "{}", unacknowledged.body);
    assert_eq!(unacknowledged.body["error"], "Operations not acknowledged.");
    assert_eq!(draft_11(&unacknowledged).1.1, 6);
}

/// MAX_UNIT_COST_DECIMALS and REJECT_OVERSELL refuse a batch (400) at the field at
/// fault, before it counts against any limit; nothing is produced.
#[tokio::test(flavor = "multi_thread")]
async fn domain_checks_refuse_at_the_field_at_fault() {
    let env = [
        ("MAX_UNIT_COST_DECIMALS", "2"),
        ("REJECT_OVERSELL", "true"),
        ("LIMIT_RESPONSE_HEADERS_FORMAT", "ietf-draft-11"),
    ];
    let (tansu, _rules, service) = limited_intake("checked", "hour", &env).await;
    let client = ("x-client-id", "f");
    let problem = ("accept", "application/problem+json");
    let located = |answer: &support::Answer| -> Vec<(u64, String, String)> {
        assert_eq!(answer.status, 400, "{}", answer.body);
        assert_eq!(answer.body["error"], "Invalid request.");
        let errors = answer.body["errors"].as_array().unwrap();
        errors
            .iter()
            .map(|e| {
                let text = |name: &str| e[name].as_str().unwrap().to_owned();
                (e["index"].as_u64().unwrap(), text("field"), text("message"))
            })
            .collect()
    };

    let fine = format!("[{}]", operation("buy", "10.125", 1));
    let found = located(&post(&service, &fine, &[client]).await);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0, found[0].1.as_str()), (0, "unit-cost"));
    assert!(found[0].2.contains("at most 2 decimal places"), "{found:?}");
    let as_problem = post(&service, &fine, &[client, problem]).await;
    assert_eq!(as_problem.status, 400, "{}", as_problem.body);
    assert_eq!(as_problem.body["errors"][0]["pointer"], "#/0/unit-cost");

    let short = format!(
        "[{},{},{},{}]",
        operation("buy", "10.10", 5),
        operation("sell", "10.100", 3),
        operation("sell", "11", 3),
        operation("sell", "12", 9)
    );
    let found = located(&post(&service, &short, &[client]).await);
    assert_eq!(found.len(), 1, "only the first short sale: {found:?}");
    assert_eq!((found[0].0, found[0].1.as_str()), (2, "quantity"));
    assert!(
        found[0].2.contains("sells 3 units when the batch holds 2"),
        "{found:?}"
    );
    let as_problem = post(&service, &short, &[client, problem]).await;
    assert_eq!(as_problem.body["errors"][0]["pointer"], "#/2/quantity");
    let alone = post(
        &service,
        &format!("[{}]", operation("sell", "1", 1)),
        &[client, problem],
    )
    .await;
    assert_eq!(
        alone.body["errors"][0]["pointer"], "#/0/quantity",
        "a position starts at zero: {}",
        alone.body
    );

    // Refused before the limits: both sells of the limit of 2 an hour are still there.
    let even = format!(
        "[{},{},{}]",
        operation("buy", "12.5e-1", 2),
        operation("sell", "100e-3", 1),
        operation("sell", "1", 1)
    );
    let good = post(&service, &even, &[client]).await;
    assert_eq!(good.status, 202, "{}", good.body);
    let (policies, (decided, remaining)) = draft_11(&good);
    let sells = policies
        .iter()
        .find(|(name, _, _)| *name == decided)
        .unwrap();
    assert_eq!((sells.1, remaining), (2, 0), "{policies:?}");
    let records = read_topic(&tansu.bootstrap(), "checked");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].value, even.as_bytes());
}
