//! Identifiers: claim ids `sb_<16 hex>`, checkpoint ids `ck_<16 hex>`, instance ids and tokens.

use rand::RngCore;

pub const CLAIM_PREFIX: &str = "sb_";
pub const CHECKPOINT_PREFIX: &str = "ck_";
pub const INSTANCE_PREFIX: &str = "in_";

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    hex(&buf)
}

pub fn new_claim_id() -> String {
    format!("{CLAIM_PREFIX}{}", random_hex(8))
}

pub fn new_checkpoint_id() -> String {
    format!("{CHECKPOINT_PREFIX}{}", random_hex(8))
}

pub fn new_instance_id() -> String {
    format!("{INSTANCE_PREFIX}{}", random_hex(8))
}

/// A per-sandbox secret: 32 hex characters (128 bits).
pub fn new_token() -> String {
    random_hex(16)
}

fn is_hex16(s: &str) -> bool {
    s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn has_prefixed_hex(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix).is_some_and(is_hex16)
}

pub fn is_claim_id(id: &str) -> bool {
    has_prefixed_hex(id, CLAIM_PREFIX)
}

pub fn is_checkpoint_id(id: &str) -> bool {
    has_prefixed_hex(id, CHECKPOINT_PREFIX)
}

pub fn is_instance_id(id: &str) -> bool {
    has_prefixed_hex(id, INSTANCE_PREFIX)
}

/// Accepts a claim id in either spelling (`sb_…` or the DNS-safe `sb-…`, any case) and returns
/// the node's spelling, or None when it is not a claim id at all.
pub fn canonical_claim_id(input: &str) -> Option<String> {
    let lower = input.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("sb_")
        .or_else(|| lower.strip_prefix("sb-"))?;
    is_hex16(rest).then(|| format!("{CLAIM_PREFIX}{rest}"))
}

/// The DNS-label-safe rendering published on the e2b surface (`sb_…` → `sb-…`).
pub fn dns_safe(id: &str) -> String {
    id.chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// FNV-1a: a short, stable name for a value (not a secret, not collision-proof).
pub fn stable_hash_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_have_the_documented_shape() {
        let id = new_claim_id();
        assert!(is_claim_id(&id), "{id}");
        assert_eq!(id.len(), 19);
        let ck = new_checkpoint_id();
        assert!(is_checkpoint_id(&ck), "{ck}");
        assert!(!is_claim_id(&ck));
        assert_eq!(new_token().len(), 32);
        assert_ne!(new_claim_id(), new_claim_id());
    }

    #[test]
    fn both_spellings_resolve_to_the_node_id() {
        assert_eq!(
            canonical_claim_id("sb-0123456789abcdef").as_deref(),
            Some("sb_0123456789abcdef")
        );
        assert_eq!(
            canonical_claim_id("SB_0123456789ABCDEF").as_deref(),
            Some("sb_0123456789abcdef")
        );
        assert_eq!(canonical_claim_id("sb_0123"), None);
        assert_eq!(canonical_claim_id("ck_0123456789abcdef"), None);
        assert_eq!(canonical_claim_id("sb_0123456789abcdeg"), None);
        assert_eq!(dns_safe("sb_0123456789abcdef"), "sb-0123456789abcdef");
    }
}
