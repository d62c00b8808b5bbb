//! The YAML rule loader on arbitrary text.
//!
//! Invariants: loading never panics; a loaded file, written back out (block YAML, every
//! string quoted) and loaded again, gives the same configuration; loading it twice is a
//! duplicate domain, or with merging a duplicate key (or the same rules when it has
//! none); the loaded rules compile and decide requests with sane statuses.
#![no_main]

use ratelimit_core::UnixMillis;
use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;
use ratelimit_core::config::{
    Algorithm, DescriptorRule, DomainConfig, Limit, Metadata, RateLimitRule,
};
use ratelimit_core::{
    Config, ConfigErrorKind, Descriptor, Limiter, MemoryStore, Request, RequestError, Settings,
};
use ratelimit_fuzz::{EPOCH, check_response_any_algorithm};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let config = match Config::from_yaml("a.yaml", &text) {
        Ok(config) => config,
        Err(error) => {
            assert!(error.to_string().starts_with("a.yaml: "), "{error}");
            return;
        }
    };
    assert_eq!(config.domains().len(), 1);
    let domain = &config.domains()[0];
    assert!(!domain.domain.is_empty());

    if let Some(yaml) = emit(domain) {
        let again = Config::from_yaml("b.yaml", &yaml)
            .unwrap_or_else(|e| panic!("written back, the rules no longer load: {e}\n{yaml}"));
        // Debug, not ==: metadata may hold NaN. The rules only: warnings name the file.
        assert_eq!(
            format!("{:?}", again.domains()),
            format!("{:?}", config.domains()),
            "{yaml}"
        );
    }

    let twice = [("a.yaml", &*text), ("b.yaml", &*text)];
    let error = Config::from_files(twice, false).expect_err("a domain loaded twice");
    assert_eq!(error.file, "b.yaml");
    assert_eq!(
        error.kind,
        ConfigErrorKind::DuplicateDomain(domain.domain.clone())
    );
    match Config::from_files(twice, true) {
        Ok(merged) => {
            assert!(domain.descriptors.is_empty(), "merged duplicate rules");
            assert_eq!(
                format!("{:?}", merged.domains()),
                format!("{:?}", config.domains())
            );
        }
        Err(error) => {
            assert!(!domain.descriptors.is_empty(), "{error}");
            assert_eq!(error.file, "b.yaml");
            assert!(
                matches!(error.kind, ConfigErrorKind::DuplicateKey(_)),
                "{error}"
            );
        }
    }

    let limiter = Limiter::new(&config, Settings::default());
    let _ = limiter.describe();
    // One descriptor per top-level rule (at most 16), following its first children.
    let descriptors: Vec<Descriptor> = domain
        .descriptors
        .iter()
        .take(16)
        .map(|rule| {
            let mut entries = Vec::new();
            let mut rule = Some(rule);
            while let Some(r) = rule.filter(|_| entries.len() < 8) {
                entries.push((r.key.clone(), r.value.clone().unwrap_or_else(|| "v".into())));
                rule = r.descriptors.first();
            }
            Descriptor::new(entries)
        })
        .collect();
    if descriptors.is_empty() {
        return;
    }
    let request = Request::new(domain.domain.clone(), descriptors);
    let store = MemoryStore::new(1024);
    for now in [EPOCH, EPOCH, EPOCH + 1] {
        match limiter.should_rate_limit(&request, &store, UnixMillis::from_secs(now)) {
            Ok(response) => check_response_any_algorithm(&request, &response),
            // Names past the limiter's bounds are refused; nothing else may be.
            Err(
                error @ (RequestError::NoConfiguration
                | RequestError::EmptyDomain
                | RequestError::NoDescriptors),
            ) => panic!("{error}"),
            Err(_) => {}
        }
    }
});

/// The domain written back as block YAML with every string double-quoted; `None` when a
/// metadata key is too long for a YAML implicit key, which the file may have written
/// as an explicit one (`? key`).
fn emit(domain: &DomainConfig) -> Option<String> {
    let mut out = String::from("domain: ");
    quote(&mut out, &domain.domain);
    out.push('\n');
    if !domain.descriptors.is_empty() {
        out.push_str("descriptors:\n");
        rules(&mut out, &domain.descriptors, 2)?;
    }
    Some(out)
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

fn rules(out: &mut String, rules: &[DescriptorRule], indent: usize) -> Option<()> {
    let inner = indent + 2;
    for rule in rules {
        pad(out, indent);
        out.push_str("- key: ");
        quote(out, &rule.key);
        out.push('\n');
        if let Some(value) = &rule.value {
            pad(out, inner);
            out.push_str("value: ");
            quote(out, value);
            out.push('\n');
        }
        if let Some(limit) = &rule.rate_limit {
            pad(out, inner);
            out.push_str("rate_limit:\n");
            limit_block(out, limit, inner + 2);
        }
        if !rule.rate_limits.is_empty() {
            pad(out, inner);
            out.push_str("rate_limits:\n");
            for limit in &rule.rate_limits {
                pad(out, inner + 2);
                out.push_str("-\n");
                limit_block(out, limit, inner + 4);
            }
        }
        for (flag, on) in [
            ("shadow_mode", rule.shadow_mode),
            ("quota_mode", rule.quota_mode),
            ("detailed_metric", rule.detailed_metric),
            ("value_to_metric", rule.value_to_metric),
            ("share_threshold", rule.share_threshold),
        ] {
            if on {
                pad(out, inner);
                writeln!(out, "{flag}: true").unwrap();
            }
        }
        if let Some(metadata) = &rule.metadata {
            pad(out, inner);
            out.push_str("metadata:");
            self::metadata(out, metadata, inner + 2)?;
        }
        if !rule.descriptors.is_empty() {
            pad(out, inner);
            out.push_str("descriptors:\n");
            self::rules(out, &rule.descriptors, inner + 2)?;
        }
    }
    Some(())
}

/// One `rate_limit` block's fields at `indent`.
fn limit_block(out: &mut String, limit: &RateLimitRule, indent: usize) {
    pad(out, indent);
    match limit.limit {
        Limit::Unlimited => out.push_str("unlimited: true\n"),
        Limit::Counted {
            window,
            requests_per_unit,
            algorithm,
        } => {
            let unit = window.unit().as_upper_str().to_lowercase();
            writeln!(out, "unit: {unit}").unwrap();
            pad(out, indent);
            writeln!(out, "requests_per_unit: {requests_per_unit}").unwrap();
            if window.multiplier() != 1 {
                pad(out, indent);
                writeln!(out, "unit_multiplier: {}", window.multiplier()).unwrap();
            }
            if algorithm != Algorithm::FixedWindow {
                pad(out, indent);
                writeln!(out, "algorithm: {}", algorithm.as_str()).unwrap();
            }
            if let Algorithm::TokenBucket { burst } = algorithm {
                pad(out, indent);
                writeln!(out, "burst: {burst}").unwrap();
            }
        }
    }
    if let Some(name) = &limit.name {
        pad(out, indent);
        out.push_str("name: ");
        quote(out, name);
        out.push('\n');
    }
    if !limit.replaces.is_empty() {
        pad(out, indent);
        out.push_str("replaces:\n");
        for name in &limit.replaces {
            pad(out, indent + 2);
            out.push_str("- name: ");
            quote(out, name);
            out.push('\n');
        }
    }
}

/// Writes `value` after a `key:` or `-` already written: a scalar on the same line, a
/// collection on the next lines at `indent`.
fn metadata(out: &mut String, value: &Metadata, indent: usize) -> Option<()> {
    match value {
        Metadata::Null => out.push_str(" null\n"),
        Metadata::Bool(b) => writeln!(out, " {b}").unwrap(),
        Metadata::Number(n) if n.is_nan() => out.push_str(" .nan\n"),
        Metadata::Number(n) if n.is_infinite() => {
            out.push_str(if *n > 0.0 { " .inf\n" } else { " -.inf\n" })
        }
        // Debug keeps the fraction (`1.0`): a float, as the number was read.
        Metadata::Number(n) => writeln!(out, " {n:?}").unwrap(),
        Metadata::String(s) => {
            out.push(' ');
            quote(out, s);
            out.push('\n');
        }
        Metadata::List(items) if items.is_empty() => out.push_str(" []\n"),
        Metadata::Map(map) if map.is_empty() => out.push_str(" {}\n"),
        Metadata::List(items) => {
            out.push('\n');
            for item in items {
                pad(out, indent);
                out.push('-');
                metadata(out, item, indent + 2)?;
            }
        }
        Metadata::Map(map) => {
            out.push('\n');
            for (key, item) in map {
                pad(out, indent);
                let start = out.len();
                quote(out, key);
                if out.len() - start > 1000 {
                    return None;
                }
                out.push(':');
                metadata(out, item, indent + 2)?;
            }
        }
    }
    Some(())
}

/// A YAML double-quoted scalar: characters YAML may not hold raw are escaped.
fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            // Not NEL, LS or PS: YAML folds line breaks inside quotes.
            ' '..='~' | '\u{a0}'..='\u{2027}' | '\u{202a}'..='\u{d7ff}' | '\u{10000}'.. => {
                out.push(c)
            }
            '\u{e000}'..='\u{fffd}' if c != '\u{feff}' => out.push(c),
            c if u32::from(c) <= 0xffff => write!(out, "\\u{:04x}", u32::from(c)).unwrap(),
            c => write!(out, "\\U{:08x}", u32::from(c)).unwrap(),
        }
    }
    out.push('"');
}
