//! The network namespaces of a gVisor sandbox with egress. runsc attaches a sandbox to an
//! existing namespace, so this small process (host root, in the sandbox's cgroups) makes two:
//! the sandbox's, where gVisor's stack takes a veth device and routes to the allowed address
//! space only, and a router's at the other end of the veth, with slirp4netns and the host
//! kernel's IP stack, where the node's nftables rules and egress proxy see every connection
//! (gVisor writes frames, which no IP hook in its own namespace would see). It says "ready"
//! with the descriptor that holds the router's namespace, stays in the sandbox's, and keeps
//! both until the node lets go of it: it is killed when the sandbox is paused or ended, and it
//! ends by itself when the node's lifeline closes. A restore (resume, fork, a sandbox made from
//! a snapshot) gets a fresh holder: gVisor takes the interface's addresses for its own stack,
//! so a namespace serves one start.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;

use nix::sched::{CloneFlags, setns, unshare};
use serde::{Deserialize, Serialize};

use super::net;
use super::spec::Net;

/// What the node tells a holder, as one command-line argument.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HolderSpec {
    pub slirp4netns: PathBuf,
    pub blocked: Vec<String>,
}

/// Runs the holder; returns the exit code.
pub fn run(spec: &str, lifeline: RawFd) -> i32 {
    match hold(spec, lifeline) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("network holder: {e}");
            1
        }
    }
}

fn hold(spec: &str, lifeline: RawFd) -> io::Result<()> {
    let spec: HolderSpec =
        serde_json::from_str(spec).map_err(|e| io::Error::other(format!("bad spec: {e}")))?;
    let new_netns = |what: &str| -> io::Result<File> {
        unshare(CloneFlags::CLONE_NEWNET)
            .map_err(|e| io::Error::other(format!("creating the {what} network namespace: {e}")))?;
        File::open("/proc/self/ns/net")
    };
    let host_netns = File::open("/proc/self/ns/net")?;
    let sandbox = new_netns("sandbox's")?;
    net::setup_namespace()?;
    let router = new_netns("router's")?;
    // slirp4netns exits by itself when this process does (its exit pipe closes).
    let _slirp = net::equip(
        Net::Egress,
        Some(&spec.slirp4netns),
        &spec.blocked,
        &host_netns,
    )?;
    drop(host_netns);
    net::link_router(&sandbox)
        .map_err(|e| io::Error::other(format!("linking the sandbox to its router: {e}")))?;
    setns(&sandbox, CloneFlags::CLONE_NEWNET)
        .map_err(|e| io::Error::other(format!("returning to the sandbox's namespace: {e}")))?;
    net::equip_routed(&spec.blocked)
        .map_err(|e| io::Error::other(format!("routing the sandbox's namespace: {e}")))?;
    let mut out = io::stdout();
    out.write_all(format!("ready {}\n", router.as_raw_fd()).as_bytes())?;
    out.flush()?;
    let mut buf = [0u8; 16];
    loop {
        // SAFETY: reading into a valid buffer; the node never writes.
        let n = unsafe { libc::read(lifeline, buf.as_mut_ptr().cast(), buf.len()) };
        if n == 0 || (n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted) {
            return Ok(());
        }
    }
}
