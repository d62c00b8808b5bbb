//! `POST /explain` on the debug listener: a request in the `/json` shape, answered with
//! why each descriptor would get its answer, and that answer, without counting anything.

use ratelimit_core::{Code, Explanation, Response};
use serde_json::{Map, Value, json};

use crate::backend::BackendError;
use crate::decider::{Decider, DecisionError};
use ratelimit_proto::json::parse_request;

/// The most descriptors one `/explain` request may carry: its answer is about 500 bytes a
/// descriptor, built on the debug thread while the caller waits.
pub const MAX_DESCRIPTORS: usize = 1_000;

/// The explanation of `body` as JSON, or the status and message of why there is none.
pub async fn explain(service: &Decider, body: &[u8]) -> Result<String, (u16, String)> {
    let request = parse_request(body).map_err(|e| (400, format!("Bad Request: {e}\n")))?;
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err((
            413,
            format!(
                "Payload Too Large: /explain takes at most {MAX_DESCRIPTORS} descriptors at a time; this request has {}\n",
                request.descriptors.len()
            ),
        ));
    }
    match service.explain(request).await {
        Ok((explanation, current, answer)) => Ok(render(&explanation, &current, &answer)),
        Err(DecisionError::Backend(e @ BackendError::Key(_))) => {
            Err((400, format!("Bad Request: {e}\n")))
        }
        Err(DecisionError::Backend(e)) => Err((500, format!("Internal Server Error: {e}\n"))),
        Err(e) => Err((400, format!("Bad Request: {e}\n"))),
    }
}

fn code(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::OverLimit => "OVER_LIMIT",
    }
}

/// Per descriptor: the rule met and how, the counter and its count now, and the status
/// the request would get; then the overall code.
pub fn render(explanation: &Explanation, current: &[u64], answer: &Response) -> String {
    let mut counters = explanation.increments().iter().zip(current);
    let descriptors: Vec<Value> = explanation
        .descriptors()
        .iter()
        .zip(&answer.statuses)
        .map(|(found, status)| {
            let mut out = Map::new();
            out.insert("outcome".into(), json!(found.outcome.as_str()));
            if let Some(rule) = &found.rule {
                out.insert("rule".into(), json!(rule));
            }
            let matched: Vec<Value> = found
                .matched
                .iter()
                .map(|m| json!({"key": m.key, "value": m.value, "match": m.how.as_str()}))
                .collect();
            out.insert("matched".into(), Value::Array(matched));
            out.insert("shadowMode".into(), json!(found.shadow));
            if let Some(limit) = &found.limit {
                let mut l = Map::new();
                l.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
                l.insert("unit".into(), json!(limit.unit.as_upper_str()));
                if let Some(name) = &limit.name {
                    l.insert("name".into(), json!(name.as_ref()));
                }
                out.insert("limit".into(), Value::Object(l));
            }
            if let Some(key) = &found.cache_key {
                out.insert("cacheKey".into(), json!(key));
                if let Some((counter, count)) = counters.next() {
                    out.insert("current".into(), json!(count));
                    out.insert("hits".into(), json!(counter.hits));
                }
            }
            out.insert("code".into(), json!(code(status.code)));
            out.insert("limitRemaining".into(), json!(status.limit_remaining));
            if let Some(reset) = status.duration_until_reset {
                out.insert("durationUntilReset".into(), json!(format!("{reset}s")));
            }
            Value::Object(out)
        })
        .collect();
    let body = json!({
        "overallCode": code(answer.overall_code),
        "descriptors": descriptors,
    });
    let mut text = serde_json::to_string_pretty(&body).expect("JSON values serialize");
    text.push('\n');
    text
}
