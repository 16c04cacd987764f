//! A sandbox's own egress policy (`allowOut`/`denyOut`), enforced by nftables in its
//! host-owned network namespace, which the sandbox cannot change. The operator's blocks (private
//! ranges, the host's own networks) are routes and come first; these rules only narrow what is
//! left. Rules are checked per packet, so a change reaches open connections' next packets.
//!
//! On the built-in runtime the sandbox's kernel stack sends through `tap0`: an `output` hook
//! turns denied packets away at once (the caller sees "no route to host" or a reset). gVisor
//! writes its own frames, which no IP hook of its namespace sees, so there the rules sit in
//! the router namespace its veth leads to (`crate::sandbox::netholder`), on the `forward` and
//! `prerouting` hooks of what arrives from it, with the same effect.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use super::net::ROUTER_DEVICE;
use crate::model::network::Egress;

/// The interface slirp4netns serves in every egress namespace.
pub const DEVICE: &str = "tap0";
const TABLE: &str = "sandbox_egress";
const PROXY_TABLE: &str = "sandbox_egress_proxy";

/// Where the rules hook in (see the module comment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// The namespace's own IP stack sends (built-in runtime).
    KernelStack,
    /// The namespace routes what a gVisor sandbox sends it over `ROUTER_DEVICE`.
    Router,
}

/// An nft script that replaces the namespace's policy tables in one transaction; with no
/// rules it only removes them. With `proxy`, every TCP connection the sandbox opens outward is
/// redirected to that port (on the namespace's loopback, or the router's address), where the
/// node's egress proxy listens and judges it by the name it carries; the filter then judges
/// only what is not TCP, and lets DNS reach slirp4netns's resolver.
pub fn ruleset(egress: Option<&Egress>, hook: Hook, proxy: Option<u16>) -> String {
    // Creating a table first makes its delete valid whether or not it existed.
    let mut s = format!(
        "table inet {TABLE}\ndelete table inet {TABLE}\ntable ip {PROXY_TABLE}\ndelete table ip {PROXY_TABLE}\n"
    );
    let Some(e) = egress else {
        return s;
    };
    // Where the sandbox's packets enter the hooks, and what else passes there.
    let (nat_hook, filter_hook, theirs, others) = match hook {
        Hook::KernelStack => (
            "output",
            "output",
            format!("oifname \"{DEVICE}\""),
            // Loopback carries the node's own connections to the agent.
            format!("oifname != \"{DEVICE}\""),
        ),
        Hook::Router => (
            "prerouting",
            "forward",
            format!("iifname \"{ROUTER_DEVICE}\""),
            format!("iifname != \"{ROUTER_DEVICE}\""),
        ),
    };
    if let Some(port) = proxy {
        s.push_str(&format!(
            "table ip {PROXY_TABLE} {{\n  chain out {{\n    type nat hook {nat_hook} priority -100; policy accept;\n    {theirs} meta l4proto tcp redirect to :{port}\n  }}\n}}\n"
        ));
    }
    s.push_str(&format!(
        "table inet {TABLE} {{\n  chain out {{\n    type filter hook {filter_hook} priority 0; policy accept;\n    {others} accept\n"
    ));
    if proxy.is_some() {
        if hook == Hook::KernelStack {
            // The filter still sees a redirected packet's first device (the hook's state is
            // not updated by the reroute), so what went to the proxy is recognized by its NAT.
            // (On a router, redirected packets are the router's own input, never forwarded.)
            s.push_str("    ct status dnat accept\n");
        }
        s.push_str(&format!(
            "    ip daddr {} accept\n",
            crate::sandbox::net::SLIRP_DNS
        ));
    }
    if !e.allow.is_empty() {
        s.push_str(&format!(
            "    ip daddr {{ {} }} accept\n",
            e.allow.join(", ")
        ));
    }
    if !e.deny.is_empty() {
        s.push_str(&format!(
            "    ip daddr {{ {} }} reject with icmpx type admin-prohibited\n",
            e.deny.join(", ")
        ));
    }
    s.push_str("  }\n}\n");
    s
}

/// Runs `nft` inside the network namespace `netns` (a `/proc/PID/ns/net` path) with `script`.
pub fn apply(nft: &Path, netns: &Path, script: &str) -> io::Result<()> {
    let ns = File::open(netns)?;
    let fd = ns.as_raw_fd();
    let mut cmd = Command::new(nft);
    cmd.args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setns is async-signal-safe and only touches the child's own namespace.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(ns);
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(script.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "nft refused the sandbox's egress rules: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn egress(allow: &[&str], deny: &[&str]) -> Egress {
        Egress {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn kernel_stack_rules_spare_loopback_and_reject_after_the_exceptions() {
        let s = ruleset(
            Some(&egress(&["203.0.113.7/32"], &["0.0.0.0/1", "128.0.0.0/1"])),
            Hook::KernelStack,
            None,
        );
        let lines: Vec<&str> = s.lines().map(str::trim).collect();
        assert_eq!(lines[0], "table inet sandbox_egress");
        assert_eq!(lines[1], "delete table inet sandbox_egress");
        let at = |needle: &str| {
            lines
                .iter()
                .position(|l| l.starts_with(needle))
                .unwrap_or_else(|| panic!("{needle} missing in {s}"))
        };
        assert!(at("type filter hook output") < at("oifname != \"tap0\" accept"));
        assert!(at("oifname") < at("ip daddr { 203.0.113.7/32 } accept"));
        assert!(
            at("ip daddr { 203.0.113.7/32 } accept")
                < at("ip daddr { 0.0.0.0/1, 128.0.0.0/1 } reject")
        );
    }

    #[test]
    fn router_rules_judge_what_the_sandbox_sends_through_the_router() {
        let s = ruleset(
            Some(&egress(&[], &["198.51.100.0/24"])),
            Hook::Router,
            Some(9),
        );
        assert!(s.contains("type filter hook forward priority 0"), "{s}");
        assert!(s.contains("iifname != \"vsb0\" accept"), "{s}");
        assert!(
            s.contains("ip daddr { 198.51.100.0/24 } reject with icmpx type admin-prohibited"),
            "{s}"
        );
        assert!(s.contains("type nat hook prerouting priority -100"), "{s}");
        assert!(
            s.contains("iifname \"vsb0\" meta l4proto tcp redirect to :9"),
            "{s}"
        );
        assert!(!s.contains("ct status dnat"), "{s}");
        assert!(s.contains("ip daddr 10.0.2.3 accept"), "{s}");
        assert!(!s.contains("{  }"), "no empty set: {s}");
        assert_eq!(s.matches("198.51.100.0/24").count(), 1, "{s}");
    }

    #[test]
    fn a_proxy_takes_every_tcp_connection_through_the_device() {
        let s = ruleset(
            Some(&egress(&[], &["0.0.0.0/0"])),
            Hook::KernelStack,
            Some(40123),
        );
        assert!(s.contains("table ip sandbox_egress_proxy {"), "{s}");
        assert!(s.contains("type nat hook output priority -100"), "{s}");
        assert!(
            s.contains("oifname \"tap0\" meta l4proto tcp redirect to :40123"),
            "{s}"
        );
        let dnat = s
            .find("ct status dnat accept")
            .expect("redirected packets pass");
        assert!(dnat < s.find("reject").expect("the denial"), "{s}");
        let dns = s
            .find("ip daddr 10.0.2.3 accept")
            .expect("DNS stays reachable");
        assert!(dns < s.find("reject").expect("the denial"), "{s}");
        // Without the proxy its table goes, whatever was there before.
        let off = ruleset(Some(&egress(&[], &["0.0.0.0/0"])), Hook::KernelStack, None);
        assert!(
            off.contains("delete table ip sandbox_egress_proxy"),
            "{off}"
        );
        assert!(!off.contains("redirect"), "{off}");
        assert!(!s.contains("10.0.2.3") || s.contains("redirect"));
    }

    #[test]
    fn no_rules_only_removes_the_tables() {
        assert_eq!(
            ruleset(None, Hook::Router, None),
            "table inet sandbox_egress\ndelete table inet sandbox_egress\ntable ip sandbox_egress_proxy\ndelete table ip sandbox_egress_proxy\n"
        );
    }
}
