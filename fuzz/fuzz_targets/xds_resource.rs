//! An xDS `RateLimitConfig` resource, protobuf-decoded from arbitrary bytes (as the
//! sidecar's xDS client receives it), turned into YAML rules and loaded.
//!
//! Invariants: nothing panics; a resource that loads survives the way back (its rules
//! as a resource again, then YAML again) unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use ratelimit_core::Config;
use ratelimit_proto::xds::pb::RateLimitConfig;
use ratelimit_proto::xds::{from_domain, to_yaml};

fuzz_target!(|data: &[u8]| {
    let Ok(resource) = RateLimitConfig::decode(data) else {
        return;
    };
    let Ok(config) = Config::from_yaml("resource", &to_yaml(&resource)) else {
        return;
    };
    for domain in config.domains() {
        let (again, _) = from_domain(&domain.domain, domain);
        let reloaded =
            Config::from_yaml("again", &to_yaml(&again)).expect("loaded rules load again");
        assert_eq!(reloaded.domains(), std::slice::from_ref(domain));
    }
});
