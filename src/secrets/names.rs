//! What a secret's name, value and metadata may be, as e2b's Secrets API takes them.

use std::collections::BTreeMap;

use super::ID_PREFIX;
use crate::model::{Error, Result};

const MAX_NAME: usize = 128;
/// Largest value taken (header values are at most 2048 bytes; files and tokens may be larger).
pub const MAX_VALUE: usize = 64 * 1024;
const MAX_META_ENTRIES: usize = 32;
const MAX_META_KEY: usize = 128;
const MAX_META_VALUE: usize = 1024;
const MAX_META_TOTAL: usize = 8192;

/// The stored form of a name: trimmed, 1–128 bytes of `[A-Za-z0-9_-]`, lowercased, and not
/// looking like an id.
pub fn normalize_name(name: &str) -> Result<String> {
    let n = name.trim();
    if n.is_empty() || n.len() > MAX_NAME {
        return Err(Error::invalid(format!(
            "a secret name must be 1 to {MAX_NAME} characters"
        )));
    }
    if !n
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Error::invalid(format!(
            "secret name {n:?}: only letters, digits, '_' and '-' are allowed"
        )));
    }
    let lower = n.to_ascii_lowercase();
    if lower.starts_with(ID_PREFIX) {
        return Err(Error::invalid(format!(
            "secret name {n:?} must not start with {ID_PREFIX:?}, which marks secret ids"
        )));
    }
    Ok(lower)
}

pub fn validate_value(value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_VALUE {
        return Err(Error::invalid(format!(
            "a secret value must be 1 to {MAX_VALUE} bytes"
        )));
    }
    Ok(())
}

pub fn validate_metadata(m: &BTreeMap<String, String>) -> Result<()> {
    if m.len() > MAX_META_ENTRIES {
        return Err(Error::invalid(format!(
            "metadata has {} entries; at most {MAX_META_ENTRIES} are allowed",
            m.len()
        )));
    }
    let mut total = 0;
    for (k, v) in m {
        if k.is_empty() || k.len() > MAX_META_KEY {
            return Err(Error::invalid(format!(
                "metadata key {k:?} must be 1 to {MAX_META_KEY} bytes"
            )));
        }
        if v.len() > MAX_META_VALUE {
            return Err(Error::invalid(format!(
                "metadata value of {k:?} is longer than {MAX_META_VALUE} bytes"
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_META_TOTAL {
        return Err(Error::invalid(format!(
            "metadata takes {total} bytes; at most {MAX_META_TOTAL} are allowed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_trimmed_lowercased_and_checked() {
        assert_eq!(normalize_name("  OpenAI_Key-1 ").unwrap(), "openai_key-1");
        for bad in [
            "",
            "   ",
            "a b",
            "a.b",
            "${x}",
            "sec_abc",
            "SEC_x",
            "ü",
            &"a".repeat(129),
        ] {
            assert!(normalize_name(bad).is_err(), "{bad:?}");
        }
        assert!(normalize_name(&"a".repeat(128)).is_ok());
    }

    #[test]
    fn values_and_metadata_have_bounds() {
        assert!(validate_value("").is_err());
        assert!(validate_value(&"x".repeat(MAX_VALUE)).is_ok());
        assert!(validate_value(&"x".repeat(MAX_VALUE + 1)).is_err());
        let many: BTreeMap<String, String> =
            (0..33).map(|i| (format!("k{i}"), "v".into())).collect();
        assert!(validate_metadata(&many).is_err());
        let long_key = BTreeMap::from([("k".repeat(129), String::new())]);
        assert!(validate_metadata(&long_key).is_err());
        let long_value = BTreeMap::from([("k".into(), "v".repeat(1025))]);
        assert!(validate_metadata(&long_value).is_err());
        let big: BTreeMap<String, String> = (0..9)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(validate_metadata(&big).is_err(), "over 8192 bytes in total");
        let fine: BTreeMap<String, String> = (0..8)
            .map(|i| (format!("k{i}"), "v".repeat(1000)))
            .collect();
        assert!(validate_metadata(&fine).is_ok());
    }
}
