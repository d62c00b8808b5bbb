//! The host functions on the request's and the response's header maps.

use wasmtime::{Caller, Linker};

use super::memory::{decode_pairs, encode_pairs, give, read, read_string};
use super::{Host, NOT_FOUND, OK, REQUEST_HEADERS, RESPONSE_HEADERS, host_function};

pub(super) fn define(linker: &mut Linker<Host>) {
    host_function(
        linker,
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
    );
    host_function(
        linker,
        "proxy_get_header_map_pairs",
        |mut c: Caller<'_, Host>, map: i32, ptr_out: i32, len_out: i32| {
            let Some(pairs) = header_map(c.data_mut(), map).map(|m| encode_pairs(m)) else {
                return NOT_FOUND;
            };
            give(&mut c, &pairs, ptr_out, len_out);
            OK
        },
    );
    host_function(
        linker,
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
    );
    for (name, replace) in [
        ("proxy_add_header_map_value", false),
        ("proxy_replace_header_map_value", true),
    ] {
        host_function(
            linker,
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
        );
    }
    host_function(
        linker,
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
    );
}

fn header_map(host: &mut Host, map: i32) -> Option<&mut Vec<(String, String)>> {
    match map {
        REQUEST_HEADERS => Some(&mut host.request_headers),
        RESPONSE_HEADERS => Some(&mut host.response_headers),
        _ => None,
    }
}
