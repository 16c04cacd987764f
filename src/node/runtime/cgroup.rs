//! Cgroups give each instance its limits (memory, CPU, processes), its measurements, a way to
//! freeze it (pause) and a way to kill every member, even processes that left the instance's
//! process group. A pure cgroup v2 host uses one directory per instance; a hybrid host (v1
//! controllers beside a nearly empty v2 mount, as on these machines) uses the v2 directory for
//! freezing and killing and v1 directories for the controllers.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// What one hierarchy provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// cgroup v2 with the controllers listed in `Hierarchy::controllers`.
    V2,
    V1Freezer,
    V1Memory,
    V1Pids,
    V1Cpu,
    V1Cpuacct,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hierarchy {
    pub kind: Kind,
    /// This node's directory in the hierarchy; one child per instance.
    pub parent: PathBuf,
    /// v2 only: the controllers enabled for instances.
    #[serde(default)]
    pub controllers: Vec<String>,
}

/// The hierarchies this node uses.
#[derive(Debug, Clone)]
pub struct Cgroups {
    pub hierarchies: Vec<Hierarchy>,
}

/// One instance's directories, one per hierarchy (in the order of `Cgroups::hierarchies`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CgroupSet {
    pub dirs: Vec<(Kind, PathBuf)>,
}

/// An instance's limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory_bytes: u64,
    pub cpus: u32,
    pub pids: u32,
}

/// Measured use.
#[derive(Debug, Clone, Copy, Default)]
pub struct Measured {
    pub memory_bytes: Option<u64>,
    /// Memory the kernel cannot drop to make room: in use less all page cache (what is left
    /// is anonymous and shared memory, which is all of a gVisor sandbox's own).
    pub unreclaimable_bytes: Option<u64>,
    pub cpu_ns: Option<u64>,
    pub pids: Option<u32>,
    pub oom_kills: Option<u64>,
}

const SETTLE: Duration = Duration::from_secs(5);
const CPU_PERIOD_US: u64 = 100_000;

struct Mount {
    dir: String,
    ty: String,
    opts: String,
}

fn mounts() -> Vec<Mount> {
    let Ok(text) = fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let _dev = f.next()?;
            let dir = f.next()?.to_string();
            let ty = f.next()?.to_string();
            let opts = f.next()?.to_string();
            Some(Mount { dir, ty, opts })
        })
        .collect()
}

/// This process's path in the hierarchy whose /proc/self/cgroup line matches `pick`.
fn own_path(pick: impl Fn(&str, &str) -> bool) -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let id = f.next()?;
        let controllers = f.next()?;
        let path = f.next()?;
        pick(id, controllers).then(|| path.to_string())
    })
}

fn under(mount: &str, path: &str, leaf: &str) -> PathBuf {
    Path::new(mount)
        .join(path.trim_start_matches('/'))
        .join(leaf)
}

const WANTED_V2: [&str; 3] = ["memory", "pids", "cpu"];

fn v2_controllers(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join("cgroup.controllers"))
        .map(|t| t.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Enables the wanted controllers for `dir`'s children; on a cgroup that holds processes
/// (this node, typically) the kernel refuses, so this process first moves into a leaf of its own.
fn enable_v2(own: &Path, parent: &Path) -> bool {
    let enable = |dir: &Path| {
        let line = WANTED_V2.map(|c| format!("+{c}")).join(" ");
        fs::write(dir.join("cgroup.subtree_control"), line)
    };
    if enable(own).is_err() {
        let leaf = own.join("sandbox-gateway-node");
        if fs::create_dir_all(&leaf).is_err()
            || fs::write(leaf.join("cgroup.procs"), std::process::id().to_string()).is_err()
            || enable(own).is_err()
        {
            return false;
        }
    }
    enable(parent).is_ok()
}

impl Cgroups {
    /// Finds the hierarchies this machine offers and creates this node's directory in each.
    /// `tag` keeps nodes that share a machine apart. None when nothing usable is mounted.
    pub fn detect(tag: &str) -> Option<Cgroups> {
        let leaf = format!("sandbox-gateway.{tag}");
        let mounts = mounts();
        let mut hierarchies = Vec::new();
        if let Some(m) = mounts.iter().find(|m| m.ty == "cgroup2") {
            let own_rel = own_path(|id, c| id == "0" && c.is_empty()).unwrap_or_default();
            let own = under(&m.dir, &own_rel, "");
            let parent = under(&m.dir, &own_rel, &leaf);
            if fs::create_dir_all(&parent).is_ok() && parent.join("cgroup.freeze").exists() {
                let offered = v2_controllers(&own);
                let full = WANTED_V2.iter().all(|c| offered.iter().any(|o| o == c))
                    && enable_v2(&own, &parent);
                hierarchies.push(Hierarchy {
                    kind: Kind::V2,
                    parent,
                    controllers: if full {
                        WANTED_V2.map(str::to_string).to_vec()
                    } else {
                        Vec::new()
                    },
                });
            } else {
                let _ = fs::remove_dir(&parent);
            }
        }
        let v2_full = hierarchies
            .first()
            .is_some_and(|h| !h.controllers.is_empty());
        if !v2_full {
            for (controller, kind) in [
                ("freezer", Kind::V1Freezer),
                ("memory", Kind::V1Memory),
                ("pids", Kind::V1Pids),
                ("cpu", Kind::V1Cpu),
                ("cpuacct", Kind::V1Cpuacct),
            ] {
                if kind == Kind::V1Freezer && !hierarchies.is_empty() {
                    continue; // v2 freezes and kills
                }
                let has = |opts: &str| opts.split(',').any(|o| o == controller);
                let Some(m) = mounts.iter().find(|m| m.ty == "cgroup" && has(&m.opts)) else {
                    continue;
                };
                let own =
                    own_path(|_, c| c.split(',').any(|x| x == controller)).unwrap_or_default();
                let parent = under(&m.dir, &own, &leaf);
                if fs::create_dir_all(&parent).is_ok() {
                    hierarchies.push(Hierarchy {
                        kind,
                        parent,
                        controllers: Vec::new(),
                    });
                }
            }
        }
        (!hierarchies.is_empty()).then_some(Cgroups { hierarchies })
    }

    /// Whether memory, CPU and process limits can all be enforced.
    pub fn enforces_limits(&self) -> bool {
        let has = |k: Kind| self.hierarchies.iter().any(|h| h.kind == k);
        self.hierarchies
            .iter()
            .any(|h| h.kind == Kind::V2 && h.controllers.len() == WANTED_V2.len())
            || (has(Kind::V1Memory) && has(Kind::V1Pids) && has(Kind::V1Cpu))
    }

    /// A one-line description for the startup log.
    pub fn describe(&self) -> String {
        self.hierarchies
            .iter()
            .map(|h| match h.kind {
                Kind::V2 if h.controllers.is_empty() => "v2 (freeze, kill)".to_string(),
                Kind::V2 => format!("v2 ({})", h.controllers.join(", ")),
                Kind::V1Freezer => "v1 freezer".into(),
                Kind::V1Memory => "v1 memory".into(),
                Kind::V1Pids => "v1 pids".into(),
                Kind::V1Cpu => "v1 cpu".into(),
                Kind::V1Cpuacct => "v1 cpuacct".into(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn create(&self, name: &str) -> io::Result<CgroupSet> {
        let mut set = CgroupSet { dirs: Vec::new() };
        for h in &self.hierarchies {
            let p = h.parent.join(name);
            if let Err(e) = fs::create_dir(&p) {
                let _ = self.destroy(&set);
                return Err(e);
            }
            set.dirs.push((h.kind, p));
        }
        Ok(set)
    }

    /// Applies the limits. Swap is capped at zero where the kernel offers the knob, so the
    /// memory limit is a limit on memory, not on memory plus swap.
    pub fn limit(&self, set: &CgroupSet, l: Limits) -> io::Result<()> {
        let quota = CPU_PERIOD_US * l.cpus.max(1) as u64;
        for (kind, dir) in &set.dirs {
            match kind {
                Kind::V2 => {
                    let h = self.hierarchies.iter().find(|h| h.kind == Kind::V2);
                    if h.is_none_or(|h| h.controllers.is_empty()) {
                        continue;
                    }
                    fs::write(dir.join("memory.max"), l.memory_bytes.to_string())?;
                    let _ = fs::write(dir.join("memory.swap.max"), "0");
                    fs::write(dir.join("pids.max"), l.pids.to_string())?;
                    fs::write(dir.join("cpu.max"), format!("{quota} {CPU_PERIOD_US}"))?;
                }
                Kind::V1Memory => {
                    fs::write(
                        dir.join("memory.limit_in_bytes"),
                        l.memory_bytes.to_string(),
                    )?;
                    let _ = fs::write(
                        dir.join("memory.memsw.limit_in_bytes"),
                        l.memory_bytes.to_string(),
                    );
                }
                Kind::V1Pids => fs::write(dir.join("pids.max"), l.pids.to_string())?,
                Kind::V1Cpu => {
                    fs::write(dir.join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string())?;
                    fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string())?;
                }
                Kind::V1Freezer | Kind::V1Cpuacct => {}
            }
        }
        Ok(())
    }

    /// Makes `cmd` start in a session of its own inside `set`: the child moves itself into
    /// every hierarchy before it runs anything, so nothing it starts escapes the limits.
    /// `keep` moves a descriptor onto a fixed number in the child (a lifeline, say). The
    /// returned files must stay open until the command has been spawned.
    pub fn start_in(
        cmd: &mut tokio::process::Command,
        set: &CgroupSet,
        keep: Option<(std::os::fd::RawFd, std::os::fd::RawFd)>,
    ) -> io::Result<Vec<fs::File>> {
        use std::os::fd::AsRawFd;
        let procs: Vec<fs::File> = Self::procs_files(set)
            .iter()
            .map(|p| fs::OpenOptions::new().write(true).open(p))
            .collect::<io::Result<_>>()?;
        let fds: Vec<i32> = procs.iter().map(|f| f.as_raw_fd()).collect();
        // SAFETY: the closure runs in the forked child before exec and only makes
        // async-signal-safe system calls on values prepared before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                for &fd in &fds {
                    // "0" moves the writing process itself into the cgroup.
                    if libc::write(fd, b"0".as_ptr().cast(), 1) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                // dup2 clears close-on-exec on the target, so the descriptor survives exec.
                if let Some((from, to)) = keep
                    && libc::dup2(from, to) < 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(procs)
    }

    pub fn procs_files(set: &CgroupSet) -> Vec<PathBuf> {
        set.dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect()
    }

    /// The instance's processes (every hierarchy holds all of them; the first is read).
    pub fn pids(set: &CgroupSet) -> Vec<i32> {
        set.dirs
            .first()
            .and_then(|(_, d)| fs::read_to_string(d.join("cgroup.procs")).ok())
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    fn freezer(set: &CgroupSet) -> Option<(Kind, &Path)> {
        set.dirs
            .iter()
            .find(|(k, _)| matches!(k, Kind::V2 | Kind::V1Freezer))
            .map(|(k, d)| (*k, d.as_path()))
    }

    fn wait_for(mut done: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        loop {
            if done() {
                return true;
            }
            if start.elapsed() > SETTLE {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub fn freeze(&self, set: &CgroupSet) -> io::Result<()> {
        match Self::freezer(set) {
            Some((Kind::V2, cg)) => {
                fs::write(cg.join("cgroup.freeze"), "1")?;
                let events = cg.join("cgroup.events");
                let ok = Self::wait_for(|| {
                    fs::read_to_string(&events).is_ok_and(|t| t.lines().any(|l| l == "frozen 1"))
                });
                if !ok {
                    return Err(io::Error::other("cgroup did not report frozen in time"));
                }
                Ok(())
            }
            Some((_, cg)) => {
                let state = cg.join("freezer.state");
                fs::write(&state, "FROZEN")?;
                let ok = Self::wait_for(|| {
                    fs::read_to_string(&state).is_ok_and(|t| t.trim() == "FROZEN")
                });
                if !ok {
                    return Err(io::Error::other("freezer did not reach FROZEN in time"));
                }
                Ok(())
            }
            None => Err(io::Error::other("no freezer for this instance")),
        }
    }

    pub fn thaw(&self, set: &CgroupSet) -> io::Result<()> {
        match Self::freezer(set) {
            Some((Kind::V2, cg)) => fs::write(cg.join("cgroup.freeze"), "0"),
            Some((_, cg)) => fs::write(cg.join("freezer.state"), "THAWED"),
            None => Ok(()),
        }
    }

    /// Kills every member, waits until the instance is empty, and removes its directories.
    pub fn destroy(&self, set: &CgroupSet) -> io::Result<()> {
        let kill_file = Self::freezer(set)
            .filter(|(k, _)| *k == Kind::V2)
            .map(|(_, d)| d.join("cgroup.kill"));
        let emptied = Self::wait_for(|| {
            match &kill_file {
                Some(f) if f.exists() => {
                    let _ = fs::write(f, "1");
                }
                _ => {
                    for pid in Self::pids(set) {
                        super::sys::kill_pid(pid, libc::SIGKILL);
                    }
                }
            }
            // A frozen task only acts on SIGKILL once thawed.
            let _ = self.thaw(set);
            set.dirs.iter().all(|(_, d)| {
                !d.exists()
                    || fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|t| t.trim().is_empty())
            })
        });
        if !emptied {
            return Err(io::Error::other("the instance's processes did not exit"));
        }
        let mut last = Ok(());
        for (_, d) in &set.dirs {
            // The kernel may need a moment after the last exit before rmdir succeeds.
            Self::wait_for(|| {
                last = fs::remove_dir(d);
                last.is_ok() || !d.exists()
            });
        }
        match last {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// What `measure` calls `unreclaimable_bytes`, read alone (the gVisor memory guard looks
    /// at it every 100 ms).
    pub fn unreclaimable(set: &CgroupSet) -> Option<u64> {
        // A hybrid host has a v2 directory without the memory controller beside the v1 one.
        set.dirs
            .iter()
            .filter(|(k, _)| matches!(k, Kind::V2 | Kind::V1Memory))
            .find_map(|(k, d)| memory_in(*k, d).1)
    }

    pub fn measure(set: &CgroupSet) -> Measured {
        let mut m = Measured::default();
        let read = |p: PathBuf| fs::read_to_string(p).ok();
        for (kind, dir) in &set.dirs {
            match kind {
                Kind::V2 => {
                    (m.memory_bytes, m.unreclaimable_bytes) = memory_in(*kind, dir);
                    if let Some(t) = read(dir.join("cpu.stat")) {
                        m.cpu_ns = stat_value(&t, "usage_usec").map(|us| us * 1000);
                    }
                    if let Some(t) = read(dir.join("pids.current")) {
                        m.pids = t.trim().parse().ok();
                    }
                    if let Some(t) = read(dir.join("memory.events")) {
                        m.oom_kills = stat_value(&t, "oom_kill");
                    }
                }
                Kind::V1Memory => {
                    (m.memory_bytes, m.unreclaimable_bytes) = memory_in(*kind, dir);
                    m.oom_kills = read(dir.join("memory.oom_control"))
                        .and_then(|t| stat_value(&t, "oom_kill"));
                }
                Kind::V1Cpuacct => {
                    m.cpu_ns = read(dir.join("cpuacct.usage")).and_then(|t| t.trim().parse().ok());
                }
                Kind::V1Pids => {
                    m.pids = read(dir.join("pids.current")).and_then(|t| t.trim().parse().ok());
                }
                Kind::V1Cpu | Kind::V1Freezer => {}
            }
        }
        m
    }

    /// Instance directories left by an earlier run of this node, one set per instance name.
    pub fn leftovers(&self) -> Vec<CgroupSet> {
        let mut names: Vec<std::ffi::OsString> = Vec::new();
        for h in &self.hierarchies {
            if let Ok(d) = fs::read_dir(&h.parent) {
                for e in d.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) && !names.contains(&e.file_name()) {
                        names.push(e.file_name());
                    }
                }
            }
        }
        names
            .into_iter()
            .map(|n| CgroupSet {
                dirs: self
                    .hierarchies
                    .iter()
                    .map(|h| (h.kind, h.parent.join(&n)))
                    .filter(|(_, d)| d.exists())
                    .collect(),
            })
            .collect()
    }

    /// Removes this node's (empty) directories.
    pub fn remove_parents(&self) {
        for h in &self.hierarchies {
            let _ = fs::remove_dir(&h.parent);
        }
    }
}

/// The value of `key` in a cgroup stat file (`key value` lines).
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse::<u64>().ok()).flatten()
    })
}

/// The memory in use of the cgroup `dir`: less the page cache the kernel can drop at once
/// (what `docker stats` reports too), and less all page cache (`unreclaimable_bytes`). Each
/// file is read once.
fn memory_in(kind: Kind, dir: &Path) -> (Option<u64>, Option<u64>) {
    let (usage, inactive, active) = match kind {
        Kind::V2 => ("memory.current", "inactive_file", "active_file"),
        _ => (
            "memory.usage_in_bytes",
            "total_inactive_file",
            "total_active_file",
        ),
    };
    let Some(total) = fs::read_to_string(dir.join(usage))
        .ok()
        .and_then(|t| t.trim().parse::<u64>().ok())
    else {
        return (None, None);
    };
    let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
    let inactive = stat_value(&stat, inactive).unwrap_or(0);
    let active = stat_value(&stat, active).unwrap_or(0);
    (
        Some(total.saturating_sub(inactive)),
        Some(total.saturating_sub(inactive + active)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_in_use_leaves_out_page_cache_as_each_version_names_it() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(d.path().join("memory.current"), "2000\n").unwrap();
        fs::write(
            d.path().join("memory.stat"),
            "cache 300\ntotal_inactive_file 100\ntotal_active_file 200\ninactive_file 400\nactive_file 500\n",
        )
        .unwrap();
        assert_eq!(memory_in(Kind::V1Memory, d.path()), (Some(900), Some(700)));
        assert_eq!(memory_in(Kind::V2, d.path()), (Some(1600), Some(1100)));
        fs::remove_file(d.path().join("memory.current")).unwrap();
        assert_eq!(memory_in(Kind::V2, d.path()), (None, None));
    }

    #[test]
    fn unreclaimable_memory_is_read_from_whichever_hierarchy_has_the_controller() {
        let (v2, v1) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        fs::write(v1.path().join("memory.usage_in_bytes"), "1000\n").unwrap();
        fs::write(v1.path().join("memory.stat"), "total_active_file 200\n").unwrap();
        // A hybrid host: the v2 directory comes first and has no memory files.
        let set = CgroupSet {
            dirs: vec![
                (Kind::V2, v2.path().to_path_buf()),
                (Kind::V1Memory, v1.path().to_path_buf()),
            ],
        };
        assert_eq!(Cgroups::unreclaimable(&set), Some(800));
    }
}
