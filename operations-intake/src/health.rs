//! `GET /health`: the application and its connection to the broker, in the original
//! service's shape (`app`, `status`, `kafka.status`, `kafka.bootstrap-servers`,
//! `kafka.topic`) with what this service adds (`kafka.bootstrap_servers`,
//! `kafka.partitions`, `kafka.reason`, `files`).

use std::collections::BTreeMap;

use serde::Serialize;
use warp::http::StatusCode;

use crate::answer::{Reply, json_reply};
use crate::files::LastLoad;
use crate::kafka::BrokerHealth;
use crate::routes::App;

/// The application's name, as the original service reported it.
pub const APP: &str = "operations-service";

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
