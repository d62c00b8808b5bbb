//! Settings of features this version does not have yet, all in one place.
//!
//! They are parsed (a bad value still names the variable), but none of them may be set:
//! an explicit value stops start-up and names the setting, so that, say,
//! `MEMCACHE_TLS=true` never becomes a client that quietly speaks plaintext. A switch
//! set explicitly to off (`MEMCACHE_TLS=false`) is accepted: it asks for nothing. When a feature is built, its settings move to a module of their own.

use clap::{ArgAction, Args};

use super::values::go_bool;

/// The memcached backend's TLS.
#[derive(Clone, Debug, Args)]
pub struct UnbuiltSettings {
    /// Connect with TLS.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls: bool,
    /// Client certificate for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_cert: String,
    /// Client key for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_client_key: String,
    /// CA for memcached TLS.
    #[arg(long, env, default_value = "")]
    pub memcache_tls_cacert: String,
    /// Verify the chain but not the host name.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub memcache_tls_skip_hostname_verification: bool,
}

/// One message for each setting given a value (by `explicit`, which says whether the
/// setting with that id came from the environment or the command line), except switches
/// set to off.
pub fn explicitly_set(settings: &UnbuiltSettings, explicit: impl Fn(&str) -> bool) -> Vec<String> {
    UnbuiltSettings::augment_args(clap::Command::new("ratelimit"))
        .get_arguments()
        .filter(|arg| {
            explicit(arg.get_id().as_str()) && !asks_for_nothing(settings, arg.get_id().as_str())
        })
        .map(|arg| {
            let id = arg.get_id().as_str();
            let name = arg
                .get_env()
                .map_or_else(|| id.to_owned(), |env| env.to_string_lossy().into_owned());
            format!("{name}: memcached TLS is not available in this version; unset it")
        })
        .collect()
}

/// A switch set to off, which asks for nothing.
fn asks_for_nothing(settings: &UnbuiltSettings, id: &str) -> bool {
    match id {
        "memcache_tls" => !settings.memcache_tls,
        _ => false,
    }
}
