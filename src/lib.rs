//! sandbox-gateway: e2b-compatible and Kubernetes-native sandboxes on node daemons with warm
//! pools. One binary runs the gateway, the node daemon and the in-sandbox agent.

pub mod agent;
pub mod cluster;
pub mod config;
pub mod dashboard;
pub mod dispatch;
pub mod e2b;
pub mod envd;
pub mod facade;
pub mod fsx;
pub mod gateway;
pub mod httpx;
pub mod interpreter;
pub mod iox;
pub mod model;
pub mod node;
pub mod proto;
pub mod sandbox;
pub mod secrets;
pub mod templates;
pub mod tlsx;
pub mod volumes;
