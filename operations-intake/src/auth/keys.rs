//! API keys: `API_KEYS_FILE` lists each client's keys by their SHA-256, never the keys
//! themselves, so the file can be read by operators and kept in configuration
//! repositories without giving anyone a key.
//!
//! ```yaml
//! - client_id: acme
//!   key_sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//!   scopes: [buy]        # optional; without it, every operation
//! ```
//!
//! A client may have several keys (a rotation adds the new key, then removes the old
//! one). A presented key is hashed; the listed hashes that share its first 8 bytes (a
//! map lookup by a 64-bit integer, almost always one hash or none) are then compared
//! whole in constant time, without stopping at a match. No comparison exits early on a
//! matching prefix, so timing cannot reveal a listed hash byte by byte; and a listed
//! hash would not give its key away anyway (that takes a SHA-256 preimage). The cost
//! does not grow with the number of keys.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::batch::Kind;

/// The longest accepted client id, as for `X-Client-Id`.
pub const MAX_CLIENT_ID_LEN: usize = 255;

/// The longest key accepted in a request; longer ones are not looked up.
pub const MAX_KEY_LEN: usize = 512;

/// What a client may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scopes {
    buy: bool,
    sell: bool,
}

impl Scopes {
    /// Every operation.
    pub const ALL: Scopes = Scopes {
        buy: true,
        sell: true,
    };

    /// Whether `kind` is allowed.
    pub fn allows(self, kind: Kind) -> bool {
        match kind {
            Kind::Buy => self.buy,
            Kind::Sell => self.sell,
        }
    }

    /// The allowed kinds, comma-separated, for messages.
    pub fn describe(self) -> String {
        let kinds: Vec<&str> = [(self.buy, "buy"), (self.sell, "sell")]
            .iter()
            .filter(|(allowed, _)| *allowed)
            .map(|(_, name)| *name)
            .collect();
        kinds.join(", ")
    }
}

/// An authenticated client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Client {
    /// Its id: what limits count and what messages record.
    pub id: Arc<str>,
    /// What it may send.
    pub scopes: Scopes,
}

/// The keys of one load of the file, by the first 8 bytes of their hash.
#[derive(Debug, Default)]
pub struct KeyRing {
    entries: HashMap<u64, Vec<([u8; 32], Client)>>,
    len: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    client_id: String,
    key_sha256: String,
    #[serde(default)]
    scopes: Option<Vec<String>>,
}

impl KeyRing {
    /// Parses the file's text; an error names the entry (from 1) and what is wrong.
    pub fn parse(text: &str) -> Result<KeyRing, String> {
        let entries: Option<Vec<Entry>> =
            yaml_serde::from_str(text).map_err(|error| error.to_string())?;
        let mut ring = KeyRing::default();
        for (n, entry) in entries.unwrap_or_default().into_iter().enumerate() {
            let at =
                |why: String| format!("entry {} (client_id `{}`): {why}", n + 1, entry.client_id);
            if !valid_client_id(&entry.client_id) {
                return Err(at(format!(
                    "client_id must be 1 to {MAX_CLIENT_ID_LEN} visible ASCII characters"
                )));
            }
            let hash = parse_hash(&entry.key_sha256).ok_or_else(|| {
                at("key_sha256 must be 64 hexadecimal digits (the SHA-256 of the key)".into())
            })?;
            let bucket = ring.entries.entry(prefix(&hash)).or_default();
            if bucket.iter().any(|(h, _)| *h == hash) {
                return Err(at("this key_sha256 is listed twice".into()));
            }
            let scopes = match &entry.scopes {
                None => Scopes::ALL,
                Some(list) => parse_scopes(list).map_err(at)?,
            };
            bucket.push((
                hash,
                Client {
                    id: entry.client_id.as_str().into(),
                    scopes,
                },
            ));
            ring.len += 1;
        }
        Ok(ring)
    }

    /// How many keys are listed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no key is listed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The client whose key is `key`, if any (see the module's note on timing).
    pub fn client(&self, key: &[u8]) -> Option<&Client> {
        let hash: [u8; 32] = Sha256::digest(key).into();
        let mut found = None;
        for (listed, client) in self.entries.get(&prefix(&hash))? {
            if bool::from(listed.ct_eq(&hash)) {
                found = Some(client);
            }
        }
        found
    }
}

/// The map key of a hash: its first 8 bytes.
fn prefix(hash: &[u8; 32]) -> u64 {
    let mut first = [0; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_le_bytes(first)
}

fn parse_scopes(list: &[String]) -> Result<Scopes, String> {
    let mut scopes = Scopes {
        buy: false,
        sell: false,
    };
    for scope in list {
        match scope.as_str() {
            "buy" => scopes.buy = true,
            "sell" => scopes.sell = true,
            other => {
                return Err(format!(
                    "unknown scope `{other}`; the scopes are buy and sell"
                ));
            }
        }
    }
    if scopes
        == (Scopes {
            buy: false,
            sell: false,
        })
    {
        return Err(
            "scopes is empty, which would allow nothing; leave it out to allow every operation"
                .into(),
        );
    }
    Ok(scopes)
}

/// Whether `id` can be a client id: 1 to 255 visible ASCII characters (so never a
/// space, which separates it from the idempotency key in message keys).
pub fn valid_client_id(id: &str) -> bool {
    (1..=MAX_CLIENT_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic())
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut hash = [0; 32];
    for (i, byte) in hash.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(hash)
}

/// The lowercase hexadecimal SHA-256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// `bytes` in lowercase hexadecimal.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A new random key (`oik_` and 64 hexadecimal digits: 256 bits from the operating
/// system) and the file entry that lets `client_id` use it.
pub fn generate(client_id: &str, scopes: Option<&[String]>) -> Result<(String, String), String> {
    if !valid_client_id(client_id) {
        return Err(format!(
            "the client id must be 1 to {MAX_CLIENT_ID_LEN} visible ASCII characters"
        ));
    }
    if let Some(list) = scopes {
        parse_scopes(list)?;
    }
    let mut random = [0u8; 32];
    getrandom::fill(&mut random).map_err(|e| format!("no randomness from the system: {e}"))?;
    let key = format!("oik_{}", hex(&random));
    let client = yaml_serde::to_string(client_id).map_err(|e| e.to_string())?;
    let mut entry = format!(
        "- client_id: {}\n  key_sha256: {}\n",
        client.trim_end(),
        sha256_hex(key.as_bytes())
    );
    if let Some(list) = scopes {
        entry.push_str(&format!("  scopes: [{}]\n", list.join(", ")));
    }
    Ok((key, entry))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_key_authenticates_its_client_only() {
        let (key, entry) = generate("acme", Some(&["buy".to_owned()])).unwrap();
        let (other, other_entry) = generate("globex", None).unwrap();
        assert_ne!(key, other);
        let ring = KeyRing::parse(&format!("{entry}{other_entry}")).unwrap();
        assert_eq!(ring.len(), 2);
        let acme = ring.client(key.as_bytes()).unwrap();
        assert_eq!(&*acme.id, "acme");
        assert!(acme.scopes.allows(Kind::Buy) && !acme.scopes.allows(Kind::Sell));
        assert_eq!(ring.client(other.as_bytes()).unwrap().scopes, Scopes::ALL);
        assert!(ring.client(b"oik_guess").is_none());
        assert!(ring.client(&key.as_bytes()[1..]).is_none());
    }

    #[test]
    fn a_bad_file_says_which_entry_and_why() {
        let hash = sha256_hex(b"k");
        let cases = [
            ("- client_id: a\n  key_sha256: abc\n", "64 hexadecimal"),
            (
                &format!("- client_id: 'a b'\n  key_sha256: {hash}\n"),
                "visible ASCII",
            ),
            (
                &format!("- client_id: a\n  key_sha256: {hash}\n  scopes: [hold]\n"),
                "unknown scope `hold`",
            ),
            (
                &format!("- client_id: a\n  key_sha256: {hash}\n  scopes: []\n"),
                "allow nothing",
            ),
            (
                &format!(
                    "- client_id: a\n  key_sha256: {hash}\n- client_id: b\n  key_sha256: {hash}\n"
                ),
                "entry 2 (client_id `b`): this key_sha256 is listed twice",
            ),
            (
                &format!("- client_id: a\n  key_sha265: {hash}\n"),
                "unknown field",
            ),
        ];
        for (text, expected) in cases {
            let error = KeyRing::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
        assert!(KeyRing::parse("").unwrap().is_empty());
    }

    #[test]
    fn hashes_sharing_their_first_bytes_are_told_apart() {
        let listed = sha256_hex(b"k");
        let twin = format!("{}{}", &listed[..16], "0".repeat(48));
        let ring = KeyRing::parse(&format!(
            "- client_id: twin\n  key_sha256: {twin}\n- client_id: real\n  key_sha256: {listed}\n"
        ))
        .unwrap();
        assert_eq!(ring.len(), 2);
        assert_eq!(&*ring.client(b"k").unwrap().id, "real");
    }

    #[test]
    fn hashes_match_the_sha256_test_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            parse_hash(&sha256_hex(b"abc").to_uppercase()),
            Some(Sha256::digest(b"abc").into())
        );
    }
}
