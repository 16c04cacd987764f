//! The gVisor sections' warm pool: warm claims and memory per idle sandbox, gVisor beside the
//! built-in runtime in the same run. Memory comes from each member's cgroup (memory in use,
//! and the RSS and PSS of the processes in it), which both runtimes fill the same way.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::client::NodeConn;
use sandbox_gateway::model::ids;
use sandbox_gateway::proto;

use crate::common::*;
use crate::gvisor::RUNTIMES;

/// One runtime's warm pool: how long it took to fill, what an idle member costs, and warm
/// claims from it.
pub struct PoolCost {
    pub runtime: &'static str,
    pub pool: u32,
    /// Node start until the pool was full.
    pub fill: Duration,
    pub sandboxes: usize,
    /// Per idle sandbox: processes in its cgroup, its cgroup's memory in use (less inactive
    /// page cache), and the RSS and PSS of its processes.
    pub processes: f64,
    /// The processes' names (`comm`) over all members, with how many had each.
    pub names: BTreeMap<String, usize>,
    pub cgroup: u64,
    pub rss: u64,
    pub pss: u64,
    pub claim: Summary,
    pub rounds: usize,
}

/// A node's `sandbox-gateway.<tag>` cgroup directories (one per hierarchy), found by a
/// sandbox `id` in them.
fn node_cgroups(id: &str) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut found = Vec::new();
    let mut todo: Vec<(PathBuf, usize)> = mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2"))
                .then(|| (PathBuf::from(f[1]), 0))
        })
        .collect();
    while let Some((dir, depth)) = todo.pop() {
        let named = dir
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("sandbox-gateway."));
        if named && dir.join(id).is_dir() {
            found.push(dir);
            continue;
        }
        if depth >= 6 {
            continue;
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push((e.path(), depth + 1));
            }
        }
    }
    found
}

fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Memory in use of one cgroup directory, less inactive page cache (what the node's stats
/// report), if it is a memory cgroup.
fn cgroup_memory(dir: &Path) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let stat = read("memory.stat").unwrap_or_default();
    if let Some(cur) = read("memory.current") {
        let cache = stat_value(&stat, "inactive_file").unwrap_or(0);
        return Some(cur.trim().parse::<u64>().ok()?.saturating_sub(cache));
    }
    let usage = read("memory.usage_in_bytes")?.trim().parse::<u64>().ok()?;
    Some(usage.saturating_sub(stat_value(&stat, "total_inactive_file").unwrap_or(0)))
}

/// A process's name: the file name of its argv[0] (runsc re-executes itself, so its `comm`
/// is `exe`), with its first argument when that is a subcommand (`runsc-sandbox boot`); its
/// `comm` when it has no command line (the ptrace platform's stub processes).
fn process_name(pid: i32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).to_string())
        .collect();
    let first = args.first().map(String::as_str).unwrap_or_default();
    if first.is_empty() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        return format!("{} without a command line", comm.trim());
    }
    let name = first.rsplit('/').next().unwrap_or(first).to_string();
    match args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-') && !a.contains('/'))
    {
        Some(sub) if sub.chars().all(|c| c.is_ascii_lowercase() || c == '-') => {
            format!("{name} {sub}")
        }
        _ => name,
    }
}

/// The processes of a cgroup directory and the ones below it.
fn cgroup_pids(dir: &Path, out: &mut Vec<i32>) {
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            cgroup_pids(&e.path(), out);
        }
    }
}

/// A node with a warm pool of `pool` `base` sandboxes of each runtime: the idle members'
/// memory two seconds after the pool is full, then rounds of sequential warm claims (the pool
/// refilled between rounds) until `samples` were timed.
pub async fn bench_pool(pool: u32, samples: usize) -> Res<Vec<PoolCost>> {
    let mut out = Vec::new();
    for runtime in RUNTIMES {
        eprintln!("  {runtime}: pool of {pool}...");
        let token = ids::random_hex(16);
        let start = Instant::now();
        let node = Daemon::node_with(&NodeSpec {
            token: &token,
            name: &format!("pool-{runtime}"),
            pools: &[format!("base={pool}")],
            extra: &["--runtime".into(), runtime.into()],
        })?;
        let conn = NodeConn::new(&node.address, &token)?;
        wait_full(&conn, pool).await?;
        let fill = start.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let members: Vec<String> = std::fs::read_dir(node.dir.path().join("node/sandboxes"))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        let parents = members.first().map(|m| node_cgroups(m)).unwrap_or_default();
        let (mut cgroup, mut rss, mut pss, mut procs) = (0, 0, 0, 0);
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for m in &members {
            let dirs: Vec<PathBuf> = parents.iter().map(|p| p.join(m)).collect();
            cgroup += dirs.iter().find_map(|d| cgroup_memory(d)).unwrap_or(0);
            let mut pids = Vec::new();
            for d in &dirs {
                cgroup_pids(d, &mut pids);
            }
            pids.sort();
            pids.dedup();
            procs += pids.len();
            for p in pids {
                *names.entry(process_name(p)).or_default() += 1;
                let (r, s) = rss_pss(p);
                rss += r;
                pss += s;
            }
        }
        let n = members.len().max(1);
        let mut claims = Vec::new();
        let mut rounds = 0;
        while claims.len() < samples {
            rounds += 1;
            let mut taken = Vec::new();
            for _ in 0..pool {
                let mut c = conn.client();
                let t = Instant::now();
                let reply = c.claim(claim_request()).await?.into_inner();
                let took = t.elapsed();
                if reply.warm {
                    claims.push(took);
                }
                taken.extend(reply.sandbox.map(|s| s.id));
            }
            for id in taken {
                conn.client().release(proto::SandboxRef { id }).await?;
            }
            wait_full(&conn, pool).await?;
        }
        node.stop();
        out.push(PoolCost {
            runtime,
            pool,
            fill,
            sandboxes: members.len(),
            processes: procs as f64 / n as f64,
            names,
            cgroup: cgroup / n as u64,
            rss: rss / n as u64,
            pss: pss / n as u64,
            claim: summarize(claims),
            rounds,
        });
    }
    Ok(out)
}

pub fn render_pool(o: &mut String, p: &[PoolCost]) {
    let _ = writeln!(o, "## gVisor: warm claims and memory per idle sandbox\n");
    let first = p.first();
    let _ = writeln!(
        o,
        "Method: for each runtime in turn, one `sandbox-gateway node --runtime RUNTIME` with a \
         warm pool of {} `base` sandboxes (net none, small); \"fill\" is node start until the \
         pool was full. Two seconds later every member's cgroup (found under the node's \
         `sandbox-gateway.<tag>` cgroup by the instance id) is read: memory in use less \
         inactive page cache (what the node's stats report), and the RSS and PSS of every \
         process in it (their names as /proc shows them; on gVisor the ones without a command line are, by all \
         appearances, the ptrace platform's stub processes that hold the sandbox's address \
         spaces); figures per sandbox. Then rounds of sequential `Claim`s over loopback \
         gRPC take the whole pool, release it and wait for the refill; only warm claims count. \
         The node starts refilling 20 ms after the first claim of a round, so the later claims \
         of a round share the machine with boots (gVisor's cost far more CPU).\n",
        first.map_or(0, |c| c.pool)
    );
    let _ = writeln!(
        o,
        "| runtime | fill | sandboxes read | processes each (names) | cgroup memory | RSS | PSS | claims (rounds) | claim p50 | p90 | p99 |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    for c in p {
        let _ = writeln!(
            o,
            "| {} | {:.1} s | {} | {:.1} ({}) | {:.1} MiB | {:.1} MiB | {:.1} MiB | {} ({}) | {} | {} | {} |",
            c.runtime,
            c.fill.as_secs_f64(),
            c.sandboxes,
            c.processes,
            c.names
                .iter()
                .map(|(name, k)| format!("{name} ×{:.1}", *k as f64 / c.sandboxes.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", "),
            mib(c.cgroup),
            mib(c.rss),
            mib(c.pss),
            c.claim.n,
            c.rounds,
            ms(c.claim.p50),
            ms(c.claim.p90),
            ms(c.claim.p99)
        );
    }
    let by = |rt: &str| p.iter().find(|c| c.runtime == rt);
    if let (Some(g), Some(b)) = (by("gvisor"), by("builtin")) {
        let _ = writeln!(
            o,
            "\ngVisor / builtin: claim p50 {:.2}×, p99 {:.2}×; cgroup memory per idle sandbox \
             {:.1}×, PSS {:.1}×; pool fill {:.1}×. A warm claim hands over a booted sandbox, so \
             the runtime is not on its path; an idle gVisor sandbox carries the Sentry and its \
             own kernel state. Anchor: a microVM reserves its guest memory (512 MiB for the \
             reference's `small`).\n",
            g.claim.p50.as_secs_f64() / b.claim.p50.as_secs_f64().max(1e-9),
            g.claim.p99.as_secs_f64() / b.claim.p99.as_secs_f64().max(1e-9),
            g.cgroup as f64 / (b.cgroup as f64).max(1.0),
            g.pss as f64 / (b.pss as f64).max(1.0),
            g.fill.as_secs_f64() / b.fill.as_secs_f64().max(1e-9)
        );
    }
}
