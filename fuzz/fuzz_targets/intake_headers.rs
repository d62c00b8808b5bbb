//! The intake's request headers and its idempotency store.
//!
//! Input: header lines (`name: value`) up to the first blank line, as a client sends
//! them; the bytes after it drive (through `arbitrary`) the peer address and a sequence
//! of idempotency-store operations (claim, finish, drop, time passing).
//!
//! Invariants: nothing panics; `Idempotency-Key` and `X-Client-Id` are accepted exactly
//! when they are sent once and are 1 to 255 visible ASCII characters, and refused with a
//! problem naming the header otherwise; the client id falls back to the peer's address; `Content-Type` is JSON
//! only when it says `application/json`; the in-memory store answers every claim as a
//! model of
//! its contract does (new / replay of the finished answer / in progress / mismatch, with
//! expiry after the TTL and the oldest answers forgotten beyond the maximum), and never
//! hands out two claims on one key.
#![no_main]

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use operations_intake::idempotency::{self, memory::Found, memory::Store};
use operations_intake::request;

fuzz_target!(|data: &[u8]| {
    let (head, rest) = match data.windows(2).position(|w| w == b"\n\n") {
        Some(at) => (&data[..at], &data[at + 2..]),
        None => (data, &[][..]),
    };
    let headers = headers(head);
    let mut u = Unstructured::new(rest);
    let peer = peer(&mut u);

    let visible = |v: &HeaderValue| {
        (1..=255).contains(&v.len()) && v.as_bytes().iter().all(u8::is_ascii_graphic)
    };

    let once = |name: &str| headers.get_all(name).iter().count() <= 1;
    let key = headers.get("idempotency-key");
    match request::idempotency_key(&headers) {
        Ok(None) => assert!(key.is_none()),
        Ok(Some(k)) => {
            assert_eq!(Some(k.as_bytes()), key.map(HeaderValue::as_bytes));
            assert!(once("idempotency-key"));
            assert!(visible(key.unwrap()) && idempotency::valid_key(&k));
        }
        Err(problem) => {
            let refused = key.is_some_and(|k| !visible(k)) || !once("idempotency-key");
            assert!(refused, "{problem:?}");
            assert_eq!(problem.field.as_deref(), Some("Idempotency-Key"));
            assert_eq!(problem.index, None);
        }
    }
    if let Some(k) = key.and_then(|k| k.to_str().ok()) {
        assert_eq!(idempotency::valid_key(k), visible(key.unwrap()));
    }

    let client = headers.get("x-client-id");
    match request::client_id(&headers, peer) {
        Ok(id) => match client {
            Some(value) => {
                assert!(visible(value) && once("x-client-id"));
                assert_eq!(id.as_bytes(), value.as_bytes());
            }
            None => assert_eq!(id, peer.map_or("unknown".into(), |p| p.ip().to_string())),
        },
        Err(problem) => {
            let refused = client.is_some_and(|c| !visible(c)) || !once("x-client-id");
            assert!(refused, "{problem:?}");
            assert_eq!(problem.field.as_deref(), Some("X-Client-Id"));
        }
    }

    let content_type = headers.get("content-type").map(HeaderValue::to_str);
    if request::is_json(&headers) {
        let media = content_type.expect("JSON without a Content-Type");
        let media = media
            .expect("JSON in a header that is not ASCII")
            .to_ascii_lowercase();
        assert!(media.contains("application/json"), "{media}");
    } else if let Some(Ok(media)) = content_type {
        let media = media.trim().to_ascii_lowercase();
        assert!(
            media != "application/json" && !media.starts_with("application/json;"),
            "{media}"
        );
    }

    let key = request::idempotency_key(&headers).ok().flatten();
    let _ = store_operations(&mut u, key);
});

/// Header lines, `name: value`; lines that are not a valid header are skipped.
fn headers(head: &[u8]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for line in head.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let value = &line[colon + 1..];
        let value = value.strip_prefix(b" ").unwrap_or(value);
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(name, value);
        }
    }
    headers
}

fn peer(u: &mut Unstructured<'_>) -> Option<SocketAddr> {
    let ip = match u8::arbitrary(u).ok()? % 3 {
        0 => return None,
        1 => IpAddr::V4(Ipv4Addr::from(u32::arbitrary(u).ok()?)),
        _ => IpAddr::V6(Ipv6Addr::from(u128::arbitrary(u).ok()?)),
    };
    Some(SocketAddr::new(ip, u16::arbitrary(u).ok()?))
}

#[derive(Debug, Arbitrary)]
enum Op {
    Claim { key: u8, body: u8 },
    Finish { claim: u8, answer: u8 },
    Drop { claim: u8 },
    Wait { millis: u16 },
}

/// What the store promises, kept the simple way.
struct Model {
    ttl: Duration,
    max_keys: usize,
    /// Per key: the body, and the answer with the time it was finished.
    entries: HashMap<String, (u8, Option<(u8, Duration)>)>,
    /// Finished keys, oldest first.
    order: VecDeque<String>,
}

impl Model {
    fn expire(&mut self, now: Duration) {
        while let Some(key) = self.order.front() {
            let (_, answer) = &self.entries[key];
            if now - answer.expect("finished").1 < self.ttl {
                break;
            }
            let key = self.order.pop_front().unwrap();
            self.entries.remove(&key);
        }
    }
}

fn store_operations(u: &mut Unstructured<'_>, header_key: Option<String>) -> arbitrary::Result<()> {
    let ttl = Duration::from_millis(u.int_in_range(1..=5_000)?);
    let max_keys = u.int_in_range(0..=4)?;
    let store = Store::new(ttl, max_keys);
    let mut model = Model {
        ttl,
        max_keys,
        entries: HashMap::new(),
        order: VecDeque::new(),
    };
    let mut keys = vec!["a".to_owned(), "b".to_owned(), "order-7".to_owned()];
    keys.extend(header_key);
    let t0 = Instant::now();
    let mut now = Duration::ZERO;
    // Claims still held: the key and its body.
    let mut held: Vec<(String, u8)> = Vec::new();
    for _ in 0..64 {
        match Op::arbitrary(u)? {
            Op::Claim { key, body } => {
                let key = &keys[usize::from(key) % keys.len()];
                let body = body % 3;
                model.expire(now);
                let claim = store.claim(key, [body; 32], t0 + now);
                match (claim, model.entries.get(key)) {
                    (Found::New, None) => {
                        assert!(held.iter().all(|(k, _)| k != key), "two claims on {key}");
                        model.entries.insert(key.clone(), (body, None));
                        held.push((key.clone(), body));
                    }
                    (Found::Mismatch, Some((b, _))) => assert_ne!(*b, body),
                    (Found::Replay(answer), Some((b, Some((a, _))))) => {
                        assert_eq!(*b, body);
                        assert_eq!(answer, Bytes::from(vec![*a]));
                    }
                    (Found::InProgress, Some((b, None))) => {
                        assert_eq!(*b, body);
                        assert!(held.iter().any(|(k, _)| k == key));
                    }
                    (claim, expected) => panic!("{key}: {claim:?}, expected {expected:?}"),
                }
            }
            Op::Finish { claim, answer } if !held.is_empty() => {
                let (key, _) = held.swap_remove(usize::from(claim) % held.len());
                store.finish(key.clone(), Bytes::from(vec![answer]), t0 + now);
                model.entries.get_mut(&key).unwrap().1 = Some((answer, now));
                model.order.push_back(key);
                while model.order.len() > model.max_keys {
                    let oldest = model.order.pop_front().unwrap();
                    model.entries.remove(&oldest);
                }
            }
            Op::Drop { claim } if !held.is_empty() => {
                let (key, _) = held.swap_remove(usize::from(claim) % held.len());
                store.release(&key);
                model.entries.remove(&key);
            }
            Op::Wait { millis } => now += Duration::from_millis(millis.into()),
            Op::Finish { .. } | Op::Drop { .. } => {}
        }
    }
    Ok(())
}
