//! The Rate Limit Quota Service on the real binary, spoken to as Envoy's client speaks:
//! what each kind of rule assigns, the first grant less what Envoy admitted before it,
//! shadow mode's statistics, refused input, and an abandon action after a reload removes
//! a bucket's rule, and two Envoys' grants held to the limit on every backend. (Real
//! Envoys: tests/tests/rlqs.rs.)

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use ratelimit_tests::on_every_backend;
use ratelimit_tests::sidecar::{Options, Server, Store};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const RULES: &str = include_str!("fixtures/rlqs.yaml");

fn usage(key: &str, value: &str, allowed: u64) -> BucketQuotaUsage {
    BucketQuotaUsage {
        bucket_id: Some(BucketId {
            bucket: HashMap::from([(key.to_owned(), value.to_owned())]),
        }),
        time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
            seconds: 5,
            nanos: 0,
        }),
        num_requests_allowed: allowed,
        num_requests_denied: 0,
    }
}

/// A stream on a new connection: the reports' sender and the answers.
type Opened = (
    mpsc::Sender<RateLimitQuotaUsageReports>,
    Streaming<RateLimitQuotaResponse>,
);

async fn try_open(server: &Server) -> Result<Opened, tonic::Status> {
    let url = format!("http://127.0.0.1:{}", server.grpc);
    let mut client = RateLimitQuotaServiceClient::connect(url).await.unwrap();
    let (tx, rx) = mpsc::channel(4);
    let answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, answers))
}

async fn open(server: &Server) -> Opened {
    try_open(server).await.unwrap()
}

/// Each action of `response`: the bucket's single entry, and what it is told.
fn actions(response: RateLimitQuotaResponse) -> Vec<(String, String)> {
    response
        .bucket_action
        .into_iter()
        .map(|action| {
            let id = action.bucket_id.unwrap().bucket;
            let (key, value) = id.into_iter().next().unwrap();
            let what = match action.bucket_action.unwrap() {
                Action::AbandonAction(_) => "abandon".to_owned(),
                Action::QuotaAssignmentAction(q) => {
                    assert_eq!(q.assignment_time_to_live.unwrap().seconds, 15);
                    match q.rate_limit_strategy.unwrap().strategy.unwrap() {
                        Strategy::BlanketRule(rule) => BlanketRule::try_from(rule)
                            .unwrap()
                            .as_str_name()
                            .to_owned(),
                        Strategy::TokenBucket(bucket) => format!("tokens {}", bucket.max_tokens),
                        other => panic!("{other:?}"),
                    }
                }
            };
            (format!("{key}={value}"), what)
        })
        .collect()
}

async fn next(answers: &mut Streaming<RateLimitQuotaResponse>) -> Vec<(String, String)> {
    let answer = tokio::time::timeout(Duration::from_secs(5), answers.message()).await;
    actions(answer.expect("an answer in time").unwrap().unwrap())
}

async fn send(
    reports: &mpsc::Sender<RateLimitQuotaUsageReports>,
    domain: &str,
    bucket_quota_usages: Vec<BucketQuotaUsage>,
) {
    let report = RateLimitQuotaUsageReports {
        domain: domain.to_owned(),
        bucket_quota_usages,
    };
    reports.send(report).await.unwrap();
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect()
}

#[tokio::test]
async fn each_kind_of_rule_assigns_what_it_means_and_a_removed_rule_is_abandoned() {
    // Watching the root: a swapped rules directory is reloaded.
    let mut options = Options::default();
    options.files.push(("rules.yaml", RULES.to_owned()));
    options.watch_root = true;
    let server = Server::start_with(options);
    let (reports, mut answers) = open(&server).await;
    let first = vec![
        usage("user", "a", 1),
        usage("free", "x", 1),
        usage("blocked", "x", 1),
        usage("watched", "x", 3),
        usage("nobody", "x", 1),
    ];
    send(&reports, "q", first).await;
    assert_eq!(
        next(&mut answers).await,
        pairs(&[
            ("user=a", "DENY_ALL"),
            ("user=a", "tokens 9"),
            ("free=x", "ALLOW_ALL"),
            ("blocked=x", "DENY_ALL"),
            ("watched=x", "ALLOW_ALL"),
            ("nobody=x", "ALLOW_ALL"),
        ]),
        "a new bucket starts full, less the request Envoy admitted before asking"
    );
    let stat = |name: &'static str| {
        let server = &server;
        async move { server.stat(name).await }
    };
    assert_eq!(
        stat("ratelimit.service.rate_limit.q.user.total_hits").await,
        Some(1)
    );
    assert_eq!(
        stat("ratelimit.service.rate_limit.q.watched.shadow_mode").await,
        Some(2)
    );
    assert_eq!(
        stat("ratelimit.service.rate_limit.q.watched.within_limit").await,
        Some(1)
    );
    // The next report extends the same bucket: Envoy keeps counting it down.
    send(&reports, "", vec![usage("user", "a", 4)]).await;
    assert_eq!(next(&mut answers).await, pairs(&[("user=a", "tokens 9")]));
    server.swap_root(
        "v2",
        &[(
            "rules.yaml",
            "domain: q\ndescriptors:\n  - key: free\n    rate_limit: {unlimited: true}\n",
        )],
    );
    // Buckets that were limited (or denied) are abandoned; the others keep ALLOW_ALL.
    let mut abandoned = next(&mut answers).await;
    abandoned.sort();
    assert_eq!(
        abandoned,
        pairs(&[("blocked=x", "abandon"), ("user=a", "abandon")])
    );
    assert_eq!(stat("ratelimit.rlqs.abandoned").await, Some(2));
}

#[tokio::test]
async fn a_stream_that_names_no_domain_or_no_bucket_is_refused() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let (reports, mut answers) = open(&server).await;
    send(&reports, "", vec![usage("user", "a", 1)]).await;
    let refused = answers.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("domain"), "{refused:?}");
    let (reports, mut answers) = open(&server).await;
    let mut nameless = usage("user", "a", 1);
    nameless.bucket_id = None;
    send(&reports, "q", vec![nameless]).await;
    let refused = answers.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("bucket_id"), "{refused:?}");
}

/// Quota is reserved in the backend's counter before it is granted, and shares move
/// through it, on every backend: a second Envoy that joins after the first took the whole
/// limit starts with nothing, the first gives back above its even share at once (its
/// bucket resized, not refilled), and the second tops up; once the second reports denials
/// (the window is skewed), the first gives back what its demand does not need at its next
/// report and the second gets it at its next.
async fn a_joining_envoy_gets_what_the_first_gives_back(store: &Store) {
    let mut options = Options::default();
    options.files.push(("rules.yaml", RULES.to_owned()));
    options.env = store.env();
    let server = Server::start_with(options);
    let fresh = |tokens: &str| pairs(&[("user=shared", "DENY_ALL"), ("user=shared", tokens)]);
    let (first, mut first_answers) = open(&server).await;
    send(&first, "q", vec![usage("user", "shared", 0)]).await;
    let alone = "alone, the first Envoy's even share is the whole limit";
    assert_eq!(
        next(&mut first_answers).await,
        fresh("tokens 10"),
        "{alone}"
    );
    let (second, mut second_answers) = open(&server).await;
    send(&second, "q", vec![usage("user", "shared", 0)]).await;
    assert_eq!(
        next(&mut second_answers).await,
        pairs(&[("user=shared", "DENY_ALL")]),
        "nothing is left in the window's counter"
    );
    let given = "the first gives back above its even share of two: its bucket shrinks";
    assert_eq!(
        next(&mut first_answers).await,
        pairs(&[("user=shared", "tokens 5")]),
        "{given}"
    );
    let topped = "the second tops up to its even share";
    assert_eq!(
        next(&mut second_answers).await,
        fresh("tokens 5"),
        "{topped}"
    );

    let mut denied = usage("user", "shared", 0);
    denied.num_requests_denied = 3;
    send(&second, "q", vec![denied.clone()]).await;
    let full = "nothing left: the same bucket";
    assert_eq!(
        next(&mut second_answers).await,
        pairs(&[("user=shared", "tokens 5")]),
        "{full}"
    );
    send(&first, "q", vec![usage("user", "shared", 0)]).await;
    let skewed = "skewed: the first keeps what its demand needs (one request)";
    assert_eq!(
        next(&mut first_answers).await,
        fresh("tokens 1"),
        "{skewed}"
    );
    send(&second, "q", vec![denied]).await;
    let grown = "the second gets what the first gave back";
    assert_eq!(
        next(&mut second_answers).await,
        fresh("tokens 4"),
        "{grown}"
    );
    assert_eq!(server.stat("ratelimit.rlqs.reserve_failed").await, Some(0));
}

on_every_backend!(a_joining_envoy_gets_what_the_first_gives_back);

#[tokio::test]
async fn streams_beyond_the_bound_are_refused_until_one_ends() {
    let server = Server::start_with(Options::rules(RULES).set("RLQS_MAX_STREAMS", "1"));
    let (first, mut first_answers) = open(&server).await;
    send(&first, "q", vec![usage("free", "x", 1)]).await;
    next(&mut first_answers).await;
    let refused = try_open(&server).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("RLQS_MAX_STREAMS"),
        "{refused:?}"
    );
    assert_eq!(server.stat("ratelimit.rlqs.streams_refused").await, Some(1));
    drop((first, first_answers));
    // The ended stream's place frees once the server sees the end.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let (again, mut answers) = loop {
        match try_open(&server).await {
            Ok(opened) => break opened,
            Err(status) => assert_eq!(status.code(), tonic::Code::ResourceExhausted),
        }
        assert!(std::time::Instant::now() < deadline, "never freed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    send(&again, "q", vec![usage("free", "y", 1)]).await;
    assert_eq!(next(&mut answers).await, pairs(&[("free=y", "ALLOW_ALL")]));
}

/// Reported counts are bounded as ShouldRateLimit's addends are, and the statistics they
/// feed saturate instead of wrapping.
#[tokio::test]
async fn huge_usage_reports_are_bounded_and_never_wrap_a_statistic() {
    let bounded = Server::start_with(Options::rules(RULES).set("MAX_HITS_ADDEND", "1000"));
    let (reports, mut answers) = open(&bounded).await;
    send(&reports, "q", vec![usage("watched", "x", u64::MAX)]).await;
    let refused = answers.message().await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("MAX_HITS_ADDEND"), "{refused:?}");
    assert_eq!(bounded.stat("ratelimit.rlqs.usage_refused").await, Some(1));

    // Unbounded (the default, as upstream's uint64): counted, saturating.
    let server = Server::start(&[("rules.yaml", RULES)]);
    let (reports, mut answers) = open(&server).await;
    for _ in 0..2 {
        send(&reports, "q", vec![usage("watched", "y", u64::MAX - 1)]).await;
        next(&mut answers).await;
    }
    let total = "ratelimit.service.rate_limit.q.watched.total_hits";
    assert_eq!(
        server.stat(total).await,
        Some(u64::MAX),
        "saturated, not wrapped"
    );
}

/// A stream that stops reporting is ended after four assignment TTLs, so idle streams
/// cannot hold every place under RLQS_MAX_STREAMS.
#[tokio::test]
async fn an_idle_stream_is_ended_and_frees_its_place() {
    let mut options = Options::default();
    options.files.push(("rules.yaml", RULES.to_owned()));
    options.env.push(("RLQS_MAX_STREAMS", "1".to_owned()));
    options.env.push(("RLQS_ASSIGNMENT_TTL", "1s".to_owned()));
    let server = Server::start_with(options);
    let (silent, mut silent_answers) = open(&server).await;
    send(&silent, "q", vec![usage("free", "x", 1)]).await;
    // (Not `next`: it checks the default assignment TTL.)
    assert!(silent_answers.message().await.unwrap().is_some());
    assert_eq!(
        try_open(&server).await.unwrap_err().code(),
        tonic::Code::ResourceExhausted
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), silent_answers.message()).await;
    assert!(matches!(ended, Ok(Ok(None))), "{ended:?}");
    assert_eq!(server.stat("ratelimit.rlqs.streams_idle").await, Some(1));
    let (again, mut answers) = open(&server).await;
    send(&again, "q", vec![usage("free", "y", 1)]).await;
    assert!(answers.message().await.unwrap().is_some());
    drop(silent);
}

/// A bucket id of about 60 KiB for `user`: 29 more entries of 1 KiB keys and values
/// that no rule names.
fn large(key: &str, user: usize) -> BucketQuotaUsage {
    let mut id = usage(key, &format!("u{user}"), 0);
    let bucket = &mut id.bucket_id.as_mut().unwrap().bucket;
    for pad in 0..29 {
        bucket.insert(format!("{pad:04}{}", "k".repeat(1_020)), "v".repeat(1_024));
    }
    id
}

/// Reports `users` large buckets of `key` on `reports`, 60 at a time (each report under
/// the 4 MiB the server decodes).
async fn report_large(
    reports: &mpsc::Sender<RateLimitQuotaUsageReports>,
    key: &str,
    users: std::ops::Range<usize>,
) {
    let all: Vec<usize> = users.collect();
    for chunk in all.chunks(60) {
        let usages = chunk.iter().map(|&user| large(key, user)).collect();
        send(reports, "q", usages).await;
    }
}

/// Answers to large buckets come in several messages, each under the 4 MiB a gRPC client
/// receives by default (this client's too: a larger message fails to decode), and a
/// stream holds at most 16 MiB of buckets.
#[tokio::test]
async fn answers_are_split_under_4_mib_and_bucket_bytes_are_bounded_per_stream() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let (reports, mut answers) = open(&server).await;
    report_large(&reports, "user", 0..100).await;
    let mut assigned = std::collections::HashSet::new();
    while assigned.len() < 91 {
        let answer = tokio::time::timeout(Duration::from_secs(10), answers.message()).await;
        let answer = answer
            .expect("answers in time")
            .expect("under 4 MiB")
            .unwrap();
        for action in answer.bucket_action {
            assigned.insert(action.bucket_id.unwrap().bucket["user"].clone());
        }
    }
    assert!(server.stat("ratelimit.rlqs.answers_split").await >= Some(1));
    let refused = server.stat("ratelimit.rlqs.buckets_refused").await;
    assert_eq!(refused, Some(100 - assigned.len() as u64), "{assigned:?}");
}

/// Nine streams, each reporting 91 large buckets (about 819 of 178 KB held: more than
/// the 128 MiB the process holds), once the sidecar has read every report; their
/// senders, which keep the streams open.
async fn fill_the_bucket_budget(server: &Server) -> Vec<mpsc::Sender<RateLimitQuotaUsageReports>> {
    let mut streams = Vec::new();
    for _ in 0..9 {
        let (reports, mut answers) = open(server).await;
        // Read (and drop) the answers, or the stream waits for its reader.
        tokio::spawn(async move { while let Ok(Some(_)) = answers.message().await {} });
        report_large(&reports, "user", 0..91).await;
        streams.push(reports);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.stat("ratelimit.rlqs.usage_reports").await < Some(9 * 91) {
        assert!(std::time::Instant::now() < deadline, "reports not read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    streams
}

/// The process holds at most 128 MiB of buckets over all its streams, even when they
/// report the same ids (each stream holds its own copy).
#[tokio::test]
async fn bucket_bytes_are_bounded_per_process() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let _streams = fill_the_bucket_budget(&server).await;
    let refused = server.stat("ratelimit.rlqs.buckets_refused").await.unwrap();
    // 128 MiB holds about 750 buckets of 178 KB (each id's 59 KB held three times): of
    // the 819 reported, about 70 are refused.
    assert!((50..=91).contains(&refused), "{refused} refused");
}

/// Streams that fill the process's bucket budget and end free it at once, not an
/// assignment TTL (15 s) later: the next Envoy's buckets are held again.
#[tokio::test]
async fn the_buckets_of_ended_streams_leave_the_process_budget_at_once() {
    let server = Server::start(&[("rules.yaml", RULES)]);
    let streams = fill_the_bucket_budget(&server).await;
    let refused = server.stat("ratelimit.rlqs.buckets_refused").await;
    assert!(refused > Some(0), "the budget is full: {refused:?}");
    drop(streams);
    // A large bucket (about 178 KB held) fits once the ended streams' buckets left.
    let (reports, mut answers) = open(&server).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    for user in 1_000.. {
        send(&reports, "q", vec![large("user", user)]).await;
        let answer = tokio::time::timeout(Duration::from_millis(500), answers.message()).await;
        if let Ok(answer) = answer {
            assert!(answer.unwrap().is_some(), "an assignment");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the ended streams' buckets still hold the budget"
        );
    }
}

/// A stream whose reader takes no answer for an assignment TTL is ended, so the answers
/// queued for it stay bounded (every window of a per-second rule sends all its buckets).
#[tokio::test]
async fn a_stream_that_does_not_read_its_answers_is_ended() {
    let options = Options::rules(RULES).set("RLQS_ASSIGNMENT_TTL", "1s");
    let server = Server::start_with(options);
    let (reports, answers) = open(&server).await;
    report_large(&reports, "tick", 0..60).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while server.stat("ratelimit.rlqs.streams_slow").await != Some(1) {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream was not ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(server.stat("ratelimit.rlqs.streams_idle").await, Some(0));
    // Its place and bytes are free again: a new stream is served.
    let (again, mut fresh) = open(&server).await;
    send(&again, "q", vec![usage("free", "y", 1)]).await;
    assert!(fresh.message().await.unwrap().is_some());
    drop((reports, answers));
}

/// An Envoy that leaves gives back what it would not spend before its assignment expires
/// in it: the Envoy that stays gets it when it runs dry.
#[tokio::test]
async fn a_leaving_envoy_gives_back_its_unspent_share() {
    let options = Options::rules(RULES).set("RLQS_ASSIGNMENT_TTL", "1s");
    let server = Server::start_with(options);
    let (first, mut first_answers) = open(&server).await;
    send(&first, "q", vec![usage("user", "leaving", 3)]).await;
    // (Not `next`: it checks the default assignment TTL.)
    assert_eq!(next_tokens(&mut first_answers).await, [7]);
    let (second, mut second_answers) = open(&server).await;
    send(&second, "q", vec![usage("user", "leaving", 0)]).await;
    let held = "the first holds the window";
    assert_eq!(
        next_tokens(&mut second_answers).await,
        Vec::<u32>::new(),
        "{held}"
    );
    let given = "the first gave back above its even share";
    assert_eq!(next_tokens(&mut second_answers).await, [5], "{given}");
    drop((first, first_answers));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut denied = usage("user", "leaving", 5);
    denied.num_requests_denied = 1;
    send(&second, "q", vec![denied]).await;
    // The first kept 5 and used 3: 2 came back.
    assert_eq!(next_tokens(&mut second_answers).await, [2]);
}

/// The token buckets the next answer assigns (any assignment TTL).
async fn next_tokens(answers: &mut Streaming<RateLimitQuotaResponse>) -> Vec<u32> {
    let answer = tokio::time::timeout(Duration::from_secs(5), answers.message()).await;
    answer
        .expect("an answer in time")
        .unwrap()
        .unwrap()
        .bucket_action
        .into_iter()
        .filter_map(|action| match action.bucket_action? {
            Action::QuotaAssignmentAction(q) => match q.rate_limit_strategy?.strategy? {
                Strategy::TokenBucket(bucket) => Some(bucket.max_tokens),
                _ => None,
            },
            Action::AbandonAction(_) => None,
        })
        .collect()
}
