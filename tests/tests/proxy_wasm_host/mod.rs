//! A proxy-wasm host for tests: runs the built filter (`.wasm`) in wasmtime, with what Envoy
//! would give it, under the test's control. The host functions it provides are listed in
//! this folder's README.
//!
//! This file holds what a test drives (the plugin, its workers, their requests); the
//! host functions are defined by topic in [`context`], [`headers`], [`shared`] and
//! [`grpc`], on the guest-memory helpers of [`memory`].

mod context;
mod grpc;
mod headers;
mod memory;
mod shared;

use grpc::forward;

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wasmtime::{Config, Engine, FuncType, Instance, IntoFunc, Linker, Module, Store, Val, ValType};

// proxy-wasm ABI 0.2.1 values.
const OK: i32 = 0;
const NOT_FOUND: i32 = 1;
const BAD_ARGUMENT: i32 = 2;
const CAS_MISMATCH: i32 = 8;
const UNIMPLEMENTED: i32 = 12;
const REQUEST_HEADERS: i32 = 0;
const RESPONSE_HEADERS: i32 = 2;
const GRPC_RECEIVE_BUFFER: i32 = 5;
const VM_CONFIGURATION: i32 = 6;
const PLUGIN_CONFIGURATION: i32 = 7;
const ROOT_CONTEXT: i32 = 1;
/// gRPC status codes the host reports for a failed callout.
const GRPC_UNAVAILABLE: u32 = 14;
const GRPC_DEADLINE_EXCEEDED: u32 = 4;

/// State common to every worker VM of a plugin: shared data, the clock, metrics.
#[derive(Default)]
pub struct Shared {
    data: Mutex<HashMap<String, (Vec<u8>, u32)>>,
    next_cas: AtomicU64,
    clock_nanos: AtomicU64,
    metrics: Mutex<Vec<(String, i64)>>,
}

impl Shared {
    /// Number of shared-data entries.
    pub fn data_len(&self) -> usize {
        self.data.lock().unwrap().len()
    }

    /// Total size of shared-data keys and values, in bytes.
    pub fn data_bytes(&self) -> usize {
        self.data
            .lock()
            .unwrap()
            .iter()
            .map(|(k, (v, _))| k.len() + v.len())
            .sum()
    }

    /// The value of the metric called `name`, if it was defined.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.metrics
            .lock()
            .unwrap()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
    }
}

/// A compiled filter and the state its workers share.
pub struct Plugin {
    engine: Engine,
    module: Module,
    linker: Linker<Host>,
    pub shared: Arc<Shared>,
    /// gRPC clusters by name: where callouts to them are forwarded.
    upstreams: HashMap<String, String>,
}

impl Plugin {
    /// Compiles the filter at `path`, metering instructions with fuel.
    pub fn load(path: &Path) -> Plugin {
        let mut config = Config::new();
        config.consume_fuel(true);
        let engine = Engine::new(&config).unwrap();
        let module = Module::from_file(&engine, path).unwrap_or_else(|e| {
            panic!("cannot load {}: {e}", path.display());
        });
        let mut linker = Linker::new(&engine);
        define_host_functions(&mut linker);
        Plugin {
            engine,
            module,
            linker,
            shared: Arc::new(Shared::default()),
            upstreams: HashMap::new(),
        }
    }

    /// Forwards gRPC callouts for `cluster` to the server at `url` (`http://host:port`).
    pub fn upstream(&mut self, cluster: &str, url: &str) {
        self.upstreams.insert(cluster.to_owned(), url.to_owned());
    }

    /// Sets the clock every worker reads, in seconds since the epoch.
    pub fn set_time(&self, unix_seconds: u64) {
        self.shared
            .clock_nanos
            .store(unix_seconds * 1_000_000_000, Ordering::SeqCst);
    }

    /// Starts a worker VM configured with `configuration`; its log on refusal.
    pub fn worker(&self, configuration: &str) -> Result<Worker, String> {
        let host = Host {
            shared: self.shared.clone(),
            configuration: configuration.as_bytes().to_vec(),
            upstreams: self.upstreams.clone(),
            ..Host::default()
        };
        let mut store = Store::new(&self.engine, host);
        store.set_fuel(u64::MAX).unwrap();
        let instance = self.linker.instantiate(&mut store, &self.module).unwrap();
        let mut worker = Worker {
            store,
            instance,
            next_context: ROOT_CONTEXT as u32 + 1,
        };
        worker.call::<(), ()>("_initialize", ());
        worker.call::<(i32, i32), ()>("proxy_on_context_create", (ROOT_CONTEXT, 0));
        let size = configuration.len() as i32;
        let started = worker.call::<(i32, i32), i32>("proxy_on_vm_start", (ROOT_CONTEXT, 0));
        let configured = worker.call::<(i32, i32), i32>("proxy_on_configure", (ROOT_CONTEXT, size));
        if started == 0 || configured == 0 {
            return Err(worker.store.data().logs.join("\n"));
        }
        Ok(worker)
    }
}

/// What the host records for one worker VM.
#[derive(Default)]
pub struct Host {
    shared: Arc<Shared>,
    configuration: Vec<u8>,
    upstreams: HashMap<String, String>,
    request_headers: Vec<(String, String)>,
    response_headers: Vec<(String, String)>,
    properties: HashMap<String, Vec<u8>>,
    local_response: Option<LocalResponse>,
    resumed: bool,
    callouts: Vec<Callout>,
    next_token: u32,
    grpc_receive: Vec<u8>,
    metric_ids: Vec<usize>,
    pub logs: Vec<String>,
    pub tick_period_ms: u32,
}

/// A response the filter sent instead of letting the request through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalResponse {
    pub status: u32,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl LocalResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A gRPC call the filter dispatched.
#[derive(Clone, Debug)]
struct Callout {
    token: u32,
    cluster: String,
    service: String,
    method: String,
    message: Vec<u8>,
    timeout: Duration,
}

/// How a request ended.
#[derive(Debug)]
pub enum Outcome {
    /// Let through to the upstream; the headers the filter added to the response.
    Passed(Vec<(String, String)>),
    /// Answered by the filter.
    Local(LocalResponse),
}

impl Outcome {
    /// The local response, if the filter sent one.
    pub fn local(&self) -> Option<&LocalResponse> {
        match self {
            Outcome::Local(response) => Some(response),
            Outcome::Passed(_) => None,
        }
    }

    /// The status the client sees (200 from the upstream when the filter let it pass).
    pub fn status(&self) -> u32 {
        self.local().map_or(200, |r| r.status)
    }
}

/// One worker VM (Envoy runs one per worker thread).
pub struct Worker {
    store: Store<Host>,
    instance: Instance,
    next_context: u32,
}

impl Worker {
    fn call<P: wasmtime::WasmParams, R: wasmtime::WasmResults>(
        &mut self,
        name: &str,
        params: P,
    ) -> R {
        let function = self
            .instance
            .get_typed_func::<P, R>(&mut self.store, name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        function
            .call(&mut self.store, params)
            .unwrap_or_else(|e| panic!("{name} trapped: {e:?}"))
    }

    /// Runs one request with `headers` from `peer` (`ip:port`) through the filter, then
    /// the upstream's 200, forwarding gRPC callouts to the configured upstreams.
    pub fn request(&mut self, headers: &[(&str, &str)], peer: &str) -> Outcome {
        self.request_metered(headers, peer).0
    }

    /// Like [`Worker::request`], with the fuel `on_http_request_headers` burned (about
    /// one unit per wasm instruction).
    pub fn request_metered(&mut self, headers: &[(&str, &str)], peer: &str) -> (Outcome, u64) {
        let context = self.next_context as i32;
        self.next_context += 1;
        {
            let host = self.store.data_mut();
            host.request_headers = headers
                .iter()
                .map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned()))
                .collect();
            host.response_headers = vec![(":status".to_owned(), "200".to_owned())];
            host.properties
                .insert("source\0address".to_owned(), peer.as_bytes().to_vec());
            host.local_response = None;
            host.resumed = false;
        }
        self.call::<(i32, i32), ()>("proxy_on_context_create", (context, ROOT_CONTEXT));
        let before = self.store.get_fuel().unwrap();
        let action = self.call::<(i32, i32, i32), i32>(
            "proxy_on_request_headers",
            (context, headers.len() as i32, 1),
        );
        let fuel = before - self.store.get_fuel().unwrap();
        let mut passed = action == 0;
        if action != 0 && self.store.data().local_response.is_none() {
            for callout in std::mem::take(&mut self.store.data_mut().callouts) {
                self.deliver(context, &callout);
            }
            passed = self.store.data().resumed;
        }
        let outcome = match self.store.data_mut().local_response.take() {
            Some(response) => Outcome::Local(response),
            None => {
                assert!(
                    passed,
                    "the filter neither answered nor resumed the request"
                );
                self.call::<(i32, i32, i32), i32>("proxy_on_response_headers", (context, 1, 0));
                let mut added = std::mem::take(&mut self.store.data_mut().response_headers);
                added.remove(0);
                Outcome::Passed(added)
            }
        };
        self.call::<i32, i32>("proxy_on_done", context);
        self.call::<i32, ()>("proxy_on_log", context);
        self.call::<i32, ()>("proxy_on_delete", context);
        (outcome, fuel)
    }

    /// Forwards a callout to its upstream and hands the answer (or the failure) back.
    fn deliver(&mut self, context: i32, callout: &Callout) {
        assert_eq!(
            (callout.service.as_str(), callout.method.as_str()),
            (
                "envoy.service.ratelimit.v3.RateLimitService",
                "ShouldRateLimit"
            )
        );
        let url = self.store.data().upstreams.get(&callout.cluster).cloned();
        let answer = match url {
            Some(url) => forward(&url, &callout.message, callout.timeout),
            None => Err(GRPC_UNAVAILABLE),
        };
        let token = callout.token as i32;
        match answer {
            Ok(bytes) => {
                let size = bytes.len() as i32;
                self.store.data_mut().grpc_receive = bytes;
                self.call::<(i32, i32, i32), ()>("proxy_on_grpc_receive", (context, token, size));
            }
            Err(status) => {
                self.call::<(i32, i32, i32), ()>(
                    "proxy_on_grpc_close",
                    (context, token, status as i32),
                );
            }
        }
    }

    /// Fires the timer the filter asked for, and delivers the callouts it made to the
    /// root context.
    pub fn tick(&mut self) {
        self.call::<i32, ()>("proxy_on_tick", ROOT_CONTEXT);
        for callout in std::mem::take(&mut self.store.data_mut().callouts) {
            self.deliver(ROOT_CONTEXT, &callout);
        }
    }

    /// Callouts made since the last request or tick delivered them.
    pub fn waiting_callouts(&self) -> usize {
        self.store.data().callouts.len()
    }

    pub fn host(&self) -> &Host {
        self.store.data()
    }
}

/// Defines the host function `name` in module `env`.
fn host_function<Params, Args>(
    linker: &mut Linker<Host>,
    name: &str,
    function: impl IntoFunc<Host, Params, Args>,
) {
    linker.func_wrap("env", name, function).unwrap();
}

/// Every function the filter imports from `env`.
fn define_host_functions(linker: &mut Linker<Host>) {
    context::define(linker);
    headers::define(linker);
    shared::define(linker);
    grpc::define(linker);
    // Imported by the SDK but never called by this filter: answered as unimplemented,
    // so a filter change that starts using one fails loudly here.
    for (name, params) in [
        ("proxy_set_buffer_bytes", 5),
        ("proxy_set_property", 4),
        ("proxy_http_call", 10),
        ("proxy_grpc_stream", 9),
        ("proxy_grpc_send", 4),
        ("proxy_grpc_cancel", 1),
        ("proxy_grpc_close", 1),
        ("proxy_register_shared_queue", 3),
        ("proxy_resolve_shared_queue", 5),
        ("proxy_enqueue_shared_queue", 3),
        ("proxy_dequeue_shared_queue", 3),
        ("proxy_call_foreign_function", 6),
    ] {
        let signature = FuncType::new(
            linker.engine(),
            std::iter::repeat_n(ValType::I32, params),
            [ValType::I32],
        );
        linker
            .func_new("env", name, signature, |_, _, results| {
                results[0] = Val::I32(UNIMPLEMENTED);
                Ok(())
            })
            .unwrap();
    }
}
