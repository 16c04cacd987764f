//! The sandbox boundary's own processes, as the built-in runtime starts them: the supervisor
//! (host side, builds the namespaces) and the init (pid 1 inside, assembles the root and starts
//! the agent). The node-side half of the runtime is `node::runtime::builtin`.

pub mod init;
pub mod loopdev;
pub mod mounts;
pub mod net;
pub mod seccomp;
pub mod spec;
pub mod supervisor;
