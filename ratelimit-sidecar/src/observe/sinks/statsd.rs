//! statsd and DogStatsD: each flush sends counters as differences since the last flush
//! (none when nothing changed), gauges as levels, and timers as whole-millisecond `ms`
//! samples, one line per duration as upstream sends them, or, past [`TIMER_LINES`] in a
//! flush, one line per histogram bucket with a sample rate, so a flush is bounded however
//! busy the server was.

use std::io::Write as _;
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::time::Duration;

use ratelimit_core::stats::{Deltas, Snapshot, Value};

use super::Push;
use super::mogrifier::{Mogrifier, mogrify};

/// Largest UDP datagram sent: what fits a typical path MTU.
const MAX_DATAGRAM: usize = 1432;
/// Up to this many durations a flush, a timer sends one line per duration, as upstream
/// does; past it, one line per histogram bucket with a sample rate.
const TIMER_LINES: u64 = 1_000;
/// How long connecting or writing may take before a flush is dropped.
const NETWORK_TIMEOUT: Duration = Duration::from_secs(2);

/// How tags are written.
#[derive(Debug)]
pub enum Format {
    /// statsd, as gostats writes tags: `name.__key=value`.
    Plain,
    /// DogStatsD: `name:1|c|#key:value`, after the mogrifiers.
    Dog(Vec<Mogrifier>),
}

/// How lines reach the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// One connection, kept open and reopened after an error.
    Tcp,
    /// Datagrams of whole lines.
    Udp,
}

/// A statsd or DogStatsD output.
#[derive(Debug)]
pub struct Statsd {
    format: Format,
    protocol: Protocol,
    address: String,
    tags: Vec<(String, String)>,
    deltas: Deltas,
    tcp: Option<TcpStream>,
    failing: bool,
}

impl Statsd {
    /// Sends to `host:port`, with `tags` on every line: as upstream's statsd client keeps
    /// them, a tag with an empty key or value is left out, and `.`, `:` and `|` in a
    /// value (which would end the name or the line) become `_`.
    pub fn new(
        format: Format,
        protocol: Protocol,
        address: String,
        tags: Vec<(String, String)>,
    ) -> Statsd {
        let clean = |value: String| value.replace(['.', ':', '|'], "_");
        Statsd {
            format,
            protocol,
            address,
            tags: tags
                .into_iter()
                .filter(|(key, value)| !key.is_empty() && !value.is_empty())
                .map(|(key, value)| (key, clean(value)))
                .collect(),
            deltas: Deltas::default(),
            tcp: None,
            failing: false,
        }
    }

    /// The lines of one flush.
    pub fn render(&mut self, snapshot: &Snapshot) -> Vec<String> {
        let mut lines = Vec::new();
        for sample in &snapshot.samples {
            // A value with a line break would start a line of its own.
            let name: String = sample
                .name
                .to_string()
                .chars()
                .map(|c| if c.is_control() { '_' } else { c })
                .collect();
            match &sample.value {
                Value::Counter(value) => {
                    let delta = self.deltas.counter(&sample.name, *value);
                    if delta > 0 {
                        lines.push(self.line(&name, &delta.to_string(), "c", None));
                    }
                }
                Value::Gauge(value) => lines.push(self.line(&name, &value.to_string(), "g", None)),
                Value::Timer(reading) => {
                    let interval = self.deltas.timer(&sample.name, reading);
                    let durations: u64 = interval.representatives().map(|(_, n)| n).sum();
                    for (us, count) in interval.representatives() {
                        // Whole milliseconds, as upstream records them.
                        let ms = (us / 1_000).to_string();
                        if durations <= TIMER_LINES {
                            let line = self.line(&name, &ms, "ms", None);
                            lines.extend(std::iter::repeat_n(line, count as usize));
                        } else {
                            let rate = (count > 1).then(|| (1.0 / count as f64).to_string());
                            lines.push(self.line(&name, &ms, "ms", rate.as_deref()));
                        }
                    }
                }
            }
        }
        lines
    }

    fn line(&self, name: &str, value: &str, kind: &str, rate: Option<&str>) -> String {
        let rate = rate.map(|r| format!("|@{r}")).unwrap_or_default();
        match &self.format {
            Format::Plain => {
                let tags: String = self
                    .tags
                    .iter()
                    .map(|(k, v)| format!(".__{k}={v}"))
                    .collect();
                format!("{name}{tags}:{value}|{kind}{rate}")
            }
            Format::Dog(mogrifiers) => {
                let (name, extra) = mogrify(mogrifiers, name);
                let mut tags: Vec<String> =
                    self.tags.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                tags.extend(extra);
                let tags = if tags.is_empty() {
                    String::new()
                } else {
                    format!("|#{}", tags.join(","))
                };
                format!("{name}:{value}|{kind}{rate}{tags}")
            }
        }
    }

    fn send(&mut self, lines: &[String]) -> std::io::Result<()> {
        match self.protocol {
            Protocol::Udp => {
                let socket = UdpSocket::bind(("0.0.0.0", 0))?;
                socket.connect(&self.address)?;
                for datagram in datagrams(lines) {
                    socket.send(datagram.as_bytes())?;
                }
                Ok(())
            }
            Protocol::Tcp => {
                if self.tcp.is_none() {
                    let address =
                        self.address.to_socket_addrs()?.next().ok_or_else(|| {
                            std::io::Error::other("the name resolves to no address")
                        })?;
                    let stream = TcpStream::connect_timeout(&address, NETWORK_TIMEOUT)?;
                    stream.set_write_timeout(Some(NETWORK_TIMEOUT))?;
                    self.tcp = Some(stream);
                }
                let mut payload = lines.join("\n");
                payload.push('\n');
                let result = self
                    .tcp
                    .as_mut()
                    .map_or(Ok(()), |s| s.write_all(payload.as_bytes()));
                if result.is_err() {
                    self.tcp = None;
                }
                result
            }
        }
    }
}

impl Push for Statsd {
    fn flush(&mut self, snapshot: &Snapshot) {
        let lines = self.render(snapshot);
        if lines.is_empty() {
            return;
        }
        match self.send(&lines) {
            Ok(()) if self.failing => {
                self.failing = false;
                tracing::info!(address = %self.address, "statistics reach the statsd collector again");
            }
            Ok(()) => {}
            Err(error) if !self.failing => {
                self.failing = true;
                tracing::warn!(address = %self.address, %error, "statistics could not be sent to the statsd collector; this flush is dropped, and later ones are retried");
            }
            Err(_) => {}
        }
    }
}

/// Whole lines packed into datagrams of at most [`MAX_DATAGRAM`] bytes (a longer line
/// goes alone).
fn datagrams(lines: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in lines {
        match out.last_mut() {
            Some(last) if last.len() + 1 + line.len() <= MAX_DATAGRAM => {
                last.push('\n');
                last.push_str(line);
            }
            _ => out.push(line.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use ratelimit_core::stats::{StatsRegistry, names};

    use super::*;

    #[test]
    fn counters_are_sent_as_differences_and_timers_one_line_a_duration_up_to_a_bound() {
        let registry = StatsRegistry::default();
        registry.rule("edge.user").add_not_within(3);
        registry.counter(names::CONFIG_LOAD_SUCCESS).add(1);
        registry.rule("edge.path_a\nb").add_not_within(1);
        registry.gauge("ratelimit.memory.counters", Arc::new(|| 4));
        let timer = registry.timer(&names::response_time("ShouldRateLimit"));
        timer.record(Duration::from_micros(70));
        timer.record(Duration::from_micros(80));
        let tags = vec![("env".to_owned(), "test".to_owned())];
        let mut statsd = Statsd::new(Format::Plain, Protocol::Udp, String::new(), tags);
        let lines = statsd.render(&registry.snapshot());
        for expected in [
            "ratelimit.service.rate_limit.edge.user.total_hits.__env=test:3|c",
            "ratelimit.service.config_load_success.__env=test:1|c",
            "ratelimit.service.rate_limit.edge.path_a_b.total_hits.__env=test:1|c",
            "ratelimit.memory.counters.__env=test:4|g",
        ] {
            assert!(
                lines.contains(&expected.to_owned()),
                "{expected} not in {lines:?}"
            );
        }
        assert!(
            !lines.iter().any(|l| l.contains("over_limit")),
            "zero differences are not sent: {lines:?}"
        );
        let timed = "ratelimit_server.ShouldRateLimit.response_time.__env=test:0|ms";
        assert_eq!(lines.iter().filter(|l| *l == timed).count(), 2, "{lines:?}");
        // Past the bound, one line per bucket stands for its durations.
        (0..=TIMER_LINES).for_each(|_| timer.record(Duration::from_micros(2_500)));
        let lines = statsd.render(&registry.snapshot());
        let sampled: Vec<_> = lines.iter().filter(|l| l.contains("|ms")).collect();
        assert_eq!(sampled.len(), 1, "{sampled:?}");
        assert!(
            sampled[0].ends_with(&format!("|ms|@{}", 1.0 / 1_001.0)),
            "{sampled:?}"
        );

        registry.rule("edge.user").add_not_within(2);
        let lines = statsd.render(&registry.snapshot());
        assert!(lines.contains(
            &"ratelimit.service.rate_limit.edge.user.total_hits.__env=test:2|c".to_owned()
        ));
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("config_load") || l.contains("|ms")),
            "{lines:?}"
        );
    }

    #[test]
    fn dogstatsd_lines_carry_tags_after_the_type() {
        let registry = StatsRegistry::default();
        registry.rule("edge.user").over_limit.add(1);
        let mut dog = Statsd::new(
            Format::Dog(Vec::new()),
            Protocol::Udp,
            String::new(),
            vec![
                ("a".into(), "b.1:2|3".into()),
                ("empty".into(), String::new()),
            ],
        );
        let lines = dog.render(&registry.snapshot());
        // A tag value is cleaned of what would end a name or a line, as upstream's client
        // cleans it, and an empty one is left out.
        let tagged = "ratelimit.service.rate_limit.edge.user.over_limit:1|c|#a:b_1_2_3";
        assert!(lines.contains(&tagged.to_owned()), "{lines:?}");
    }

    #[test]
    fn datagrams_hold_whole_lines() {
        let lines: Vec<String> = (0..100)
            .map(|i| format!("some.statistic.{i:03}:1|c"))
            .collect();
        let packed = datagrams(&lines);
        assert!(packed.len() > 1);
        assert!(packed.iter().all(|d| d.len() <= MAX_DATAGRAM));
        assert_eq!(packed.join("\n").split('\n').collect::<Vec<_>>(), lines);
    }
}
