//! What the workspace's services share that is not rate limiting: the HTTP serve loop
//! with its connection bounds ([`serve`]), bounded request bodies ([`body`]), the one clock ([`clock`]), server TLS with certificate reload ([`tls`]),
//! the file watcher ([`watch`]), logging in upstream's formats ([`logging`]), Prometheus
//! text rendering through a statsd_exporter mapping ([`prometheus`]), the Go-style
//! environment-value parsers ([`values`]) and what a service logs when it loads rules
//! ([`announce`]). The sidecar and the intake both stand on it; neither on the other.

pub mod announce;
pub mod body;
pub mod clock;
pub mod logging;
pub mod prometheus;
pub mod serve;
pub mod tls;
pub mod values;
pub mod watch;
