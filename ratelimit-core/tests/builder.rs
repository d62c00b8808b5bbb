//! Rules built in code: the same `Config` and the same errors as YAML, and YAML written
//! from any configuration loads back to the same rules.

use std::collections::BTreeMap;

use proptest::prelude::*;
use ratelimit_core::config::{Domain, Metadata, RateLimit, Rule};
use ratelimit_core::{Algorithm, Config, ConfigError, ConfigErrorKind, Unit};

/// Every rule feature, written once as YAML and once in code.
const EVERY_FEATURE: &str = r#"
domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
  - key: route
    value: /admin
    shadow_mode: true
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: 10, algorithm: sliding_window, name: admin}
  - key: path
    value: /v1/*
    share_threshold: true
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000, replaces: [{name: admin}]}
  - key: tenant
    detailed_metric: true
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: burst}
      - {unit: day, requests_per_unit: 10000}
  - key: internal
    value_to_metric: true
    rate_limit: {unlimited: true}
    metadata: {team: core, weight: 2}
  - key: model
    value: chat
    descriptors:
      - key: request_id
        rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 4, algorithm: concurrency}
  - key: health
"#;

fn every_feature_in_code() -> Domain {
    let metadata = Metadata::Map(BTreeMap::from([
        ("team".to_owned(), Metadata::String("core".into())),
        ("weight".to_owned(), Metadata::Number(2.0)),
    ]));
    Domain::new("api")
        .rule(
            Rule::key("api_key").limit(RateLimit::per(Unit::Minute, 100).token_bucket().burst(20)),
        )
        .rule(
            Rule::key("route").value("/admin").shadow_mode().child(
                Rule::key("user").limit(
                    RateLimit::per(Unit::Second, 5)
                        .unit_multiplier(10)
                        .sliding_window()
                        .name("admin"),
                ),
            ),
        )
        .rule(
            Rule::key("path")
                .value("/v1/*")
                .share_threshold()
                .quota_mode()
                .limit(RateLimit::per(Unit::Hour, 1000).replaces("admin")),
        )
        .rule(Rule::key("tenant").detailed_metric().limits([
            RateLimit::per(Unit::Second, 10).name("burst"),
            RateLimit::per(Unit::Day, 10_000),
        ]))
        .rule(
            Rule::key("internal")
                .value_to_metric()
                .limit(RateLimit::unlimited())
                .metadata(metadata),
        )
        .rule(
            Rule::key("model").value("chat").child(
                Rule::key("request_id").limit(
                    RateLimit::per(Unit::Minute, 4)
                        .unit_multiplier(5)
                        .concurrency(),
                ),
            ),
        )
        .rule(Rule::key("health"))
}

#[test]
fn rules_in_code_are_the_rules_of_their_yaml() {
    let from_yaml = Config::from_yaml("api.yaml", EVERY_FEATURE).unwrap();
    let in_code = every_feature_in_code().build().unwrap();
    assert_eq!(in_code, from_yaml);
    let written = Config::from_files(in_code.to_yaml_files(), false).unwrap();
    assert_eq!(written, from_yaml);
}

/// `(path, kind)` of the first error, which the line and column aside must be the same
/// from code and from hand-written YAML.
fn first_error(result: Result<Config, ConfigError>) -> (String, String, ConfigErrorKind) {
    let error = result.expect_err("the rules are invalid");
    (error.file, error.path, error.kind)
}

#[test]
fn every_error_rules_in_code_can_make_is_the_yaml_loaders() {
    let per_minute = || RateLimit::per(Unit::Minute, 1);
    let cases: Vec<(Domain, &str)> = vec![
        (Domain::new(""), "domain: ''"),
        (
            Domain::new("d").rule(Rule::key("")),
            "domain: d\ndescriptors: [{key: ''}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a")).rule(Rule::key("a")),
            "domain: d\ndescriptors: [{key: a}, {key: a}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limit(per_minute().unit_multiplier(0))),
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1, unit_multiplier: 0}}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limit(per_minute().burst(3))),
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1, burst: 3}}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limit(per_minute()).limits([per_minute()])),
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1}, rate_limits: [{unit: minute, requests_per_unit: 1}]}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limits([RateLimit::unlimited()])),
            "domain: d\ndescriptors: [{key: a, rate_limits: [{unlimited: true}]}]",
        ),
        (
            Domain::new("d")
                .rule(Rule::key("a").limits([per_minute().name("n"), per_minute().name("n")])),
            "domain: d\ndescriptors: [{key: a, rate_limits: [{unit: minute, requests_per_unit: 1, name: n}, {unit: minute, requests_per_unit: 1, name: n}]}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limit(per_minute().replaces(""))),
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1, replaces: [{name: ''}]}}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").limit(per_minute().name("n").replaces("n"))),
            "domain: d\ndescriptors: [{key: a, rate_limit: {unit: minute, requests_per_unit: 1, name: n, replaces: [{name: n}]}}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").value("x").share_threshold()),
            "domain: d\ndescriptors: [{key: a, value: x, share_threshold: true}]",
        ),
        (
            Domain::new("d").rule(Rule::key("a").child(Rule::key("b")).child(Rule::key("b"))),
            "domain: d\ndescriptors: [{key: a, descriptors: [{key: b}, {key: b}]}]",
        ),
    ];
    for (domain, yaml) in cases {
        let name = domain.source_name();
        assert_eq!(
            first_error(domain.build()),
            first_error(Config::from_yaml(&name, yaml)),
            "{yaml}"
        );
    }
}

#[test]
fn rules_nested_too_deep_are_refused_as_in_a_file() {
    let deep = (0..60).fold(Rule::key("leaf"), |inner, i| {
        Rule::key(format!("k{i}")).child(inner)
    });
    let domain = Domain::new("d").rule(deep);
    let error = domain.build().unwrap_err();
    assert_eq!(error.kind, ConfigErrorKind::TooDeep(100));
    assert_eq!(Config::from_yaml("d.yaml", &domain.to_yaml()), Err(error));
}

#[test]
fn a_domain_given_twice_is_refused_unless_merged() {
    let a = Domain::new("d").rule(Rule::key("a"));
    let b = Domain::new("d").rule(Rule::key("b")).source("more.yaml");
    let error = Config::from_domains(&[a.clone(), b.clone()], false).unwrap_err();
    assert_eq!(
        (error.file.as_str(), error.path.as_str()),
        ("more.yaml", "domain")
    );
    assert_eq!(error.kind, ConfigErrorKind::DuplicateDomain("d".into()));
    let merged = Config::from_domains(&[a.clone(), b.clone()], true).unwrap();
    assert_eq!(merged.domains()[0].descriptors.len(), 2);
    let files = [
        (a.source_name(), a.to_yaml()),
        (b.source_name(), b.to_yaml()),
    ];
    assert_eq!(Config::from_files(files, true), Ok(merged));
}

fn limit() -> impl Strategy<Value = RateLimit> {
    let algorithm = prop_oneof![
        Just(None),
        Just(Some(Algorithm::FixedWindow)),
        Just(Some(Algorithm::SlidingWindow)),
        (0u32..5).prop_map(|burst| Some(Algorithm::TokenBucket { burst })),
    ];
    let counted = (
        0usize..Unit::ALL.len(),
        0u32..50,
        proptest::option::weighted(0.3, 0u32..3),
        algorithm,
        proptest::option::weighted(0.1, 0u32..5),
        proptest::option::weighted(0.3, prop_oneof![Just("n1"), Just("n2")]),
        proptest::collection::vec(prop_oneof![Just("n1"), Just("n2"), Just("")], 0..2),
    )
        .prop_map(
            |(unit, rpu, multiplier, algorithm, burst, name, replaces)| {
                let mut limit = RateLimit::per(Unit::ALL[unit], rpu);
                if let Some(m) = multiplier {
                    limit = limit.unit_multiplier(m);
                }
                if let Some(a) = algorithm {
                    limit = limit.algorithm(a);
                }
                if let Some(b) = burst {
                    limit = limit.burst(b);
                }
                if let Some(n) = name {
                    limit = limit.name(n);
                }
                replaces.into_iter().fold(limit, RateLimit::replaces)
            },
        );
    prop_oneof![9 => counted, 1 => Just(RateLimit::unlimited())]
}

fn metadata() -> impl Strategy<Value = Metadata> {
    prop_oneof![
        Just(Metadata::Null),
        any::<bool>().prop_map(Metadata::Bool),
        (-1000i32..1000).prop_map(|n| Metadata::Number(f64::from(n) / 4.0)),
        "[a-z0-9 ]{0,5}".prop_map(Metadata::String),
        proptest::collection::vec("[a-z]{1,3}".prop_map(Metadata::String), 0..3)
            .prop_map(Metadata::List),
    ]
}

fn leaf() -> impl Strategy<Value = Rule> {
    let value = prop_oneof![
        3 => Just(None),
        1 => Just(Some("x")),
        1 => Just(Some("1")),
        1 => Just(Some("y*")),
        1 => Just(Some("true")),
        1 => Just(Some("")),
    ];
    (
        prop_oneof![Just("a"), Just("b"), Just("c"), Just("1"), Just("")],
        value,
        proptest::option::weighted(0.6, limit()),
        proptest::collection::vec(limit(), 0..3),
        proptest::collection::vec(proptest::bool::weighted(0.15), 5),
        proptest::option::weighted(0.1, metadata()),
    )
        .prop_map(|(key, value, one, several, flags, metadata)| {
            let mut rule = Rule::key(key);
            if let Some(v) = value {
                rule = rule.value(v);
            }
            // A rule with both is an error; keep most rules valid.
            let (has_limit, both) = (one.is_some(), one.is_some() && several.len() == 2);
            if let Some(limit) = one {
                rule = rule.limit(limit);
            }
            if !has_limit || both {
                rule = rule.limits(several);
            }
            let setters = [
                Rule::shadow_mode,
                Rule::quota_mode,
                Rule::detailed_metric,
                Rule::value_to_metric,
                Rule::share_threshold,
            ];
            for (set, setter) in flags.into_iter().zip(setters) {
                if set {
                    rule = setter(rule);
                }
            }
            match metadata {
                Some(m) => rule.metadata(m),
                None => rule,
            }
        })
}

fn rule() -> impl Strategy<Value = Rule> {
    leaf().prop_recursive(3, 12, 3, |inner| {
        (leaf(), proptest::collection::vec(inner, 0..3))
            .prop_map(|(rule, children)| children.into_iter().fold(rule, Rule::child))
    })
}

fn domain() -> impl Strategy<Value = Domain> {
    (
        prop_oneof![9 => Just("api"), 1 => Just("")],
        proptest::collection::vec(rule(), 0..4),
    )
        .prop_map(|(name, rules)| rules.into_iter().fold(Domain::new(name), Domain::rule))
}

proptest! {
    /// Any rules built in code give what their YAML gives: the same configuration, or
    /// the same errors (file, path, message, line and column); and any configuration
    /// written out as YAML loads back to itself.
    #[test]
    fn rules_in_code_and_their_yaml_agree(domain in domain()) {
        let in_code = domain.check();
        let from_yaml = Config::check_files([(domain.source_name(), domain.to_yaml())], false);
        prop_assert_eq!(&in_code, &from_yaml, "{}", domain.to_yaml());
        if let Ok(config) = in_code {
            let written = Config::from_files(config.to_yaml_files(), false);
            prop_assert_eq!(written, Ok(config));
        }
    }
}
