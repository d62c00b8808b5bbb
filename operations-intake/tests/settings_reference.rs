//! docs/intake.md's table of the intake's settings is generated from the clap definitions
//! (`operations-intake --help` reads the same ones), so the page cannot drift from the
//! binary: this test fails when they disagree, or when a setting has a second,
//! hand-written row anywhere in docs/.
//!
//! `UPDATE_DOCS=1 cargo test -p operations-intake --test settings_reference` rewrites the
//! block between `<!-- intake-settings:begin -->` and `<!-- intake-settings:end -->`.

#[path = "../../ratelimit-sidecar/tests/support/settings_table.rs"]
mod settings_table;

use std::path::PathBuf;

use clap::CommandFactory;
use operations_intake::settings::Settings;

const REGENERATE: &str = "UPDATE_DOCS=1 cargo test -p operations-intake --test settings_reference";

fn docs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

#[test]
fn docs_intake_page_matches_the_clap_definitions() {
    let command = Settings::command();
    let table = settings_table::render(&command);
    settings_table::check_block(
        &docs().join("intake.md"),
        "intake-settings",
        &table,
        REGENERATE,
    );
}

#[test]
fn every_setting_is_documented_once() {
    let command = Settings::command();
    let variables = settings_table::variables(&command);
    assert!(variables.len() > 30, "{} settings", variables.len());
    settings_table::check_documented_once(&docs(), "intake-settings", &variables);
}
