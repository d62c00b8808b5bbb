//! Concurrency limits: places held by requests in flight, each named by the request (its
//! lease id, from the descriptor's last value) and held until the request's refund at
//! stream end gives it back or its lease runs out.
//!
//! A counter of hits cannot hold this: a refund cannot tell which request ended, so a
//! place lost with a crashed proxy would either stay taken for good or free a place
//! another request still holds. A set of leases can: a refund removes its own lease
//! (twice is harmless), and a lease nobody gives back lapses on its own. Every store
//! keeps the same set: the in-process stores and memcached run [`LeaseSet`], the Redis
//! script the same steps on a sorted set.

/// What a concurrency limit asks of a store for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The request's lease id: [`lease_id`] of its descriptor's last value.
    pub id: u64,
    /// How many requests may hold a place at once.
    pub places: u32,
    /// How long a place is held without a refund, in milliseconds.
    pub lease_ms: u64,
}

/// A stable 64-bit name for a lease (FNV-1a of the value), the same in every process and
/// version, so that one replica's refund finds another's lease.
pub fn lease_id(value: &str) -> u64 {
    value.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The leases held on one key: `(id, expires_ms)`, at most [`Lease::places`] of them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseSet {
    held: Vec<(u64, u64)>,
}

impl LeaseSet {
    /// Leases not yet lapsed at `now_ms`.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no lease is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The request of `lease` at `now_ms`, taking a place when `take` (a check of 0 hits
    /// takes none). Lapsed leases are dropped first; a lease already held is renewed.
    /// Returns the places in use with this request: above `places` when it found none,
    /// and then it holds none.
    pub fn acquire(&mut self, lease: Lease, take: bool, now_ms: u64) -> u64 {
        self.lapse(now_ms);
        let expires = now_ms.saturating_add(lease.lease_ms);
        if !take {
            return self.held.len() as u64;
        }
        if let Some(held) = self.held.iter_mut().find(|(id, _)| *id == lease.id) {
            held.1 = expires;
        } else if self.held.len() < lease.places as usize {
            self.held.push((lease.id, expires));
        } else {
            return self.held.len() as u64 + 1;
        }
        self.held.len() as u64
    }

    /// Gives back the place of `id` (nothing when it holds none) and returns the places
    /// still in use.
    pub fn release(&mut self, id: u64, now_ms: u64) -> u64 {
        self.lapse(now_ms);
        self.held.retain(|(held, _)| *held != id);
        self.held.len() as u64
    }

    /// Places in use at `now_ms`.
    pub fn in_use(&self, now_ms: u64) -> u64 {
        self.held.iter().filter(|(_, e)| *e > now_ms).count() as u64
    }

    /// The unix millisecond at which the last lease lapses (0 when none is held): the set
    /// is not needed after it.
    pub fn expires_ms(&self) -> u64 {
        self.held.iter().map(|&(_, e)| e).max().unwrap_or(0)
    }

    fn lapse(&mut self, now_ms: u64) {
        self.held.retain(|&(_, expires)| expires > now_ms);
    }

    /// The set as a store keeps it in one value: `id:expires_ms` in hexadecimal and
    /// decimal, separated by spaces.
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(self.held.len() * 32);
        for (i, (id, expires)) in self.held.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            out.push_str(&format!("{id:x}:{expires}"));
        }
        out
    }

    /// The set [`LeaseSet::encode`] wrote; `None` when `text` is not one.
    pub fn decode(text: &[u8]) -> Option<LeaseSet> {
        let text = std::str::from_utf8(text).ok()?;
        let held = text
            .split_ascii_whitespace()
            .map(|lease| {
                let (id, expires) = lease.split_once(':')?;
                Some((u64::from_str_radix(id, 16).ok()?, expires.parse().ok()?))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(LeaseSet { held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Lease = Lease {
        id: 1,
        places: 2,
        lease_ms: 10_000,
    };

    fn of(id: u64) -> Lease {
        Lease { id, ..LEASE }
    }

    #[test]
    fn places_are_taken_up_to_the_limit_and_a_refused_request_holds_none() {
        let mut set = LeaseSet::default();
        assert_eq!(set.acquire(of(1), true, 0), 1);
        assert_eq!(set.acquire(of(2), true, 0), 2);
        assert_eq!(set.acquire(of(3), true, 0), 3, "over: no place");
        assert_eq!(set.len(), 2);
        assert_eq!(
            set.release(3, 0),
            2,
            "the refused request's refund frees nothing"
        );
        assert_eq!(set.release(1, 0), 1);
        assert_eq!(
            set.release(1, 0),
            1,
            "a second refund of one lease frees nothing"
        );
        assert_eq!(set.acquire(of(3), true, 0), 2);
    }

    #[test]
    fn a_check_takes_no_place_and_a_held_lease_is_renewed_not_doubled() {
        let mut set = LeaseSet::default();
        assert_eq!(set.acquire(of(1), false, 0), 0);
        assert_eq!(set.acquire(of(1), true, 0), 1);
        assert_eq!(set.acquire(of(1), true, 5_000), 1);
        assert_eq!(set.expires_ms(), 15_000);
        assert_eq!(set.acquire(of(2), false, 5_000), 1);
    }

    #[test]
    fn a_lease_never_given_back_lapses_after_its_time_and_not_before() {
        let mut set = LeaseSet::default();
        set.acquire(of(1), true, 0);
        set.acquire(of(2), true, 4_000);
        assert_eq!(set.acquire(of(3), true, 9_999), 3, "lease 1 holds for 10 s");
        assert_eq!(set.in_use(9_999), 2);
        assert_eq!(set.acquire(of(3), true, 10_000), 2, "lease 1 has lapsed");
        assert_eq!(set.in_use(14_000), 1);
    }

    #[test]
    fn a_set_reads_back_what_it_wrote_and_refuses_anything_else() {
        let mut set = LeaseSet::default();
        set.acquire(of(u64::MAX), true, 1);
        set.acquire(of(7), true, 2);
        let text = set.encode();
        assert_eq!(text, "ffffffffffffffff:10001 7:10002");
        assert_eq!(LeaseSet::decode(text.as_bytes()), Some(set));
        assert_eq!(LeaseSet::decode(b""), Some(LeaseSet::default()));
        assert_eq!(LeaseSet::decode(b"12"), None);
        assert_eq!(LeaseSet::decode(b"zz:1"), None);
    }

    #[test]
    fn lease_ids_are_stable_fnv1a() {
        assert_eq!(lease_id(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(lease_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(lease_id("req-1"), lease_id("req-2"));
    }
}
