//! The host functions about the plugin and the request in flight: the log, the clock and
//! the timer, configuration buffers, properties, local responses and stream control.

use std::sync::atomic::Ordering;

use wasmtime::{Caller, Linker};

use super::memory::{decode_pairs, give, memory, read, read_string, write_u32};
use super::{
    GRPC_RECEIVE_BUFFER, Host, LocalResponse, NOT_FOUND, OK, PLUGIN_CONFIGURATION,
    VM_CONFIGURATION, host_function,
};

pub(super) fn define(linker: &mut Linker<Host>) {
    host_function(
        linker,
        "proxy_log",
        |mut c: Caller<'_, Host>, level: i32, ptr: i32, len: i32| {
            let message = read_string(&mut c, ptr, len);
            c.data_mut().logs.push(format!("[{level}] {message}"));
            OK
        },
    );
    host_function(
        linker,
        "proxy_get_current_time_nanoseconds",
        |mut c: Caller<'_, Host>, out: i32| {
            let nanos = c.data().shared.clock_nanos.load(Ordering::SeqCst);
            let memory = memory(&mut c);
            let at = out as u32 as usize;
            memory.data_mut(&mut c)[at..at + 8].copy_from_slice(&nanos.to_le_bytes());
            OK
        },
    );
    host_function(
        linker,
        "proxy_set_tick_period_milliseconds",
        |mut c: Caller<'_, Host>, ms: i32| {
            c.data_mut().tick_period_ms = ms as u32;
            OK
        },
    );
    host_function(
        linker,
        "proxy_get_buffer_bytes",
        |mut c: Caller<'_, Host>, kind: i32, start: i32, max: i32, ptr_out: i32, len_out: i32| {
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
    );
    host_function(
        linker,
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
    );
    host_function(
        linker,
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
    );
    host_function(
        linker,
        "proxy_continue_stream",
        |mut c: Caller<'_, Host>, _stream: i32| {
            c.data_mut().resumed = true;
            OK
        },
    );
    host_function(
        linker,
        "proxy_close_stream",
        |_: Caller<'_, Host>, _stream: i32| OK,
    );
    host_function(
        linker,
        "proxy_set_effective_context",
        |_: Caller<'_, Host>, _context: i32| OK,
    );
    host_function(linker, "proxy_done", |_: Caller<'_, Host>| OK);
    host_function(
        linker,
        "proxy_get_status",
        |mut c: Caller<'_, Host>, code_out: i32, ptr_out: i32, len_out: i32| {
            write_u32(&mut c, code_out, 0);
            give(&mut c, &[], ptr_out, len_out);
            OK
        },
    );
}
