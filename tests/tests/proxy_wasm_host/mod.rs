//! A proxy-wasm host for tests: runs the built filter (`.wasm`) in wasmtime, with what Envoy
//! would give it, under the test's control. The host functions it provides are listed in
//! this folder's README.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use prost::Message;
use wasmtime::{
    Caller, Config, Engine, Extern, FuncType, Instance, Linker, Module, Store, Val, ValType,
};

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

    /// Fires the timer the filter asked for.
    pub fn tick(&mut self) {
        self.call::<i32, ()>("proxy_on_tick", ROOT_CONTEXT);
    }

    pub fn host(&self) -> &Host {
        self.store.data()
    }
}

/// Calls the rate-limit service at `url` with the filter's serialized request; the
/// serialized response, or a gRPC status code.
fn forward(url: &str, message: &[u8], timeout: Duration) -> Result<Vec<u8>, u32> {
    let request =
        RateLimitRequest::decode(message).expect("the filter sends a valid RateLimitRequest");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let call = async {
            let mut client = RateLimitServiceClient::connect(url.to_owned())
                .await
                .map_err(|_| GRPC_UNAVAILABLE)?;
            client
                .should_rate_limit(request)
                .await
                .map(|r| r.into_inner().encode_to_vec())
                .map_err(|status| status.code() as u32)
        };
        tokio::time::timeout(timeout, call)
            .await
            .unwrap_or(Err(GRPC_DEADLINE_EXCEEDED))
    })
}

fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Memory {
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => memory,
        _ => panic!("the module exports no memory"),
    }
}

fn read(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> Vec<u8> {
    let memory = memory(caller);
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    memory.data(&caller)[ptr..ptr + len].to_vec()
}

fn read_string(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> String {
    String::from_utf8(read(caller, ptr, len)).expect("UTF-8 from the filter")
}

fn write_u32(caller: &mut Caller<'_, Host>, ptr: i32, value: u32) {
    let memory = memory(caller);
    let at = ptr as u32 as usize;
    memory.data_mut(caller)[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Copies `bytes` into memory the filter allocates, and writes where and how long.
fn give(caller: &mut Caller<'_, Host>, bytes: &[u8], ptr_out: i32, len_out: i32) {
    let at = if bytes.is_empty() {
        0
    } else {
        let malloc = caller
            .get_export("malloc")
            .and_then(Extern::into_func)
            .expect("the module exports malloc")
            .typed::<i32, i32>(&caller)
            .unwrap();
        let at = malloc.call(&mut *caller, bytes.len() as i32).unwrap();
        let memory = memory(caller);
        let start = at as u32 as usize;
        memory.data_mut(&mut *caller)[start..start + bytes.len()].copy_from_slice(bytes);
        at as u32
    };
    write_u32(caller, ptr_out, at);
    write_u32(caller, len_out, bytes.len() as u32);
}

/// proxy-wasm's header map encoding: count, then each key and value length, then each
/// key and value followed by a NUL.
fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend((k.len() as u32).to_le_bytes());
        out.extend((v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend(k.as_bytes());
        out.push(0);
        out.extend(v.as_bytes());
        out.push(0);
    }
    out
}

fn decode_pairs(bytes: &[u8]) -> Vec<(String, String)> {
    if bytes.len() < 4 {
        return Vec::new();
    }
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let count = word(0);
    let mut at = 4 + count * 8;
    (0..count)
        .map(|i| {
            let (kl, vl) = (word(4 + i * 8), word(8 + i * 8));
            let key = String::from_utf8_lossy(&bytes[at..at + kl]).into_owned();
            at += kl + 1;
            let value = String::from_utf8_lossy(&bytes[at..at + vl]).into_owned();
            at += vl + 1;
            (key, value)
        })
        .collect()
}

fn header_map(host: &mut Host, map: i32) -> Option<&mut Vec<(String, String)>> {
    match map {
        REQUEST_HEADERS => Some(&mut host.request_headers),
        RESPONSE_HEADERS => Some(&mut host.response_headers),
        _ => None,
    }
}

/// Every function the filter imports from `env`.
fn define_host_functions(linker: &mut Linker<Host>) {
    let env = "env";
    linker
        .func_wrap(
            env,
            "proxy_log",
            |mut c: Caller<'_, Host>, level: i32, ptr: i32, len: i32| {
                let message = read_string(&mut c, ptr, len);
                c.data_mut().logs.push(format!("[{level}] {message}"));
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_current_time_nanoseconds",
            |mut c: Caller<'_, Host>, out: i32| {
                let nanos = c.data().shared.clock_nanos.load(Ordering::SeqCst);
                let memory = memory(&mut c);
                let at = out as u32 as usize;
                memory.data_mut(&mut c)[at..at + 8].copy_from_slice(&nanos.to_le_bytes());
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_set_tick_period_milliseconds",
            |mut c: Caller<'_, Host>, ms: i32| {
                c.data_mut().tick_period_ms = ms as u32;
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_buffer_bytes",
            |mut c: Caller<'_, Host>,
             kind: i32,
             start: i32,
             max: i32,
             ptr_out: i32,
             len_out: i32| {
                let buffer = match kind {
                    PLUGIN_CONFIGURATION => c.data().configuration.clone(),
                    VM_CONFIGURATION => Vec::new(),
                    GRPC_RECEIVE_BUFFER => c.data().grpc_receive.clone(),
                    _ => return NOT_FOUND,
                };
                let start = (start as u32 as usize).min(buffer.len());
                let end = start.saturating_add(max as u32 as usize).min(buffer.len());
                give(&mut c, &buffer[start..end], ptr_out, len_out);
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_header_map_value",
            |mut c: Caller<'_, Host>, map: i32, kp: i32, kl: i32, ptr_out: i32, len_out: i32| {
                let key = read_string(&mut c, kp, kl).to_ascii_lowercase();
                let value = header_map(c.data_mut(), map)
                    .and_then(|m| m.iter().find(|(k, _)| *k == key).map(|(_, v)| v.clone()));
                match value {
                    Some(value) => {
                        give(&mut c, value.as_bytes(), ptr_out, len_out);
                        OK
                    }
                    None => NOT_FOUND,
                }
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_header_map_pairs",
            |mut c: Caller<'_, Host>, map: i32, ptr_out: i32, len_out: i32| {
                let Some(pairs) = header_map(c.data_mut(), map).map(|m| encode_pairs(m)) else {
                    return NOT_FOUND;
                };
                give(&mut c, &pairs, ptr_out, len_out);
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_set_header_map_pairs",
            |mut c: Caller<'_, Host>, map: i32, ptr: i32, len: i32| {
                let pairs = decode_pairs(&read(&mut c, ptr, len));
                match header_map(c.data_mut(), map) {
                    Some(m) => {
                        *m = pairs;
                        OK
                    }
                    None => NOT_FOUND,
                }
            },
        )
        .unwrap();
    for (name, replace) in [
        ("proxy_add_header_map_value", false),
        ("proxy_replace_header_map_value", true),
    ] {
        linker
            .func_wrap(
                env,
                name,
                move |mut c: Caller<'_, Host>, map: i32, kp: i32, kl: i32, vp: i32, vl: i32| {
                    let key = read_string(&mut c, kp, kl).to_ascii_lowercase();
                    let value = read_string(&mut c, vp, vl);
                    let Some(m) = header_map(c.data_mut(), map) else {
                        return NOT_FOUND;
                    };
                    if replace {
                        m.retain(|(k, _)| *k != key);
                    }
                    m.push((key, value));
                    OK
                },
            )
            .unwrap();
    }
    linker
        .func_wrap(
            env,
            "proxy_remove_header_map_value",
            |mut c: Caller<'_, Host>, map: i32, kp: i32, kl: i32| {
                let key = read_string(&mut c, kp, kl).to_ascii_lowercase();
                match header_map(c.data_mut(), map) {
                    Some(m) => {
                        m.retain(|(k, _)| *k != key);
                        OK
                    }
                    None => NOT_FOUND,
                }
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_property",
            |mut c: Caller<'_, Host>, pp: i32, pl: i32, ptr_out: i32, len_out: i32| {
                let path = read(&mut c, pp, pl);
                let path = String::from_utf8_lossy(&path)
                    .trim_end_matches('\0')
                    .to_owned();
                match c.data().properties.get(&path).cloned() {
                    Some(value) => {
                        give(&mut c, &value, ptr_out, len_out);
                        OK
                    }
                    None => NOT_FOUND,
                }
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_shared_data",
            |mut c: Caller<'_, Host>,
             kp: i32,
             kl: i32,
             ptr_out: i32,
             len_out: i32,
             cas_out: i32| {
                let key = read_string(&mut c, kp, kl);
                let entry = c.data().shared.data.lock().unwrap().get(&key).cloned();
                match entry {
                    Some((value, cas)) => {
                        give(&mut c, &value, ptr_out, len_out);
                        write_u32(&mut c, cas_out, cas);
                        OK
                    }
                    None => NOT_FOUND,
                }
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_set_shared_data",
            |mut c: Caller<'_, Host>, kp: i32, kl: i32, vp: i32, vl: i32, cas: i32| {
                let key = read_string(&mut c, kp, kl);
                let value = read(&mut c, vp, vl);
                let shared = c.data().shared.clone();
                let mut data = shared.data.lock().unwrap();
                // As Envoy: a non-zero CAS must match the entry's, when there is one.
                if let Some((_, current)) = data.get(&key)
                    && cas != 0
                    && cas as u32 != *current
                {
                    return CAS_MISMATCH;
                }
                let next = shared.next_cas.fetch_add(1, Ordering::SeqCst) as u32 + 1;
                data.insert(key, (value, next));
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_send_local_response",
            |mut c: Caller<'_, Host>,
             status: i32,
             _dp: i32,
             _dl: i32,
             bp: i32,
             bl: i32,
             hp: i32,
             hl: i32,
             _grpc: i32| {
                let body = read(&mut c, bp, bl);
                let headers = decode_pairs(&read(&mut c, hp, hl));
                c.data_mut().local_response = Some(LocalResponse {
                    status: status as u32,
                    headers,
                    body,
                });
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_continue_stream",
            |mut c: Caller<'_, Host>, _stream: i32| {
                c.data_mut().resumed = true;
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_close_stream",
            |_: Caller<'_, Host>, _stream: i32| OK,
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_set_effective_context",
            |_: Caller<'_, Host>, _context: i32| OK,
        )
        .unwrap();
    linker
        .func_wrap(env, "proxy_done", |_: Caller<'_, Host>| OK)
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_get_status",
            |mut c: Caller<'_, Host>, code_out: i32, ptr_out: i32, len_out: i32| {
                write_u32(&mut c, code_out, 0);
                give(&mut c, &[], ptr_out, len_out);
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_define_metric",
            |mut c: Caller<'_, Host>, _kind: i32, np: i32, nl: i32, id_out: i32| {
                let name = read_string(&mut c, np, nl);
                let shared = c.data().shared.clone();
                let mut metrics = shared.metrics.lock().unwrap();
                let index = match metrics.iter().position(|(n, _)| *n == name) {
                    Some(index) => index,
                    None => {
                        metrics.push((name, 0));
                        metrics.len() - 1
                    }
                };
                drop(metrics);
                let ids = &mut c.data_mut().metric_ids;
                ids.push(index);
                let id = ids.len() as u32 - 1;
                write_u32(&mut c, id_out, id);
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_increment_metric",
            |c: Caller<'_, Host>, id: i32, offset: i64| {
                let Some(&index) = c.data().metric_ids.get(id as u32 as usize) else {
                    return NOT_FOUND;
                };
                c.data().shared.metrics.lock().unwrap()[index].1 += offset;
                OK
            },
        )
        .unwrap();
    linker
        .func_wrap(
            env,
            "proxy_grpc_call",
            |mut c: Caller<'_, Host>,
             up: i32,
             ul: i32,
             sp: i32,
             sl: i32,
             mp: i32,
             ml: i32,
             _hp: i32,
             _hl: i32,
             bp: i32,
             bl: i32,
             timeout_ms: i32,
             token_out: i32| {
                let cluster = read_string(&mut c, up, ul);
                if !c.data().upstreams.contains_key(&cluster) {
                    return BAD_ARGUMENT;
                }
                c.data_mut().next_token += 1;
                let token = c.data().next_token;
                let callout = Callout {
                    token,
                    cluster,
                    service: read_string(&mut c, sp, sl),
                    method: read_string(&mut c, mp, ml),
                    message: read(&mut c, bp, bl),
                    timeout: Duration::from_millis(timeout_ms as u32 as u64),
                };
                c.data_mut().callouts.push(callout);
                write_u32(&mut c, token_out, token);
                OK
            },
        )
        .unwrap();
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
            .func_new(env, name, signature, |_, _, results| {
                results[0] = Val::I32(UNIMPLEMENTED);
                Ok(())
            })
            .unwrap();
    }
}
