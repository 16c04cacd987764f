//! The envd wire types and service traits, generated at build time from `proto/envd/*.proto`.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

connectrpc::include_generated!("_envd_connectrpc.rs");
