//! The node's egress proxy, being built (issue 26): every outbound TCP connection of a sandbox
//! is to be forced through it from inside the sandbox's network namespace, judged by the name
//! it carries (HTTP `Host`, TLS SNI) and its address, and, for hosts with transforms, have
//! headers set with the tenant's secrets filled in. These are its parts that stand alone: the
//! name a connection carries, and the verdict on it.

pub mod peek;
pub mod policy;
