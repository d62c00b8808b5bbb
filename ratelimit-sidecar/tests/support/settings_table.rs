//! Renders a clap command's settings as the Markdown tables of the docs, and checks (or,
//! with `UPDATE_DOCS=1`, rewrites) the generated block of a docs page. Shared by
//! `ratelimit-sidecar/tests/settings_reference.rs` and
//! `operations-intake/tests/settings_reference.rs` (through `#[path]`).

use std::path::Path;

/// One table per help heading (untitled for arguments without one), in the order clap
/// lists the arguments: every argument read from an environment variable, with its flag,
/// its default and the first paragraph of its help.
pub fn render(command: &clap::Command) -> String {
    let mut groups: Vec<(Option<String>, Vec<String>)> = Vec::new();
    for arg in command.get_arguments() {
        let Some(env) = arg.get_env() else { continue };
        let env = env.to_string_lossy();
        let flag = match arg.get_long() {
            Some(long) => format!("`--{long}`"),
            None => "–".to_string(),
        };
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        let default = match defaults.as_slice() {
            [] => "(unset)".to_string(),
            [value] if value.is_empty() => "(empty)".to_string(),
            values => format!("`{}`", values.join(",")),
        };
        let help = arg
            .get_help()
            .map(|help| help.to_string())
            .unwrap_or_default();
        let help = help.split("\n\n").next().unwrap_or_default();
        let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
        let row = format!(
            "| `{env}` | {flag} | {default} | {} |",
            markdown_cell(&help)
        );
        let heading = arg.get_help_heading().map(str::to_string);
        match groups.iter_mut().find(|(name, _)| *name == heading) {
            Some((_, rows)) => rows.push(row),
            None => groups.push((heading, vec![row])),
        }
    }
    let mut out = String::new();
    for (heading, rows) in groups {
        if let Some(heading) = heading {
            out.push_str(&format!("\n**{heading}**\n"));
        }
        out.push_str("\n| variable | flag | default | meaning |\n|---|---|---|---|\n");
        for row in rows {
            out.push_str(&row);
            out.push('\n');
        }
    }
    out
}

/// Help text as a table cell: `|` escaped, and `<` outside code spans too (it would open
/// an HTML tag: `DOG_STATSD_MOGRIFIER_<NAME>_PATTERN`).
fn markdown_cell(text: &str) -> String {
    let mut out = String::new();
    for (index, part) in text.split('`').enumerate() {
        if index > 0 {
            out.push('`');
        }
        if index % 2 == 0 {
            out.push_str(&part.replace('<', "&lt;"));
        } else {
            out.push_str(part);
        }
    }
    out.replace('|', "\\|")
}

/// The environment variables `render` lists.
pub fn variables(command: &clap::Command) -> Vec<String> {
    command
        .get_arguments()
        .filter_map(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
        .collect()
}

/// Compares the block between `<!-- {marker}:begin -->` and `<!-- {marker}:end -->` in
/// `page` with `generated`; with `UPDATE_DOCS` set, rewrites it instead.
pub fn check_block(page: &Path, marker: &str, generated: &str, regenerate: &str) {
    let text = std::fs::read_to_string(page)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", page.display()));
    let begin = format!("<!-- {marker}:begin -->");
    let end = format!("<!-- {marker}:end -->");
    let (Some(start), Some(stop)) = (text.find(&begin), text.find(&end)) else {
        panic!(
            "{} has no `{begin}` … `{end}` block: add the two markers and run `{regenerate}`",
            page.display()
        );
    };
    assert!(
        start < stop,
        "{}: `{end}` comes before `{begin}`",
        page.display()
    );
    let inner_start = start + begin.len();
    let block = format!(
        "\n<!-- Generated from the clap definitions by `{regenerate}`; edit the doc comments, not this table. -->\n{generated}\n"
    );
    if text[inner_start..stop] == block {
        return;
    }
    if std::env::var_os("UPDATE_DOCS").is_some() {
        let updated = format!("{}{block}{}", &text[..inner_start], &text[stop..]);
        std::fs::write(page, updated)
            .unwrap_or_else(|error| panic!("cannot write {}: {error}", page.display()));
        return;
    }
    let old: Vec<&str> = text[inner_start..stop].lines().collect();
    let new: Vec<&str> = block.lines().collect();
    let line = old
        .iter()
        .zip(&new)
        .position(|(a, b)| a != b)
        .unwrap_or(old.len().min(new.len()));
    panic!(
        "{} disagrees with `--help` (the clap definitions): its generated block differs at \
         line {} of the block\n  page:      {}\n  generated: {}\nRegenerate it with `{regenerate}`.",
        page.display(),
        line + 1,
        old.get(line).unwrap_or(&"(end of block)"),
        new.get(line).unwrap_or(&"(end of block)"),
    );
}

/// Fails unless each of `variables` has exactly one table row in docs/: the one in the
/// `marker` block. Rows in other generated blocks (another service's settings of the same
/// name) are that service's; any other row is a second, hand-written entry.
pub fn check_documented_once(docs: &Path, marker: &str, variables: &[String]) {
    let own = format!("<!-- {marker}:begin -->");
    let mut pages: Vec<_> = std::fs::read_dir(docs)
        .unwrap_or_else(|error| panic!("cannot list {}: {error}", docs.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    pages.sort();
    let mut rows = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        // None: outside every generated block; Some(true): in ours; Some(false): another's.
        let mut block: Option<bool> = None;
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.starts_with("<!-- ") && line.ends_with(":begin -->") {
                block = Some(line == own);
                continue;
            }
            if line.starts_with("<!-- ") && line.ends_with(":end -->") {
                block = None;
                continue;
            }
            if block == Some(false) {
                continue;
            }
            for variable in variables {
                if line.starts_with(&format!("| `{variable}` |")) {
                    rows.entry(variable.as_str()).or_default().push(format!(
                        "{}:{}{}",
                        page.display(),
                        number + 1,
                        if block == Some(true) {
                            " (generated)"
                        } else {
                            ""
                        }
                    ));
                }
            }
        }
    }
    let mut problems = Vec::new();
    for variable in variables {
        match rows.get(variable.as_str()) {
            Some(places) if places.len() == 1 && places[0].ends_with("(generated)") => {}
            Some(places) => problems.push(format!("{variable}: {}", places.join(", "))),
            None => problems.push(format!("{variable}: in no table")),
        }
    }
    assert!(
        problems.is_empty(),
        "every setting has exactly one row in docs/, in its generated table; these do not:\n  {}",
        problems.join("\n  ")
    );
}
