//! Pool keys (template, net, size) and the size tiers behind them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{Error, Result};

pub const DEFAULT_NET: &str = "none";
pub const DEFAULT_SIZE: &str = "small";
/// Networks a pool can be keyed by: `none` has no network of its own (only its agent's
/// listener is reachable), `egress` shares the node's network.
pub const NETS: &[&str] = &["none", "egress"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeTier {
    pub name: &'static str,
    pub cpu_count: u32,
    pub memory_bytes: u64,
    /// Size of the sandbox's writable layer (its disk quota).
    pub disk_bytes: u64,
    /// Most processes and threads the sandbox may run at once.
    pub pids: u32,
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

pub const SIZES: &[SizeTier] = &[
    SizeTier {
        name: "small",
        cpu_count: 1,
        memory_bytes: 512 * MIB,
        disk_bytes: 4 * GIB,
        pids: 1024,
    },
    SizeTier {
        name: "medium",
        cpu_count: 2,
        memory_bytes: 1024 * MIB,
        disk_bytes: 8 * GIB,
        pids: 2048,
    },
    SizeTier {
        name: "large",
        cpu_count: 4,
        memory_bytes: 4096 * MIB,
        disk_bytes: 16 * GIB,
        pids: 4096,
    },
    SizeTier {
        name: "xlarge",
        cpu_count: 4,
        memory_bytes: 8192 * MIB,
        disk_bytes: 32 * GIB,
        pids: 4096,
    },
    SizeTier {
        name: "2xlarge",
        cpu_count: 8,
        memory_bytes: 16384 * MIB,
        disk_bytes: 64 * GIB,
        pids: 8192,
    },
];

pub fn size_tier(name: &str) -> Option<SizeTier> {
    SIZES.iter().copied().find(|t| t.name == name)
}

/// Template names are directory names on the node, so they are kept to a safe alphabet.
pub fn validate_template_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "template name {name:?} must be 1-63 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
        )))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PoolKey {
    pub template: String,
    pub net: String,
    pub size: String,
}

impl PoolKey {
    /// Builds a key, filling the defaults for empty net and size and validating every part.
    pub fn new(template: &str, net: &str, size: &str) -> Result<Self> {
        validate_template_name(template)?;
        let net = if net.is_empty() { DEFAULT_NET } else { net };
        let size = if size.is_empty() { DEFAULT_SIZE } else { size };
        if !NETS.contains(&net) {
            return Err(Error::invalid(format!(
                "net {net:?} is not one of {}",
                NETS.join(", ")
            )));
        }
        if size_tier(size).is_none() {
            let names: Vec<_> = SIZES.iter().map(|t| t.name).collect();
            return Err(Error::invalid(format!(
                "size {size:?} is not one of {}",
                names.join(", ")
            )));
        }
        Ok(PoolKey {
            template: template.to_string(),
            net: net.to_string(),
            size: size.to_string(),
        })
    }

    /// A key whose size is the template's own (its default size; `small` when it names
    /// none), for creates that ask for no size: the dispatcher fills it in from what the nodes
    /// say of the template.
    pub fn template_sized(template: &str, net: &str) -> Result<Self> {
        let mut key = PoolKey::new(template, net, DEFAULT_SIZE)?;
        key.size.clear();
        Ok(key)
    }

    /// Whether the size is still the template's to say (see `template_sized`).
    pub fn size_unset(&self) -> bool {
        self.size.is_empty()
    }

    pub fn base() -> Self {
        PoolKey {
            template: "base".into(),
            net: DEFAULT_NET.into(),
            size: DEFAULT_SIZE.into(),
        }
    }

    pub fn tier(&self) -> SizeTier {
        size_tier(&self.size).unwrap_or(SIZES[0])
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.template, self.net, self.size)
    }
}

/// Parses `TEMPLATE[/NET[/SIZE]]`.
impl FromStr for PoolKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let mut parts = s.split('/');
        let template = parts.next().unwrap_or_default();
        let net = parts.next().unwrap_or_default();
        let size = parts.next().unwrap_or_default();
        if parts.next().is_some() {
            return Err(Error::invalid(format!(
                "pool key {s:?} has more than TEMPLATE/NET/SIZE"
            )));
        }
        PoolKey::new(template, net, size)
    }
}

/// A warm-pool target as given on the command line: `TEMPLATE[/NET[/SIZE]]=COUNT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolTarget {
    pub key: PoolKey,
    pub target: u32,
}

impl FromStr for PoolTarget {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let (key, count) = s.split_once('=').ok_or_else(|| {
            Error::invalid(format!(
                "pool {s:?} must look like TEMPLATE[/NET[/SIZE]]=COUNT"
            ))
        })?;
        let target = count
            .parse::<u32>()
            .map_err(|_| Error::invalid(format!("pool {s:?}: {count:?} is not a count")))?;
        Ok(PoolTarget {
            key: key.parse()?,
            target,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_default_and_validate() {
        let k: PoolKey = "base".parse().unwrap();
        assert_eq!(k, PoolKey::base());
        assert_eq!(k.to_string(), "base/none/small");
        let k: PoolKey = "py/egress/large".parse().unwrap();
        assert_eq!(k.tier().cpu_count, 4);
        assert!("../etc".parse::<PoolKey>().is_err());
        assert!("base/wifi".parse::<PoolKey>().is_err());
        assert!("base/none/huge".parse::<PoolKey>().is_err());
        assert!("a/b/c/d".parse::<PoolKey>().is_err());
        let t: PoolTarget = "base/none/medium=7".parse().unwrap();
        assert_eq!(t.target, 7);
        assert_eq!(t.key.size, "medium");
        assert!("base".parse::<PoolTarget>().is_err());
        assert!("base=-1".parse::<PoolTarget>().is_err());
        let t = PoolKey::template_sized("code-interpreter", "egress").unwrap();
        assert!(t.size_unset() && t.net == "egress");
        assert_eq!(
            t.tier().name,
            "small",
            "unresolved, it sizes as the default"
        );
        assert!(PoolKey::template_sized("../x", "").is_err());
        assert!(!PoolKey::base().size_unset());
    }
}
