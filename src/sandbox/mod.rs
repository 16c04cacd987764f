//! The sandbox boundary's own processes. The built-in runtime starts a supervisor (host side,
//! builds the namespaces) and an init (pid 1 inside, assembles the root and starts the agent);
//! the gVisor runtime starts its own init inside runsc and, for egress, a network holder. Both
//! inits start the template's services (`services`). The
//! node-side halves are `node::runtime::builtin` and `node::runtime::gvisor`.

pub mod detached;
pub mod egress;
pub mod gvisor_init;
pub mod init;
pub mod loopdev;
pub mod mounts;
pub mod net;
pub mod netholder;
pub mod savefiles;
pub mod seccomp;
pub mod services;
pub mod spec;
pub mod supervisor;
