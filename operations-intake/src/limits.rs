//! Whether a client may send a batch now: decided by ratelimit-core in process, or by a
//! ratelimit sidecar over gRPC so that replicas share counters.
//!
//! Limits count operations, not requests: the descriptor `client_id=<id>` carries the
//! batch size as its hits, and `client_id=<id>, operation=<kind>` carries each kind's
//! count, so a configuration can cap sells apart from buys.

use ratelimit_core::UnixMillis;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimit_core::stats::StatsRegistry;
use ratelimit_core::{
    Config, Descriptor, HeaderFormat, Limiter, MemoryStore, Policy, Request, Response, Retry,
    Settings,
};
use ratelimit_proto::envoy::client::{request_to_pb, response_from_pb};
use ratelimit_service_kit::announce;
use ratelimit_service_kit::clock::unix_now_ms;
use tonic::transport::{Channel, Endpoint};

use crate::batch::Batch;

/// Rate-limit response headers (name, value), in LIMIT_RESPONSE_HEADERS_FORMAT; none
/// when no limit applied.
pub type LimitHeaders = Vec<(String, String)>;

/// What the limits say about a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Go ahead; the headers describe the limits that applied.
    Allow(LimitHeaders),
    /// Over a limit: 429 with these headers, and when the same batch may pass (the core
    /// says: when every limit it is over has a new window, or never when it holds more
    /// operations than some limit allows in a whole window).
    Deny {
        /// The rate-limit headers.
        headers: LimitHeaders,
        /// When a retry can pass.
        retry: Retry,
        /// The names of the policies the batch is over: as `RateLimit-Policy` names them
        /// with ietf-draft-11, else each rule's `name` or `descriptor<position>`.
        violated: Vec<String>,
    },
    /// The remote limiter could not answer and the failure mode is deny: 503.
    Unavailable,
}

/// Why the limits could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LimitsError {
    /// The sidecar URL is not an `http://` or `https://` URL with a host.
    #[error("RATELIMIT_GRPC_URL `{url}` is not valid: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The sidecar answered, but has no limit for this service's domain.
    #[error(
        "the ratelimit sidecar at RATELIMIT_GRPC_URL has no limit for a client in domain `{0}` (RATELIMIT_DOMAIN): every batch would be allowed. Load a rule for `client_id` in that domain into the sidecar, or set RATELIMIT_ALLOW_UNKNOWN_DOMAIN=true"
    )]
    UnknownRemoteDomain(String),
}

/// The configured limits.
pub enum Limits {
    /// No rules: every batch is allowed.
    Off,
    /// Decided in process against in-memory counters.
    Local {
        /// The engine.
        limiter: Limiter,
        /// The counters.
        store: MemoryStore,
        /// The domain asked for.
        domain: String,
    },
    /// Asked of a ratelimit sidecar.
    Remote {
        /// The sidecar's client; channels are cheap to clone.
        client: RateLimitServiceClient<Channel>,
        /// The domain asked for.
        domain: String,
        /// Per-call deadline.
        timeout: Duration,
        /// Refuse batches when the sidecar fails.
        failure_mode_deny: bool,
    },
}

/// The client id of the start-up probe: a space is not allowed in `x-client-id`.
const PROBE_CLIENT: &str = "operations-intake start-up probe";

/// How many distinct counters the in-process store keeps at most.
const LOCAL_COUNTERS: usize = 1 << 20;

impl Limits {
    /// In-process limits of `domain`, with no rule until [`Limits::set_rules`]; `format`
    /// says which headers the answers will carry.
    pub fn local(domain: &str, format: &HeaderFormat) -> Limits {
        let settings = Settings {
            report_policies: matches!(format, HeaderFormat::IetfDraft11),
            ..Settings::default()
        };
        Limits::Local {
            limiter: Limiter::without_config(settings),
            store: MemoryStore::new(LOCAL_COUNTERS),
            domain: domain.to_owned(),
        }
    }

    /// Puts the rules in `text` (from `source`) in use, all or nothing: rules that do not
    /// parse, or do not limit the domain, leave the previous ones. Logged as the sidecar
    /// logs its reloads.
    pub fn set_rules(&self, source: &str, text: &str) -> Result<(), String> {
        let Limits::Local {
            limiter, domain, ..
        } = self
        else {
            return Err("rules are only read with in-process limits".into());
        };
        let config = Config::from_files([(source.to_owned(), text.to_owned())], false)
            .map_err(|error| error.to_string())
            .and_then(|config| {
                if config.domains().iter().any(|d| d.domain == *domain) {
                    Ok(config)
                } else {
                    Err(format!(
                        "no domain `{domain}` (RATELIMIT_DOMAIN): every batch would be allowed"
                    ))
                }
            });
        match config {
            Ok(config) => {
                limiter.set_config(&config);
                announce::announce_loaded(limiter, &config, source, "");
                Ok(())
            }
            Err(error) => {
                announce::announce_rejected(&error);
                Err(error)
            }
        }
    }

    /// The in-process limiter's statistics, if limits are decided here.
    pub fn stats(&self) -> Option<&Arc<StatsRegistry>> {
        match self {
            Limits::Local { limiter, .. } => Some(limiter.stats()),
            _ => None,
        }
    }

    /// Limits asked of the sidecar at `url`; the connection is made on first use.
    pub fn remote(
        url: &str,
        domain: &str,
        timeout: Duration,
        failure_mode_deny: bool,
    ) -> Result<Limits, LimitsError> {
        let bad = |reason: String| LimitsError::BadUrl {
            url: url.to_owned(),
            reason,
        };
        let uri: http::Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(e.to_string()))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
            return Err(bad(
                "expected http://host:port (or https://); the scheme is required".into(),
            ));
        }
        let endpoint = Endpoint::from(uri)
            .connect_timeout(timeout)
            .timeout(timeout);
        Ok(Limits::Remote {
            client: RateLimitServiceClient::new(endpoint.connect_lazy()),
            domain: domain.to_owned(),
            timeout,
            failure_mode_deny,
        })
    }

    /// Asks the sidecar once whether it limits clients of this service's domain: an
    /// error when it answers without a limit (an unknown domain, or no `client_id` rule),
    /// a warning when it cannot be asked (it may start later). The probe counts one hit
    /// for a client id no caller can send (`x-client-id` values are checked).
    pub async fn verify_remote(&self) -> Result<(), LimitsError> {
        let Limits::Remote {
            client,
            domain,
            timeout,
            ..
        } = self
        else {
            return Ok(());
        };
        let probe = Request::new(
            domain.clone(),
            vec![Descriptor::new([("client_id", PROBE_CLIENT)])],
        );
        let mut client = client.clone();
        let call = client.should_rate_limit(request_to_pb(&probe));
        match tokio::time::timeout(*timeout, call).await {
            Ok(Ok(response)) => {
                let limited = response
                    .get_ref()
                    .statuses
                    .iter()
                    .any(|status| status.current_limit.is_some());
                if limited {
                    Ok(())
                } else {
                    Err(LimitsError::UnknownRemoteDomain(domain.clone()))
                }
            }
            Ok(Err(status)) => {
                tracing::warn!(%status, domain, "cannot ask the ratelimit sidecar whether it knows the domain; batches follow RATELIMIT_FAILURE_MODE_DENY until it answers");
                Ok(())
            }
            Err(_) => {
                tracing::warn!(
                    domain,
                    "the ratelimit sidecar did not answer in time; cannot check that it knows the domain"
                );
                Ok(())
            }
        }
    }

    /// Checks `batch` from `client_id`, counting its operations; the headers are in
    /// `format`.
    pub async fn check(&self, client_id: &str, batch: &Batch, format: &HeaderFormat) -> Verdict {
        match self {
            Limits::Off => Verdict::Allow(Vec::new()),
            Limits::Local {
                limiter,
                store,
                domain,
            } => {
                let request = Request::new(domain.clone(), descriptors(client_id, batch));
                match limiter.should_rate_limit(&request, store, UnixMillis(unix_now_ms())) {
                    Ok(response) => verdict(&response, &request, format),
                    Err(error) => {
                        tracing::error!(%error, "the rate limiter refused its own request");
                        Verdict::Allow(Vec::new())
                    }
                }
            }
            Limits::Remote {
                client,
                domain,
                timeout,
                failure_mode_deny,
            } => {
                let request = Request::new(domain.clone(), descriptors(client_id, batch));
                let mut client = client.clone();
                let call = client.should_rate_limit(request_to_pb(&request));
                let answer = tokio::time::timeout(*timeout, call).await;
                match answer {
                    Ok(Ok(response)) => {
                        verdict(&response_from_pb(&response.into_inner()), &request, format)
                    }
                    Ok(Err(status)) => remote_failed(*failure_mode_deny, &status.to_string()),
                    Err(_) => remote_failed(*failure_mode_deny, "no answer in time"),
                }
            }
        }
    }
}

/// The descriptors for a batch: the client's total, then one per kind present.
pub fn descriptors(client_id: &str, batch: &Batch) -> Vec<Descriptor> {
    let mut descriptors = vec![Descriptor::new([("client_id", client_id)]).with_hits(batch.count)];
    descriptors.extend(batch.kinds().map(|(kind, count)| {
        Descriptor::new([("client_id", client_id), ("operation", kind.as_str())]).with_hits(count)
    }));
    descriptors
}

fn verdict(response: &Response, request: &Request, format: &HeaderFormat) -> Verdict {
    let headers = response.header_pairs(format);
    match response.retry(request) {
        None => Verdict::Allow(headers),
        Some(retry) => Verdict::Deny {
            headers,
            retry,
            violated: violated(response),
        },
    }
}

/// The names of the policies `response` is over.
fn violated(response: &Response) -> Vec<String> {
    let from_statuses;
    let policies = if response.policies.is_empty() {
        from_statuses = Policy::from_statuses(&response.statuses);
        &from_statuses
    } else {
        &response.policies
    };
    policies
        .iter()
        .filter(|policy| policy.over)
        .map(|policy| policy.name.clone())
        .collect()
}

fn remote_failed(deny: bool, why: &str) -> Verdict {
    if deny {
        tracing::warn!(error = why, "rate-limit service failed; refusing the batch");
        Verdict::Unavailable
    } else {
        tracing::warn!(error = why, "rate-limit service failed; allowing the batch");
        Verdict::Allow(Vec::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_count_operations_per_client_and_kind() {
        let batch = Batch {
            count: 5,
            buys: 0,
            sells: 5,
        };
        let found = descriptors("c1", &batch);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].hits_addend, Some(5));
        assert_eq!(found[1].entries[1].value, "sell");
        assert_eq!(found[1].hits_addend, Some(5));
    }

    #[test]
    fn local_limits_count_operations_and_cap_kinds_apart() {
        let rules = String::from(
            "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 10}\n    descriptors:\n      - key: operation\n        value: sell\n        rate_limit: {unit: hour, requests_per_unit: 3}\n",
        );
        let ratelimit = HeaderFormat::parse("ratelimit").unwrap();
        let limits = Limits::local("operations", &ratelimit);
        limits.set_rules("limits.yaml", &rules).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let check = |limits: &Limits, format, buys, sells| {
            let batch = Batch {
                count: buys + sells,
                buys,
                sells,
            };
            rt.block_on(limits.check("c1", &batch, format))
        };
        let header = |headers: &LimitHeaders, name: &str| {
            let found = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name));
            found.map(|(_, v)| v.clone()).unwrap_or_default()
        };
        // The tightest limit's RateLimit-Limit and RateLimit-Remaining of an allowed batch.
        let allowed = |buys, sells| match check(&limits, &ratelimit, buys, sells) {
            Verdict::Allow(h) => [
                header(&h, "RateLimit-Limit"),
                header(&h, "RateLimit-Remaining"),
            ],
            other => panic!("{other:?}"),
        };
        assert_eq!(allowed(2, 3), ["3", "0"], "within both limits");
        let Verdict::Deny {
            headers,
            retry: Retry::After(r),
            violated,
        } = check(&limits, &ratelimit, 0, 1)
        else {
            panic!("over the sell limit")
        };
        assert_eq!(header(&headers, "RateLimit-Limit"), "3");
        assert!((1..=3600).contains(&r));
        assert_eq!(violated, ["descriptor1"], "the sell limit, unnamed");
        assert_eq!(allowed(4, 0), ["10", "0"], "within the client's limit");
        assert!(matches!(
            check(&limits, &ratelimit, 1, 0),
            Verdict::Deny {
                retry: Retry::After(_),
                ..
            }
        ));
        assert!(
            matches!(
                check(&limits, &ratelimit, 0, 4),
                Verdict::Deny {
                    retry: Retry::Never,
                    ..
                }
            ),
            "4 sells can never fit a limit of 3"
        );
        // LIMIT_RESPONSE_HEADERS_FORMAT=ietf-draft-11: every limit that applied, and the
        // one that decided.
        let draft = HeaderFormat::IetfDraft11;
        let limits = Limits::local("operations", &draft);
        limits.set_rules("limits.yaml", &rules).unwrap();
        let Verdict::Allow(headers) = check(&limits, &draft, 2, 3) else {
            panic!("within both limits")
        };
        let policy = header(&headers, "RateLimit-Policy");
        assert!(
            policy.contains(";q=10;w=3600") && policy.contains(";q=3;w=3600"),
            "{policy}"
        );
        assert!(
            header(&headers, "RateLimit").contains(";r=0;t="),
            "{headers:?}"
        );
        assert!(header(&headers, "RateLimit-Limit").is_empty());
    }

    #[test]
    fn rules_without_the_domain_or_invalid_are_refused_and_the_previous_stay() {
        let limits = Limits::local("operations", &HeaderFormat::IetfDraft11);
        let one = "domain: operations\ndescriptors:\n  - key: client_id\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
        limits.set_rules("a.yaml", one).unwrap();
        let error = limits.set_rules("a.yaml", "domain: other\n").unwrap_err();
        assert!(error.contains("no domain `operations`"), "{error}");
        assert!(limits.set_rules("a.yaml", "domain: [").is_err());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let batch = Batch {
            count: 2,
            buys: 2,
            sells: 0,
        };
        let verdict = rt.block_on(limits.check("c", &batch, &HeaderFormat::IetfDraft11));
        assert!(
            matches!(verdict, Verdict::Deny { .. }),
            "the limit of 1 still applies: {verdict:?}"
        );
    }
}
