//! `GET /health`: the application and its connection to the broker, in the original
//! service's shape (`app`, `status`, `kafka.status`, `kafka.bootstrap-servers`,
//! `kafka.topic`) with what this service adds (`kafka.bootstrap_servers`,
//! `kafka.partitions`, `kafka.reason`, `files`).
//!
//! And the probes of an orchestrator: `GET /health/live` (the process serves) and
//! `GET /health/ready` (every dependency a batch needs answers).

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::json;
use warp::http::StatusCode;

use crate::answer::{Reply, json_reply};
use crate::app::App;
use crate::files::LastLoad;
use crate::kafka::BrokerHealth;

/// The application's name, as the original service reported it.
pub const APP: &str = "operations-service";

/// The health routes: answered past `HTTP_MAX_CONNECTIONS` too, from the listener's
/// reserve, so that clients holding every connection do not keep a probe unanswered.
pub const PATHS: &[&str] = &["/health", "/health/live", "/health/ready"];

/// The broker as `/health` shows it.
#[derive(Serialize)]
struct Kafka<'a> {
    /// `connected` or `disconnected`.
    status: &'static str,
    /// The bootstrap servers, under the original's name…
    #[serde(rename = "bootstrap-servers")]
    bootstrap: &'a str,
    /// …and under this service's.
    bootstrap_servers: &'a str,
    topic: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
}

impl<'a> Kafka<'a> {
    fn new(health: &'a BrokerHealth) -> Kafka<'a> {
        Kafka {
            status: if health.is_up() {
                "connected"
            } else {
                "disconnected"
            },
            bootstrap: &health.bootstrap_servers,
            bootstrap_servers: &health.bootstrap_servers,
            topic: &health.topic,
            partitions: health.partitions,
            reason: health.reason.as_deref(),
        }
    }
}

/// `GET /health`: 200 `up` while the broker answers for the topic, else 503 `down`.
pub fn health(app: &App) -> Reply {
    #[derive(Serialize)]
    struct Health<'a> {
        app: &'static str,
        status: &'static str,
        kafka: Kafka<'a>,
        /// The last load of each followed file.
        #[serde(skip_serializing_if = "BTreeMap::is_empty")]
        files: BTreeMap<&'static str, LastLoad>,
    }
    let broker = app.kafka.health();
    let (status, code) = if broker.is_up() {
        ("up", StatusCode::OK)
    } else {
        ("down", StatusCode::SERVICE_UNAVAILABLE)
    };
    let files = app
        .files
        .iter()
        .filter_map(|(name, file)| Some((*name, file.last()?)))
        .collect();
    json_reply(
        code,
        &Health {
            app: APP,
            status,
            kafka: Kafka::new(&broker),
            files,
        },
    )
}

/// `GET /health/live`: 200 while the process serves requests.
pub fn live() -> Reply {
    json_reply(StatusCode::OK, &json!({"app": APP, "status": "up"}))
}

/// One readiness check's outcome.
#[derive(Serialize)]
struct Check {
    /// `up` or `down`.
    status: &'static str,
    /// Why it is down.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl Check {
    fn from(outcome: Result<(), String>) -> Check {
        match outcome {
            Ok(()) => Check {
                status: "up",
                reason: None,
            },
            Err(reason) => Check {
                status: "down",
                reason: Some(reason),
            },
        }
    }
}

/// `GET /health/ready`: 200 when the broker answered the last metadata request for the
/// topic, every followed file (keys, rules) has a version in use, and the idempotency
/// store answers when it is Redis; else 503. `checks` has each outcome, `failed` names
/// those that are down.
pub async fn ready(app: &App) -> Reply {
    let mut checks = BTreeMap::new();
    let broker = app.kafka.health();
    let kafka = match &broker.reason {
        _ if broker.is_up() => Ok(()),
        Some(reason) => Err(reason.clone()),
        None => Err("down".to_owned()),
    };
    checks.insert("kafka", Check::from(kafka));
    for (name, file) in &app.files {
        let loaded = if file.loaded() {
            Ok(())
        } else {
            Err("no version of the file is loaded".to_owned())
        };
        checks.insert(name, Check::from(loaded));
    }
    if let Some(answered) = app.idempotency.check().await {
        checks.insert("idempotency", Check::from(answered));
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|(_, check)| check.status == "down")
        .map(|(name, _)| *name)
        .collect();
    let (status, code) = if failed.is_empty() {
        ("up", StatusCode::OK)
    } else {
        ("down", StatusCode::SERVICE_UNAVAILABLE)
    };
    json_reply(
        code,
        &json!({"app": APP, "status": status, "checks": checks, "failed": failed}),
    )
}
