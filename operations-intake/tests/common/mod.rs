//! What the intake's end-to-end suites share: a broker with a topic, the intake on it,
//! and a rules file.
#![allow(dead_code)] // each suite uses some of them

use ratelimit_tests::intake::{Intake, Tansu};

pub async fn broker_with_topic(topic: &str, partitions: i32) -> Tansu {
    let tansu = Tansu::start();
    tansu.create_topic(topic, partitions).await;
    tansu
}

pub fn intake(tansu: &Tansu, topic: &str, extra: &[(&str, &str)]) -> Intake {
    let bootstrap = tansu.bootstrap();
    let mut env = vec![
        ("KAFKA_BOOTSTRAP_SERVERS", bootstrap.as_str()),
        ("KAFKA_TOPIC", topic),
    ];
    env.extend_from_slice(extra);
    Intake::start(&env)
}

/// A rules file: 10 operations per `unit` per client, of which 2 sells.
pub fn limits_file(unit: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("limits.yaml");
    let yaml = format!(
        "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {{unit: {unit}, requests_per_unit: 10}}\n    descriptors:\n      - key: operation\n        value: sell\n        rate_limit: {{unit: {unit}, requests_per_unit: 2}}\n"
    );
    std::fs::write(&rules, yaml).unwrap();
    (dir, rules)
}

/// A broker with `topic`, and the intake on it limited by [`limits_file`] of `unit`.
pub async fn limited_intake(
    topic: &str,
    unit: &str,
    extra: &[(&str, &str)],
) -> (Tansu, tempfile::TempDir, Intake) {
    let tansu = broker_with_topic(topic, 1).await;
    let (dir, rules) = limits_file(unit);
    let mut env = vec![("RATELIMIT_CONFIG", rules.to_str().unwrap())];
    env.extend_from_slice(extra);
    let service = intake(&tansu, topic, &env);
    (tansu, dir, service)
}

/// A broker with a one-partition `topic`, and the intake on it with `extra` settings.
pub async fn broker_and_intake(topic: &str, extra: &[(&str, &str)]) -> (Tansu, Intake) {
    let tansu = broker_with_topic(topic, 1).await;
    let service = intake(&tansu, topic, extra);
    (tansu, service)
}
