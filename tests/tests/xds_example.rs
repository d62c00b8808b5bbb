//! The example xDS control plane (`examples/xds-server`) as a process: it publishes the
//! rules it starts with, then one version per edit of its directory, and nothing while
//! the files stay as they are (reading them to publish is no edit).

use std::time::{Duration, Instant};

use ratelimit_tests::faults::xds::ControlPlane;

const RULES: &str = "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";

/// The versions `plane` has published so far.
fn versions(plane: &ControlPlane) -> usize {
    plane.log().matches("publishing version").count()
}

/// Waits up to 10 s for `plane` to have published `count` versions.
fn wait_for_versions(plane: &ControlPlane, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while versions(plane) < count && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(versions(plane) >= count, "log:\n{}", plane.log());
}

#[test]
fn one_edit_of_the_rules_publishes_one_version() {
    let plane = ControlPlane::start(RULES);
    wait_for_versions(&plane, 1);
    plane.write(&RULES.replace("5}", "6}"));
    wait_for_versions(&plane, 2);
    // Publishing reads the files; those reads must not count as edits. The watcher's
    // 200 ms debounce gives a loop several turns in this time.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(versions(&plane), 2, "log:\n{}", plane.log());
    // Writing the same rules again is an event, but no new version.
    plane.write(&RULES.replace("5}", "6}"));
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(versions(&plane), 2, "log:\n{}", plane.log());
}
