//! The soak's fleet: three node processes and two gateway replicas in front of all of them,
//! and what is measured of them (memory, descriptors, what they leave behind).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandbox_gateway::model::ids;

use crate::common::{Daemon, NodeSpec, Res, free_port};

pub const NODES: usize = 3;
pub const GATEWAYS: usize = 2;
/// Warm `base/egress` sandboxes per node.
pub const POOL: u32 = 4;

pub struct Fleet {
    pub nodes: Vec<Daemon>,
    pub gateways: Vec<Daemon>,
    pub http: reqwest::Client,
    /// Trusts the gateways' Kubernetes listeners (each has its own CA).
    pub https: Vec<reqwest::Client>,
    /// What the second replica was started with beyond the first's (`--replica-1-arg`), so
    /// that one run compares a setting side by side.
    pub replica_1_args: Vec<String>,
}

impl Fleet {
    pub async fn start(replica_1_args: Vec<String>) -> Res<Fleet> {
        let token = ids::random_hex(16);
        let nodes: Vec<Daemon> = (0..NODES)
            .map(|i| {
                // A fixed port, so that a restarted node is where the gateways look for it.
                let listen = format!("127.0.0.1:{}", free_port()?);
                Daemon::node_with(&NodeSpec {
                    token: &token,
                    name: &format!("soak{i}"),
                    pools: &[format!("base/egress={POOL}")],
                    extra: &["--listen".into(), listen],
                })
            })
            .collect::<Res<_>>()?;
        let gateways = (0..GATEWAYS)
            .map(|i| Self::gateway(&nodes, if i == 1 { &replica_1_args } else { &[] }))
            .collect::<Res<Vec<_>>>()?;
        let mut https = Vec::new();
        for g in &gateways {
            let ca = std::fs::read_to_string(g.dir.path().join("tls/ca.crt"))?;
            https.push(
                reqwest::Client::builder()
                    .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?)
                    .build()?,
            );
        }
        let fleet = Fleet {
            nodes,
            gateways,
            http: reqwest::Client::new(),
            https,
            replica_1_args,
        };
        fleet.settle(Duration::from_secs(60)).await?;
        Ok(fleet)
    }

    /// A gateway replica in front of every node, with `more` arguments.
    pub fn gateway(nodes: &[Daemon], more: &[String]) -> Res<Daemon> {
        let token_file = nodes[0].dir.path().join("token");
        // Replicas share the secret that signs envd tokens, as a deployment's do.
        let secret = nodes[0].dir.path().join("envd-secret");
        if !secret.exists() {
            std::fs::write(&secret, ids::random_hex(32))?;
        }
        let mut extra = vec![
            "--node-token-file".to_string(),
            token_file.display().to_string(),
            "--envd-secret-file".to_string(),
            secret.display().to_string(),
        ];
        for d in nodes {
            extra.push("--node".into());
            extra.push(d.address.clone());
        }
        extra.extend_from_slice(more);
        Daemon::gateway_with(&[], &extra)
    }

    pub fn node_root(d: &Daemon) -> PathBuf {
        d.dir.path().join("node")
    }

    /// Waits until no sandbox is claimed and every warm pool is full again: each instance has
    /// its process and has mounted its disk (a loop device is attached late in a boot, and a
    /// released sandbox's device detaches a moment after its mount namespace is gone).
    pub async fn settle(&self, within: Duration) -> Res<()> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let listed = self.claimed().await?;
            let claimed = listed.len();
            let warm: usize = self
                .nodes
                .iter()
                .map(|n| instance_dirs(&Self::node_root(n)))
                .sum();
            let running: usize = self
                .nodes
                .iter()
                .map(|n| crate::common::sandbox_processes(&Self::node_root(n)).len())
                .sum();
            let loops: usize = self
                .nodes
                .iter()
                .map(|n| loops_under(&Self::node_root(n)))
                .sum();
            if claimed == 0 && warm == NODES * POOL as usize && running == warm && loops == warm {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                return Err(format!(
                    "the fleet did not settle: {claimed} claimed ({listed:?}), {warm} instance directories, {running} with processes, {loops} loop devices; left claimed: {}",
                    self.describe_claimed().await.unwrap_or_else(|e| e.to_string())
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The first gateway's e2b listing of running and paused sandboxes (one page of 100).
    async fn listed(&self) -> Res<serde_json::Value> {
        let r = self
            .http
            .get(format!(
                "{}/v2/sandboxes?state=running,paused&limit=100",
                self.gateways[0].address
            ))
            .header("X-API-KEY", crate::KEY)
            .send()
            .await?;
        Ok(r.json().await?)
    }

    /// What the first gateway says of each claimed sandbox: id, metadata, start and end.
    pub async fn describe_claimed(&self) -> Res<String> {
        let body = self.listed().await?;
        Ok(body
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        format!(
                            "{} {} started {} ends {}",
                            s["sandboxID"], s["metadata"], s["startedAt"], s["endAt"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            })
            .unwrap_or_default())
    }

    /// Sandboxes the first gateway lists (running and paused): id, node, state.
    pub async fn claimed(&self) -> Res<Vec<(String, String, String)>> {
        let body = self.listed().await?;
        let field = |s: &serde_json::Value, k: &str| s[k].as_str().unwrap_or_default().to_string();
        Ok(body
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|s| {
                        (
                            field(s, "sandboxID"),
                            field(s, "clientID"),
                            field(s, "state"),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    /// Every process of the fleet, labelled.
    pub fn processes(&self) -> Vec<(String, i32)> {
        let mut out = Vec::new();
        for (i, g) in self.gateways.iter().enumerate() {
            let label = match i {
                1 if !self.replica_1_args.is_empty() => {
                    format!("gateway {i} (`{}`)", self.replica_1_args.join(" "))
                }
                _ => format!("gateway {i}"),
            };
            out.push((label, g.pid()));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            out.push((format!("node {i}"), n.pid()));
        }
        out
    }

    /// What the fleet leaves on the machine beyond its warm pools, for the leak check.
    pub fn footprint(&self) -> Footprint {
        let roots: Vec<PathBuf> = self.nodes.iter().map(Self::node_root).collect();
        Footprint {
            instance_dirs: roots.iter().map(|r| instance_dirs(r)).sum(),
            sandbox_processes: roots
                .iter()
                .map(|r| crate::common::sandbox_processes(r).len())
                .sum(),
            mounts: roots.iter().map(|r| mounts_under(r)).sum(),
            loop_devices: roots.iter().map(|r| loops_under(r)).sum(),
            checkpoints: roots
                .iter()
                .map(|r| dir_count(&r.join("checkpoints")))
                .sum(),
            fds: self.processes().iter().map(|(_, p)| fds(*p)).sum(),
            driver_connections: {
                let tcp = tcp_sockets();
                let ours = driver_ports(&tcp);
                self.processes()
                    .iter()
                    .map(|(_, p)| connections_to(*p, &tcp, &ours))
                    .sum()
            },
        }
    }
}

/// Counts of what a fleet holds; compared before and after a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Footprint {
    pub instance_dirs: usize,
    pub sandbox_processes: usize,
    pub mounts: usize,
    pub loop_devices: usize,
    pub checkpoints: usize,
    pub fds: usize,
    /// Of `fds`, the fleet's ends of TCP connections this driver holds open (its clients'
    /// keep-alive pools): those close when the driver does, so they are not the fleet's leak.
    pub driver_connections: usize,
}

impl Footprint {
    /// Descriptors the fleet holds of its own accord.
    pub fn own_fds(&self) -> i64 {
        self.fds as i64 - self.driver_connections as i64
    }
}

fn dir_count(d: &Path) -> usize {
    std::fs::read_dir(d).map_or(0, |r| r.count())
}

fn instance_dirs(root: &Path) -> usize {
    dir_count(&root.join("sandboxes"))
}

fn mounts_under(root: &Path) -> usize {
    let prefix = root.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| t.lines().filter(|l| l.contains(&prefix)).count())
        .unwrap_or(0)
}

fn loops_under(root: &Path) -> usize {
    let prefix = root.display().to_string();
    std::fs::read_dir("/sys/block")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("loop/backing_file"))
                        .is_ok_and(|b| b.starts_with(&prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

pub fn fds(pid: i32) -> usize {
    dir_count(Path::new(&format!("/proc/{pid}/fd")))
}

/// Resident memory of `pid` in KiB.
pub fn rss_kib(pid: i32) -> u64 {
    crate::common::rss_pss(pid).0 / 1024
}

/// A TCP socket of this network namespace: its inode and its local and remote ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSocket {
    inode: u64,
    local_port: u16,
    remote_port: u16,
}

/// Every TCP socket in `/proc/net/tcp` and `tcp6` (the driver and the fleet share the host's
/// network namespace; sandboxes have their own and are not counted here).
fn tcp_sockets() -> Vec<TcpSocket> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| {
            t.lines()
                .skip(1)
                .filter_map(parse_tcp_line)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One row of `/proc/net/tcp`: `sl local rem st tx:rx tr:when retrnsmt uid timeout inode …`,
/// addresses as `HEXADDR:HEXPORT`.
fn parse_tcp_line(line: &str) -> Option<TcpSocket> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
    Some(TcpSocket {
        local_port: port(f.get(1)?)?,
        remote_port: port(f.get(2)?)?,
        inode: f.get(9)?.parse().ok()?,
    })
}

/// The socket inodes a process holds (`socket:[N]` links under `/proc/PID/fd`).
fn socket_inodes(pid: &str) -> std::collections::HashSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Local ports of the TCP connections this driver process holds.
fn driver_ports(tcp: &[TcpSocket]) -> std::collections::HashSet<u16> {
    let mine = socket_inodes("self");
    tcp.iter()
        .filter(|s| mine.contains(&s.inode))
        .map(|s| s.local_port)
        .collect()
}

/// How many of `pid`'s sockets are connected to one of the driver's ports.
fn connections_to(pid: i32, tcp: &[TcpSocket], driver: &std::collections::HashSet<u16>) -> usize {
    let held = socket_inodes(&pid.to_string());
    tcp.iter()
        .filter(|s| held.contains(&s.inode) && driver.contains(&s.remote_port))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_rows_give_ports_and_inodes() {
        let v4 = "   3: 0100007F:A2C4 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 734911 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(
            parse_tcp_line(v4),
            Some(TcpSocket {
                inode: 734911,
                local_port: 0xA2C4,
                remote_port: 8080
            })
        );
        let v6 = "   0: 00000000000000000000000001000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1234 1 0000000000000000 100 0 0 10 0";
        assert_eq!(
            parse_tcp_line(v6).map(|s| (s.local_port, s.inode)),
            Some((80, 1234))
        );
        assert_eq!(parse_tcp_line("  sl  local_address rem_address"), None);
        assert_eq!(parse_tcp_line(""), None);
    }

    #[test]
    fn a_connection_is_found_from_both_ends() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_server, _) = listener.accept().unwrap();
        let tcp = tcp_sockets();
        let ports = driver_ports(&tcp);
        assert!(ports.contains(&client.local_addr().unwrap().port()));
        // This process holds both ends: the server's end has the client's port as its peer.
        let me = std::process::id() as i32;
        assert!(connections_to(me, &tcp, &ports) >= 1);
    }
}
