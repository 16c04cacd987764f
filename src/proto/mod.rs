//! The node protocol (generated from `proto/node.proto`) and its mapping onto the domain model.

#![allow(clippy::all, clippy::pedantic)]

tonic::include_proto!("sandboxgateway.node.v1");

pub mod auth;
mod convert;

pub use convert::{error_from_status, from_ms, to_ms};
