//! The host functions on what every worker of the plugin shares: shared data (with
//! Envoy's compare-and-swap) and metrics.

use std::sync::atomic::Ordering;

use wasmtime::{Caller, Linker};

use super::memory::{give, read, read_string, write_u32};
use super::{CAS_MISMATCH, Host, NOT_FOUND, OK, host_function};

pub(super) fn define(linker: &mut Linker<Host>) {
    host_function(
        linker,
        "proxy_get_shared_data",
        |mut c: Caller<'_, Host>, kp: i32, kl: i32, ptr_out: i32, len_out: i32, cas_out: i32| {
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
    );
    host_function(
        linker,
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
    );
    host_function(
        linker,
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
    );
    host_function(
        linker,
        "proxy_increment_metric",
        |c: Caller<'_, Host>, id: i32, offset: i64| {
            let Some(&index) = c.data().metric_ids.get(id as u32 as usize) else {
                return NOT_FOUND;
            };
            c.data().shared.metrics.lock().unwrap()[index].1 += offset;
            OK
        },
    );
}
