//! The filter's memory as the host functions read and write it, and proxy-wasm's
//! encoding of header maps.

use wasmtime::{Caller, Extern};

use super::Host;

pub(super) fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Memory {
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => memory,
        _ => panic!("the module exports no memory"),
    }
}

pub(super) fn read(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> Vec<u8> {
    let memory = memory(caller);
    let (ptr, len) = (ptr as u32 as usize, len as u32 as usize);
    memory.data(&caller)[ptr..ptr + len].to_vec()
}

pub(super) fn read_string(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> String {
    String::from_utf8(read(caller, ptr, len)).expect("UTF-8 from the filter")
}

pub(super) fn write_u32(caller: &mut Caller<'_, Host>, ptr: i32, value: u32) {
    let memory = memory(caller);
    let at = ptr as u32 as usize;
    memory.data_mut(caller)[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Copies `bytes` into memory the filter allocates, and writes where and how long.
pub(super) fn give(caller: &mut Caller<'_, Host>, bytes: &[u8], ptr_out: i32, len_out: i32) {
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
pub(super) fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
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

pub(super) fn decode_pairs(bytes: &[u8]) -> Vec<(String, String)> {
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
