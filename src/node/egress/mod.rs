//! The node's egress proxy: a sandbox whose policy allows domain names has every outbound TCP
//! connection forced through it from inside its network namespace, judged by the name it
//! carries (HTTP `Host`, TLS SNI) and its address in e2b's order; a host whose rule sets headers
//! is intercepted (`intercept`, with the sandbox's own CA from `ca`) and its requests get them,
//! the tenant's secrets filled in.

pub mod ca;
pub mod intercept;
pub mod peek;
pub mod policy;
pub mod proxy;
