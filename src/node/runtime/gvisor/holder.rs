//! The node's side of a gVisor sandbox's network holder (`crate::sandbox::netholder`): starts
//! it in the sandbox's cgroups, waits for its "ready" (which names the descriptor holding the
//! router's namespace), and kills it when dropped.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::super::builtin::AgentCommand;
use super::super::cgroup::{CgroupSet, Cgroups};
use super::super::reaper::LIFELINE_FD;
use crate::model::{Error, Result};
use crate::sandbox::netholder::HolderSpec;

pub struct Holder {
    child: tokio::process::Child,
    pid: u32,
    /// The holder's descriptor of its router's namespace.
    router_fd: u32,
}

impl Holder {
    pub async fn start(
        agent: &AgentCommand,
        spec: &HolderSpec,
        cgroup: &CgroupSet,
        lifeline: RawFd,
        timeout: Duration,
    ) -> Result<Holder> {
        let arg = serde_json::to_string(spec)
            .map_err(|e| Error::internal(format!("describing the network holder: {e}")))?;
        let mut cmd = tokio::process::Command::new(&agent.program);
        cmd.args(&agent.leading_args)
            .arg("agent")
            .arg("--net-holder")
            .arg(arg)
            .arg("--lifeline-fd")
            .arg(LIFELINE_FD.to_string())
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let held = Cgroups::start_in(&mut cmd, cgroup, Some((lifeline, LIFELINE_FD)))
            .map_err(|e| Error::io("opening the instance cgroups", e))?;
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::io("starting the network holder", e))?;
        drop(held);
        let pid = child.id().unwrap_or(0);
        let stdout = child.stdout.take();
        let ready = async {
            let mut lines = BufReader::new(stdout?).lines();
            lines.next_line().await.ok().flatten()
        };
        let outcome = tokio::time::timeout(timeout, ready).await;
        if let Ok(Some(line)) = &outcome
            && let Some(router_fd) = ready_fd(line)
            && pid > 0
        {
            return Ok(Holder {
                child,
                pid,
                router_fd,
            });
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
        Err(match outcome {
            Err(_) => crate::node::runtime::boot_too_slow("the network holder", timeout),
            Ok(_) => Error::internal("the network holder exited before it was ready"),
        })
    }

    /// The namespace runsc attaches the sandbox to.
    pub fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid))
    }

    /// The router's namespace, where the sandbox's egress rules and proxy go.
    pub fn router_netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{}", self.pid, self.router_fd))
    }
}

/// The router's descriptor a holder's "ready" line names.
fn ready_fd(line: &str) -> Option<u32> {
    line.trim().strip_prefix("ready ")?.parse().ok()
}

impl Drop for Holder {
    fn drop(&mut self) {
        // slirp4netns follows it (its exit pipe closes); tokio reaps the process.
        let _ = self.child.start_kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_names_the_routers_descriptor() {
        assert_eq!(ready_fd("ready 7\n"), Some(7));
        assert_eq!(ready_fd("ready"), None);
        assert_eq!(ready_fd("ready x"), None);
        assert_eq!(ready_fd("network holder: failed"), None);
    }
}
