//! Where the rules come from.

use clap::{ArgAction, Args};

use ratelimit_service_kit::values::go_bool;

/// Where the rules come from.
#[derive(Clone, Debug, Args)]
pub struct ConfigSettings {
    /// FILE or GRPC_XDS_SOTW.
    #[arg(long, env, default_value = "FILE", value_parser = config_type)]
    pub config_type: ConfigType,
    /// Root of the runtime tree (usually a symlink swapped on deploy).
    #[arg(long, env, default_value = "/srv/runtime_data/current")]
    pub runtime_root: String,
    /// Sub-directory of the root.
    #[arg(long, env, default_value = "")]
    pub runtime_subdirectory: String,
    /// Directory holding the YAML files, under root/sub-directory.
    #[arg(long, env, default_value = "config")]
    pub runtime_appdirectory: String,
    /// Skip files and directories whose name starts with a dot.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub runtime_ignoredotfiles: bool,
    /// true: reload when RUNTIME_ROOT is swapped; false: reload when files change.
    #[arg(long, env, default_value = "true", value_parser = go_bool, action = ArgAction::Set)]
    pub runtime_watch_root: bool,
    /// Let several files define the same domain.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub merge_domain_config: bool,
    /// Health fails until at least one domain is loaded.
    #[arg(long, env, default_value = "false", value_parser = go_bool, action = ArgAction::Set)]
    pub healthy_with_at_least_one_config_loaded: bool,
}

/// The configuration source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigType {
    /// YAML files under RUNTIME_ROOT.
    File,
    /// An xDS (SotW ADS) server.
    GrpcXdsSotw,
}

fn config_type(value: &str) -> Result<ConfigType, String> {
    match value {
        "FILE" => Ok(ConfigType::File),
        "GRPC_XDS_SOTW" => Ok(ConfigType::GrpcXdsSotw),
        _ => Err(format!("expected FILE or GRPC_XDS_SOTW; got '{value}'")),
    }
}
