//! Loading and validating configuration files.

use ratelimit_core::UnixMillis;
use std::fs;
use std::path::Path;

use ratelimit_core::config::{Algorithm, DescriptorRule, Limit, Metadata};
use ratelimit_core::{Config, ConfigErrorKind, Unit, Window};

/// Every file in `fixtures/invalid` starts with `# error: <message>`: loading it must fail
/// with exactly that message.
#[test]
fn every_invalid_fixture_fails_with_its_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let mut checked = 0;
    for entry in fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let text = fs::read_to_string(&path).unwrap();
        let expected = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# error: "))
            .unwrap_or_else(|| panic!("{name} must start with '# error: '"));
        let error = Config::from_yaml(&name, &text).expect_err(&name);
        assert_eq!(error.to_string(), expected, "{name}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} fixtures found");
}

#[test]
fn yaml_syntax_errors_carry_line_and_column() {
    let error = Config::from_yaml("f.yaml", "domain: x\ndescriptors:\n  - key: [\n").unwrap_err();
    assert!(matches!(error.kind, ConfigErrorKind::Yaml(_)), "{error}");
    assert!(error.location.is_some(), "{error:?}");
}

#[test]
fn duplicate_domain_is_blamed_on_the_later_file_unless_merging() {
    let a = ("a.yaml", "domain: d\ndescriptors:\n  - key: k1\n");
    let b = ("b.yaml", "domain: d\ndescriptors:\n  - key: k2\n");
    let error = Config::from_files([a, b], false).unwrap_err();
    assert_eq!(
        error.to_string(),
        "b.yaml: domain: duplicate domain 'd' in config file"
    );

    let merged = Config::from_files([a, b], true).unwrap();
    assert_eq!(merged.domains().len(), 1);
    let keys: Vec<&str> = merged.domains()[0]
        .descriptors
        .iter()
        .map(|r| r.key.as_str())
        .collect();
    assert_eq!(keys, ["k1", "k2"]);
}

#[test]
fn merging_still_rejects_the_same_key_in_two_files() {
    let a = (
        "a.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n",
    );
    let b = (
        "b.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n",
    );
    let error = Config::from_files([a, b], true).unwrap_err();
    assert_eq!(
        error.to_string(),
        "b.yaml: descriptors[0]: duplicate descriptor composite key 'd.k_v'"
    );
}

fn only_rule(yaml: &str) -> DescriptorRule {
    let config = Config::from_yaml("f.yaml", yaml).unwrap();
    config.domains()[0].descriptors[0].clone()
}

#[test]
fn every_field_is_read() {
    let rule = only_rule(
        "domain: d
descriptors:
  - key: path
    value: /api/*
    shadow_mode: true
    quota_mode: true
    detailed_metric: true
    value_to_metric: true
    share_threshold: true
    metadata: {team: core, weight: 1.5, tags: [a, b]}
    rate_limit:
      unit: Hour
      requests_per_unit: 12
      name: api
      replaces: [{name: old}]
    descriptors:
      - key: method
",
    );
    assert_eq!(rule.key, "path");
    assert_eq!(rule.value.as_deref(), Some("/api/*"));
    assert!(rule.shadow_mode && rule.quota_mode && rule.detailed_metric);
    assert!(rule.value_to_metric && rule.share_threshold);
    let limit = rule.rate_limit.unwrap();
    assert_eq!(
        limit.limit,
        Limit::Counted {
            window: Window::of(Unit::Hour),
            requests_per_unit: 12,
            algorithm: Algorithm::FixedWindow,
        }
    );
    assert_eq!(limit.name.as_deref(), Some("api"));
    assert_eq!(limit.replaces, ["old"]);
    assert_eq!(rule.descriptors[0].key, "method");
    let Some(Metadata::Map(metadata)) = rule.metadata else {
        panic!("metadata is a map")
    };
    assert_eq!(metadata["weight"], Metadata::Number(1.5));
    assert_eq!(metadata["team"], Metadata::String("core".into()));
}

#[test]
fn lenient_forms_that_envoy_ratelimit_accepts() {
    // Scalars become strings, an empty value is no value, a null rate_limit whitelists,
    // a missing requests_per_unit is 0, and unlimited tolerates requests_per_unit.
    let config = Config::from_yaml(
        "f.yaml",
        "domain: 42
descriptors:
  - key: 123
    value: ''
    rate_limit:
  - key: flag
    value: true
    rate_limit: {unit: second}
  - key: free
    rate_limit: {unlimited: true, requests_per_unit: 3}
",
    )
    .unwrap();
    let domain = &config.domains()[0];
    assert_eq!(domain.domain, "42");
    assert_eq!(domain.descriptors[0].key, "123");
    assert_eq!(domain.descriptors[0].value, None);
    assert_eq!(domain.descriptors[0].rate_limit, None);
    assert_eq!(domain.descriptors[1].value.as_deref(), Some("true"));
    assert_eq!(
        domain.descriptors[1].rate_limit.as_ref().unwrap().limit,
        Limit::Counted {
            window: Window::of(Unit::Second),
            requests_per_unit: 0,
            algorithm: Algorithm::FixedWindow,
        }
    );
    assert_eq!(
        domain.descriptors[2].rate_limit.as_ref().unwrap().limit,
        Limit::Unlimited
    );
}

#[test]
fn yaml_1_1_scalars_read_as_envoy_ratelimits_decoder_reads_them() {
    // yaml.v2 reads YAML 1.1: `yes` and `off` are booleans, `010` is octal and `1_000` a
    // thousand; a number or boolean in a string field is its text as written; a
    // byte-order mark is skipped, `<<` merges, and a number may key metadata.
    let config = Config::from_yaml(
        "f.yaml",
        "\u{feff}domain: d
descriptors:
  - key: 0x1F
    value: True
    shadow_mode: yes
    detailed_metric: off
    rate_limit: &hour {unit: hour, requests_per_unit: 010}
  - key: k
    value: +5
    rate_limit: {<<: *hour, requests_per_unit: 1_000}
    metadata: {1: a}
",
    )
    .unwrap();
    let rules = &config.domains()[0].descriptors;
    let counted = |rule: &DescriptorRule| match rule.rate_limit.as_ref().unwrap().limit {
        Limit::Counted {
            window,
            requests_per_unit,
            ..
        } => (window, requests_per_unit),
        Limit::Unlimited => panic!("counted"),
    };
    assert_eq!(rules[0].key, "0x1F");
    assert_eq!(rules[0].value.as_deref(), Some("True"));
    assert!(rules[0].shadow_mode && !rules[0].detailed_metric);
    assert_eq!(counted(&rules[0]), (Window::of(Unit::Hour), 8));
    assert_eq!(rules[1].value.as_deref(), Some("+5"));
    assert_eq!(counted(&rules[1]), (Window::of(Unit::Hour), 1_000));
    let Some(Metadata::Map(metadata)) = &rules[1].metadata else {
        panic!("metadata is a map")
    };
    assert_eq!(metadata["1"], Metadata::String("a".into()));
    // Quoted, `yes` is a string, which a boolean field refuses, as yaml.v2 does.
    let quoted = "domain: d\ndescriptors:\n  - {key: k, shadow_mode: \"yes\"}\n";
    let error = Config::from_yaml("f.yaml", quoted).unwrap_err().to_string();
    assert!(error.contains("shadow_mode"), "{error}");
}

#[test]
fn known_keys_in_the_wrong_place_are_ignored_as_upstream_does() {
    let rule =
        only_rule("domain: d\ndescriptors:\n  - key: k\n    unit: second\n    domain: other\n");
    assert_eq!(rule.rate_limit, None);
}

#[test]
fn only_the_first_yaml_document_is_read() {
    let config =
        Config::from_yaml("f.yaml", "domain: first\n---\ndomain: second\nbogus: 1\n").unwrap();
    assert_eq!(config.domains().len(), 1);
    assert_eq!(config.domains()[0].domain, "first");
}

#[test]
fn empty_descriptor_list_is_valid() {
    let config = Config::from_yaml("f.yaml", "domain: d\n").unwrap();
    assert!(config.domains()[0].descriptors.is_empty());
}

#[test]
fn bundled_example_config_loads_and_behaves_as_its_comments_say() {
    use ratelimit_core::{Code, Descriptor, Limiter, MemoryStore, Request, Settings};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/config/example.yaml");
    let config = Config::from_yaml("example.yaml", &fs::read_to_string(path).unwrap()).unwrap();
    let limiter = Limiter::new(&config, Settings::default());
    let store = MemoryStore::default();
    let ask = |entries: &[(&str, &str)]| {
        let request = Request::new("edge", vec![Descriptor::new(entries.iter().copied())]);
        limiter
            .should_rate_limit(&request, &store, UnixMillis::from_secs(1_000_000))
            .unwrap()
    };
    assert_eq!(
        ask(&[("remote_address", "192.0.2.66")]).overall_code,
        Code::OverLimit
    );
    assert_eq!(
        ask(&[("remote_address", "127.0.0.1")]).statuses[0].current_limit,
        None
    );
    assert_eq!(
        ask(&[("remote_address", "10.1.1.1")]).statuses[0].limit_remaining,
        59
    );
    assert_eq!(
        ask(&[("user", "a"), ("method", "POST")]).statuses[0].limit_remaining,
        9
    );
    assert_eq!(
        ask(&[("tenant", "t")]).statuses[0].limit_remaining,
        u32::MAX
    );
    for _ in 0..6 {
        assert_eq!(
            ask(&[("path", "/api/v2/x")]).overall_code,
            Code::Ok,
            "shadow mode"
        );
    }
    ask(&[("path", "/downloads/a")]);
    assert_eq!(
        ask(&[("path", "/downloads/b")]).statuses[0].limit_remaining,
        48
    );
}

#[test]
fn an_empty_rate_limit_is_accepted_with_a_warning() {
    // `unit` and `requests_per_unit` one level too shallow: `rate_limit:` is null and the
    // descriptor is a whitelist, as upstream loads it.
    let text = "domain: w\ndescriptors:\n  - key: user\n    rate_limit:\n    unit: second\n    requests_per_unit: 5\n";
    let config = Config::from_yaml("config/w.yaml", text).unwrap();
    assert_eq!(config.domains()[0].descriptors[0].rate_limit, None);
    assert_eq!(config.warnings().len(), 1, "{:?}", config.warnings());
    assert!(
        config.warnings()[0].starts_with("config/w.yaml: descriptors[0].rate_limit is empty"),
        "{:?}",
        config.warnings()
    );
    let fine = "domain: w\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: free\n";
    assert!(
        Config::from_yaml("w.yaml", fine)
            .unwrap()
            .warnings()
            .is_empty()
    );
}

#[test]
fn errors_after_the_parse_carry_the_line_and_column_of_their_node() {
    let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: minutes\n      requests_per_unit: 1\n";
    let error = Config::from_yaml("d.yaml", text).unwrap_err();
    assert_eq!(error.path, "descriptors[0].rate_limit.unit");
    assert_eq!(error.location, Some((5, 7)));
    let text = "domain: d\ndescriptors:\n  - key: a\n  - key: a\n";
    let error = Config::from_yaml("d.yaml", text).unwrap_err();
    assert_eq!(
        (error.path.as_str(), error.location),
        ("descriptors[1]", Some((4, 5)))
    );
}

#[test]
fn every_error_of_every_file_is_reported() {
    // The key pass: both unknown keys, in file order.
    let keys =
        "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n  - key: b\n    rate_limitz: {}\n";
    // The field pass: one error per rule in error; the rules after it are still read.
    let fields = "domain: e\ndescriptors:\n  - key: a\n    rate_limit: {unit: minutes, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: c\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
    let good = "domain: f\ndescriptors:\n  - key: a\n";
    let errors = Config::check_files(
        [("k.yaml", keys), ("f.yaml", fields), ("g.yaml", good)],
        false,
    )
    .unwrap_err();
    let found: Vec<_> = errors
        .iter()
        .map(|e| (e.file.as_str(), e.path.as_str(), e.location))
        .collect();
    assert_eq!(
        found,
        [
            ("k.yaml", "descriptors[0].ratelimit", Some((4, 5))),
            ("k.yaml", "descriptors[1].rate_limitz", Some((6, 5))),
            ("f.yaml", "descriptors[0].rate_limit.unit", Some((4, 18))),
            ("f.yaml", "descriptors[2].rate_limit.unit", Some((8, 18))),
        ]
    );
    // from_files keeps the first, as before.
    let first = Config::from_files([("k.yaml", keys), ("f.yaml", fields)], false).unwrap_err();
    assert_eq!(first.path, "descriptors[0].ratelimit");
}
