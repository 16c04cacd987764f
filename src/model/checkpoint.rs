//! Checkpoint names: `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`, so at most 63 characters.

use super::{Error, Result};

pub const MAX_CHECKPOINT_NAME: usize = 63;

pub fn validate_checkpoint_name(name: &str) -> Result<()> {
    let bytes = name.as_bytes();
    let first_ok = bytes.first().is_some_and(|b| b.is_ascii_alphanumeric());
    let rest_ok = bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'/' | b'-'));
    if first_ok && rest_ok && bytes.len() <= MAX_CHECKPOINT_NAME {
        return Ok(());
    }
    let why = if bytes.len() > MAX_CHECKPOINT_NAME {
        format!(
            "is {} characters, at most {MAX_CHECKPOINT_NAME} are allowed",
            bytes.len()
        )
    } else {
        "must start with a letter or digit and contain only letters, digits and . _ : / -".into()
    };
    Err(Error::invalid(format!("checkpoint name {name:?} {why}")))
}

/// The name a tenant's checkpoint is stored under on the node: `<namespace>/<name>`.
pub fn stamped_name(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_node_pattern() {
        assert!(validate_checkpoint_name("a").is_ok());
        assert!(validate_checkpoint_name("default/before-migration:v1.2").is_ok());
        assert!(validate_checkpoint_name(&"x".repeat(63)).is_ok());
        let err = validate_checkpoint_name(&"x".repeat(64)).unwrap_err();
        assert!(err.message.contains("at most 63"), "{err}");
        assert!(validate_checkpoint_name("").is_err());
        assert!(validate_checkpoint_name("-lead").is_err());
        assert!(validate_checkpoint_name("has space").is_err());
        assert!(validate_checkpoint_name("ünï").is_err());
    }
}
