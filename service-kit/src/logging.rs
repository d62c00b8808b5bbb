//! Log lines in envoyproxy/ratelimit's shapes: `time=… level=… msg=…` text, or JSON with
//! `@timestamp`, `level` and `@message`.

use std::fmt;
use std::time::SystemTime;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Log line format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `time=… level=… msg=…` lines.
    Text,
    /// JSON lines with `@timestamp`, `level` and `@message`.
    Json,
}

/// LOG_FORMAT as upstream reads it: `json` in any case is JSON, anything else text.
pub fn lenient_format(value: &str) -> Result<LogFormat, String> {
    Ok(match value.eq_ignore_ascii_case("json") {
        true => LogFormat::Json,
        false => LogFormat::Text,
    })
}

/// Installs the global subscriber for the sidecar. `level` is one of
/// envoyproxy/ratelimit's level names.
pub fn init(level: &str, format: LogFormat) {
    init_for(
        level,
        format,
        &["ratelimit", "ratelimit_sidecar", "ratelimit_core"],
    );
}

/// Installs the global subscriber: `targets` (crate names) log at `level`, every other
/// crate at warn.
pub fn init_for(level: &str, format: LogFormat, targets: &[&str]) {
    let ours = match level {
        "panic" | "fatal" | "error" => Level::ERROR,
        "warn" | "warning" => Level::WARN,
        "info" => Level::INFO,
        "debug" => Level::DEBUG,
        _ => Level::TRACE,
    };
    // The libraries' own debug output (HTTP/2 frames) would drown ours: they stay at warn.
    let directives: String = targets.iter().map(|t| format!(",{t}={ours}")).collect();
    let filter = EnvFilter::new(format!("warn{directives}"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(Lines(format))
        .try_init();
}

struct Lines(LogFormat);

#[derive(Default)]
struct Fields {
    message: String,
    others: Map<String, Value>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.others
                .insert(field.name().to_owned(), Value::String(value.to_owned()));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let time = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
        let level = event.metadata().level().as_str().to_ascii_lowercase();
        match self.0 {
            LogFormat::Json => {
                let mut line = Map::new();
                line.insert("@timestamp".into(), Value::String(time));
                line.insert("level".into(), Value::String(level));
                line.insert("@message".into(), Value::String(fields.message));
                line.extend(fields.others);
                writeln!(writer, "{}", Value::Object(line))
            }
            LogFormat::Text => {
                write!(
                    writer,
                    "time=\"{time}\" level={level} msg={:?}",
                    fields.message
                )?;
                for (key, value) in fields.others {
                    match value {
                        Value::String(s) => write!(writer, " {key}={s:?}")?,
                        other => write!(writer, " {key}={other}")?,
                    }
                }
                writeln!(writer)
            }
        }
    }
}
