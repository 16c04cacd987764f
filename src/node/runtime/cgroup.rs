//! Cgroups give each instance a handle on its whole process tree: freezing it (pause) and
//! killing every member, even processes that left the instance's process group.
//! cgroup v2 is preferred (cgroup.freeze, cgroup.kill); the v1 freezer is the fallback.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    V2,
    V1Freezer,
}

#[derive(Debug, Clone)]
pub struct Cgroups {
    pub flavor: Flavor,
    /// This node's directory; one child per instance.
    pub parent: PathBuf,
}

const SETTLE: Duration = Duration::from_secs(5);

fn mounts() -> Vec<(String, String, String)> {
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
            Some((dir, ty, opts))
        })
        .collect()
}

/// This process's cgroup path in the hierarchy that matches `pick`.
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

impl Cgroups {
    /// Finds a usable hierarchy and creates this node's directory in it. `tag` keeps nodes that
    /// share a machine apart.
    pub fn detect(tag: &str) -> Option<Cgroups> {
        let leaf = format!("sandbox-gateway.{tag}");
        let mounts = mounts();
        if let Some((dir, _, _)) = mounts.iter().find(|(_, ty, _)| ty == "cgroup2") {
            let own = own_path(|id, c| id == "0" && c.is_empty()).unwrap_or_default();
            let parent = under(dir, &own, &leaf);
            if fs::create_dir_all(&parent).is_ok() && parent.join("cgroup.freeze").exists() {
                return Some(Cgroups {
                    flavor: Flavor::V2,
                    parent,
                });
            }
            let _ = fs::remove_dir(&parent);
        }
        if let Some((dir, _, _)) = mounts
            .iter()
            .find(|(_, ty, opts)| ty == "cgroup" && opts.split(',').any(|o| o == "freezer"))
        {
            let own = own_path(|_, c| c.split(',').any(|x| x == "freezer")).unwrap_or_default();
            let parent = under(dir, &own, &leaf);
            if fs::create_dir_all(&parent).is_ok() && parent.join("freezer.state").exists() {
                return Some(Cgroups {
                    flavor: Flavor::V1Freezer,
                    parent,
                });
            }
            let _ = fs::remove_dir(&parent);
        }
        None
    }

    pub fn create(&self, name: &str) -> io::Result<PathBuf> {
        let p = self.parent.join(name);
        fs::create_dir(&p)?;
        Ok(p)
    }

    pub fn procs_file(cg: &Path) -> PathBuf {
        cg.join("cgroup.procs")
    }

    pub fn pids(cg: &Path) -> Vec<i32> {
        fs::read_to_string(Self::procs_file(cg))
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
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

    pub fn freeze(&self, cg: &Path) -> io::Result<()> {
        match self.flavor {
            Flavor::V2 => {
                fs::write(cg.join("cgroup.freeze"), "1")?;
                let events = cg.join("cgroup.events");
                let ok = Self::wait_for(|| {
                    fs::read_to_string(&events).is_ok_and(|t| t.lines().any(|l| l == "frozen 1"))
                });
                if !ok {
                    return Err(io::Error::other("cgroup did not report frozen in time"));
                }
            }
            Flavor::V1Freezer => {
                let state = cg.join("freezer.state");
                fs::write(&state, "FROZEN")?;
                let ok = Self::wait_for(|| {
                    fs::read_to_string(&state).is_ok_and(|t| t.trim() == "FROZEN")
                });
                if !ok {
                    return Err(io::Error::other("freezer did not reach FROZEN in time"));
                }
            }
        }
        Ok(())
    }

    pub fn thaw(&self, cg: &Path) -> io::Result<()> {
        match self.flavor {
            Flavor::V2 => fs::write(cg.join("cgroup.freeze"), "0"),
            Flavor::V1Freezer => fs::write(cg.join("freezer.state"), "THAWED"),
        }
    }

    /// Kills every member, waits until the cgroup is empty, and removes it.
    pub fn destroy(&self, cg: &Path) -> io::Result<()> {
        if !cg.exists() {
            return Ok(());
        }
        let kill_file = cg.join("cgroup.kill");
        let emptied = Self::wait_for(|| {
            if self.flavor == Flavor::V2 && kill_file.exists() {
                let _ = fs::write(&kill_file, "1");
            } else {
                for pid in Self::pids(cg) {
                    super::sys::kill_pid(pid, libc::SIGKILL);
                }
            }
            // A frozen v1 task only acts on SIGKILL once thawed.
            let _ = self.thaw(cg);
            Self::pids(cg).is_empty()
        });
        if !emptied {
            return Err(io::Error::other(format!(
                "processes in {} did not exit",
                cg.display()
            )));
        }
        // The kernel may need a moment after the last exit before rmdir succeeds.
        let mut last = Ok(());
        Self::wait_for(|| {
            last = fs::remove_dir(cg);
            last.is_ok() || !cg.exists()
        });
        match last {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Instance cgroups left in this node's directory (by an earlier run).
    pub fn children(&self) -> Vec<PathBuf> {
        fs::read_dir(&self.parent)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default()
    }
}
