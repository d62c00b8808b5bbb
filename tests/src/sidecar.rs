//! Starts the real `ratelimit` binary on free loopback ports with a runtime directory of
//! its own, and talks to it over gRPC and HTTP.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

pub use crate::calls::{ask, get_text, post, run_ok};
pub use crate::redis::{Redis, redis_addresses, redis_cluster, redis_env};
pub use crate::{binary, eventually, free_port};

/// Runs the test `$name(store: &Store)` on the shared stores, on a runtime of two
/// threads: a real Redis (`$name::redis`) and a real memcached (`$name::memcache`).
#[macro_export]
macro_rules! on_remote_backends {
    ($name:ident) => {
        mod $name {
            use $crate::sidecar::Store;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                super::$name(&Store::Redis($crate::sidecar::Redis::start(&[]))).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memcache() {
                super::$name(&Store::Memcached($crate::memcached::Memcached::start())).await;
            }
        }
    };
}

/// Runs the test `$name(store: &Store)` on every backend: the memory backend
/// (`$name::memory`), a real Redis (`$name::redis`) and a real memcached
/// (`$name::memcache`).
#[macro_export]
macro_rules! on_every_backend {
    ($name:ident) => {
        mod $name {
            use $crate::sidecar::Store;

            #[tokio::test]
            async fn memory() {
                super::$name(&Store::Memory).await;
            }

            #[tokio::test]
            async fn redis() {
                super::$name(&Store::Redis($crate::sidecar::Redis::start(&[]))).await;
            }

            #[tokio::test]
            async fn memcache() {
                super::$name(&Store::Memcached($crate::memcached::Memcached::start())).await;
            }
        }
    };
}

/// Where a shared test's server keeps its counters.
pub enum Store {
    /// The embedded memory backend.
    Memory,
    /// A real Redis.
    Redis(Redis),
    /// A real memcached.
    Memcached(crate::memcached::Memcached),
}

impl Store {
    /// The server's settings for this store.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::Memory => Vec::new(),
            Store::Redis(redis) => redis_env(redis.port),
            Store::Memcached(memcached) => vec![
                ("BACKEND_TYPE", "memcache".into()),
                ("MEMCACHE_HOST_PORT", memcached.address()),
                ("EXPIRATION_JITTER_MAX_SECONDS", "0".into()),
            ],
        }
    }

    /// The backend's name, as the server reports it.
    pub fn name(&self) -> &'static str {
        match self {
            Store::Memory => "memory",
            Store::Redis(_) => "redis",
            Store::Memcached(_) => "memcache",
        }
    }
}

/// The server the suites start: `RATELIMIT_SERVER_BIN` when set (bench/upstream/run.sh
/// runs suites against envoyproxy/ratelimit's binary that way), else the workspace's
/// `ratelimit`.
pub fn server_binary() -> PathBuf {
    std::env::var_os("RATELIMIT_SERVER_BIN").map_or_else(|| binary("ratelimit"), PathBuf::from)
}

/// A running server and its runtime directory (`root/current -> root/v1`).
pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub http: u16,
    pub grpc: u16,
    pub debug: u16,
    pub uds: Option<PathBuf>,
    log: PathBuf,
}

/// How to start a server.
#[derive(Clone)]
pub struct Options {
    pub files: Vec<(&'static str, String)>,
    pub env: Vec<(&'static str, String)>,
    pub watch_root: bool,
    pub uds: bool,
    /// Symbolic links made in the config directory before the start: (name, target).
    pub links: Vec<(String, String)>,
    /// A limit on the server's open files (RLIMIT_NOFILE), set with `prlimit`.
    pub nofile: Option<u32>,
    /// Start in the runtime directory with `RUNTIME_ROOT=current`, a relative path.
    pub relative_root: bool,
    /// Another server binary to start with the same settings (envoyproxy/ratelimit's, to
    /// compare: bench/upstream/run.sh); else [`server_binary`].
    pub binary: Option<PathBuf>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            files: Vec::new(),
            env: Vec::new(),
            watch_root: true,
            uds: false,
            links: Vec::new(),
            nofile: None,
            relative_root: false,
            binary: None,
        }
    }
}

impl Server {
    /// Starts a server on `files` with the memory backend and waits until it answers.
    pub fn start(files: &[(&'static str, &str)]) -> Server {
        Server::start_with(Options {
            files: files.iter().map(|(n, t)| (*n, (*t).to_owned())).collect(),
            ..Options::default()
        })
    }

    pub fn start_with(options: Options) -> Server {
        // A port found free can be taken before the server binds it (another test's
        // outgoing connection gets it as its own port): start again on fresh ports when
        // that is why the server stopped.
        for _ in 0..3 {
            let mut server = Server::spawn(options.clone());
            match server.wait_ready() {
                Ok(()) => return server,
                Err(log) if log.contains("cannot listen") => continue,
                Err(log) => panic!("server did not start; log:\n{log}"),
            }
        }
        panic!("server could not listen on free ports three times");
    }

    /// Starts without waiting (for start-up failures).
    pub fn spawn(options: Options) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("v1/config");
        std::fs::create_dir_all(&config).unwrap();
        for (name, text) in &options.files {
            let path = config.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        for (name, target) in &options.links {
            let link = config.join(name);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, link).unwrap();
        }
        std::os::unix::fs::symlink(dir.path().join("v1"), dir.path().join("current")).unwrap();
        let (http, grpc, debug) = (free_port(), free_port(), free_port());
        // A port the options choose (a restart on the same port) wins.
        let grpc = options
            .env
            .iter()
            .find(|(key, _)| *key == "GRPC_PORT")
            .and_then(|(_, port)| port.parse().ok())
            .unwrap_or(grpc);
        let uds = options.uds.then(|| dir.path().join("grpc.sock"));
        let log = dir.path().join("server.log");
        // Upstream's loader reads nothing when it watches the root with an empty
        // RUNTIME_SUBDIRECTORY (this layout): another binary watches the config directory.
        let foreign =
            options.binary.is_some() || std::env::var_os("RATELIMIT_SERVER_BIN").is_some();
        let watch_root = options.watch_root && !foreign;
        let binary = options.binary.clone().unwrap_or_else(server_binary);
        let mut command = match options.nofile {
            Some(n) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={n}:{n}"))
                    .arg("--")
                    .arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("DEBUG_HOST", "127.0.0.1")
            .env("PORT", http.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .env("DEBUG_PORT", debug.to_string())
            .env("BACKEND_TYPE", "memory")
            .env("USE_STATSD", "false")
            .env("LOG_LEVEL", "debug")
            .env(
                "RUNTIME_ROOT",
                if options.relative_root {
                    PathBuf::from("current")
                } else {
                    dir.path().join("current")
                },
            )
            .env("RUNTIME_SUBDIRECTORY", "")
            .env("RUNTIME_APPDIRECTORY", "config")
            .env("RUNTIME_WATCH_ROOT", watch_root.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(path) = &uds {
            command.env("GRPC_UDS", path);
        }
        if options.relative_root {
            command.current_dir(dir.path());
        }
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let child = command.spawn().expect("the ratelimit binary starts");
        Server {
            child: Some(child),
            dir,
            http,
            grpc,
            debug,
            uds,
            log,
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for the listeners; the log when the server exits or takes over 20 s. The HTTP
    /// port is seen listening without a connection to it, which would hold one of its
    /// capped slots for a while after this returns (until a worker, maybe one that starts
    /// late, accepts it and sees it closed): a test of the cap would find one slot fewer.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let grpc_ready = match &self.uds {
                Some(path) => std::os::unix::net::UnixStream::connect(path).is_ok(),
                None => std::net::TcpStream::connect(("127.0.0.1", self.grpc)).is_ok(),
            };
            if crate::listening(self.http) && grpc_ready {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() {
                return Err(self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(self.log())
    }

    /// Waits for the process to exit by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Sends a signal (`TERM`, `INT`, …).
    pub fn signal(&self, name: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        Command::new("kill")
            .args(["-s", name, &pid])
            .status()
            .unwrap();
    }

    /// The config directory served (under the `current` link).
    pub fn config_dir(&self) -> PathBuf {
        self.dir.path().join("v1/config")
    }

    /// Replaces the `current` link by a new version holding `files` (a symlink swap).
    pub fn swap_root(&self, version: &str, files: &[(&str, &str)]) {
        let config = self.dir.path().join(version).join("config");
        std::fs::create_dir_all(&config).unwrap();
        for (name, text) in files {
            std::fs::write(config.join(name), text).unwrap();
        }
        let tmp = self.dir.path().join("current.tmp");
        std::os::unix::fs::symlink(self.dir.path().join(version), &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("current")).unwrap();
    }

    pub async fn client(&self) -> RateLimitServiceClient<Channel> {
        client_on(self.grpc).await
    }

    /// A client on a new connection to the unix socket (`Options::uds`).
    pub async fn uds_client(&self) -> RateLimitServiceClient<Channel> {
        let path = self.uds.clone().expect("started with a unix socket");
        let channel = tonic::transport::Endpoint::from_static("http://uds")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move {
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                        tokio::net::UnixStream::connect(path).await?,
                    ))
                }
            }))
            .await
            .unwrap();
        RateLimitServiceClient::new(channel)
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn http_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.http)
    }

    pub fn debug_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.debug)
    }

    /// `/stats` as a list of lines.
    pub async fn stat(&self, name: &str) -> Option<u64> {
        let body = reqwest::get(self.debug_url("/stats"))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        body.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}: "))
                .and_then(|v| v.parse().ok())
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A request for `domain` with descriptors given as `(key, value)` lists.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).to_owned(),
                        value: (*v).to_owned(),
                    })
                    .collect(),
                ..RateLimitDescriptor::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

/// A client on a new connection to the gRPC port `port` on loopback.
pub async fn client_on(port: u16) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap()
}

/// The `requests_per_unit` of the limit applied to a one-descriptor request, if any.
pub async fn limit_of(server: &Server, domain: &str, entries: &[(&str, &str)]) -> Option<u32> {
    let mut client = server.client().await;
    let response = client
        .should_rate_limit(request(domain, &[entries]))
        .await
        .unwrap()
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|l| l.requests_per_unit)
}

/// `(code, remaining)` of each status.
pub fn codes(response: &RateLimitResponse) -> Vec<(i32, u32)> {
    response
        .statuses
        .iter()
        .map(|s| (s.code, s.limit_remaining))
        .collect()
}
