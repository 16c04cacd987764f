//! The node's egress proxy: a sandbox whose policy allows domain names has every outbound TCP
//! connection forced through it from inside its network namespace, judged by the name it
//! carries (HTTP `Host`, TLS SNI) and its address in e2b's order. Transforms (headers set with
//! the tenant's secrets filled in) are still to come (issue 26).

pub mod ca;
pub mod intercept;
pub mod peek;
pub mod policy;
pub mod proxy;
