//! docs/settings.md's tables of the sidecar's settings are generated from the clap
//! definitions (`ratelimit --help` reads the same ones), so the page cannot drift from the
//! binary: this test fails when they disagree, or when a setting has a second,
//! hand-written row anywhere in docs/.
//!
//! `UPDATE_DOCS=1 cargo test -p ratelimit-sidecar --test settings_reference` rewrites the
//! block between `<!-- settings:begin -->` and `<!-- settings:end -->`.

#[path = "support/settings_table.rs"]
mod settings_table;

use std::path::PathBuf;

use clap::CommandFactory;
use ratelimit_sidecar::settings::Settings;

const REGENERATE: &str = "UPDATE_DOCS=1 cargo test -p ratelimit-sidecar --test settings_reference";

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

#[test]
fn docs_settings_page_matches_the_clap_definitions() {
    let command = Settings::command();
    let table = settings_table::render(&command);
    settings_table::check_block(&docs().join("settings.md"), "settings", &table, REGENERATE);
}

#[test]
fn every_setting_is_documented_once() {
    let command = Settings::command();
    let variables = settings_table::variables(&command);
    assert!(variables.len() > 100, "{} settings", variables.len());
    settings_table::check_documented_once(&docs(), "settings", &variables);
}
