//! `GET /metrics`, measured: CPU from `/proc` (or the cgroup's usage when visible) between two
//! samples, memory from the cgroup when visible or else the resident sets of the processes envd
//! can see, disk from statvfs of `/`. Totals come from the size tier when configured.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

#[derive(Debug, Serialize, PartialEq)]
pub struct Metrics {
    pub ts: i64,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_total: u64,
    pub mem_used: u64,
    pub mem_cache: u64,
    pub mem_total_mib: u64,
    pub mem_used_mib: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// The previous CPU reading, so each call reports the use since the one before.
#[derive(Debug, Default)]
pub struct CpuSampler {
    last: Option<(Instant, CpuReading)>,
}

#[derive(Debug, Clone, Copy)]
enum CpuReading {
    /// Busy and total jiffies from /proc/stat.
    Host { busy: u64, total: u64 },
    /// Microseconds of CPU the cgroup used.
    Cgroup { usage_us: u64 },
}

/// `busy` and `total` of the aggregate line of /proc/stat.
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait are not busy.
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

/// The cgroup v2 directory envd is in, when it is mounted where it can be read.
fn own_cgroup_v2() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = PathBuf::from("/sys/fs/cgroup").join(rel.trim_start_matches('/'));
    (rel != "/" && dir.join("memory.current").exists()).then_some(dir)
}

fn read_u64(p: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

fn key_of(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

fn cpu_reading(cg: Option<&PathBuf>) -> Option<CpuReading> {
    if let Some(dir) = cg {
        let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
        return key_of(&stat, "usage_usec ").map(|usage_us| CpuReading::Cgroup { usage_us });
    }
    let (busy, total) = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    Some(CpuReading::Host { busy, total })
}

/// `/proc/<pid>/<file>` of every process this one can see (none when /proc cannot be read).
fn each_process(file: &'static str) -> impl Iterator<Item = String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|d| {
            d.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(move |d| std::fs::read_to_string(d.path().join(file)).ok())
}

fn visible_rss() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    each_process("statm")
        .filter_map(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|r| r.parse::<u64>().ok())
        })
        .map(|pages| pages * page)
        .sum()
}

fn cpus() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

impl CpuSampler {
    /// Percent of the available CPU used since the previous call (the first call samples over a
    /// tenth of a second).
    pub fn sample(&mut self, cpu_count: u32) -> f64 {
        let cg = own_cgroup_v2();
        let Some(now) = cpu_reading(cg.as_ref()) else {
            return 0.0;
        };
        let at = Instant::now();
        let (prev_at, prev) = match self.last {
            Some(l) => l,
            None => {
                std::thread::sleep(std::time::Duration::from_millis(100));
                let next = cpu_reading(cg.as_ref()).unwrap_or(now);
                let next_at = Instant::now();
                self.last = Some((next_at, next));
                return pct(at, now, next_at, next, cpu_count);
            }
        };
        self.last = Some((at, now));
        pct(prev_at, prev, at, now, cpu_count)
    }
}

fn pct(a_at: Instant, a: CpuReading, b_at: Instant, b: CpuReading, cpu_count: u32) -> f64 {
    let raw = match (a, b) {
        (
            CpuReading::Host {
                busy: b0,
                total: t0,
            },
            CpuReading::Host {
                busy: b1,
                total: t1,
            },
        ) => {
            let dt = t1.saturating_sub(t0);
            if dt == 0 {
                0.0
            } else {
                100.0 * b1.saturating_sub(b0) as f64 / dt as f64
            }
        }
        (CpuReading::Cgroup { usage_us: u0 }, CpuReading::Cgroup { usage_us: u1 }) => {
            let wall = b_at.duration_since(a_at).as_micros() as f64 * cpu_count.max(1) as f64;
            if wall <= 0.0 {
                0.0
            } else {
                100.0 * u1.saturating_sub(u0) as f64 / wall
            }
        }
        _ => 0.0,
    };
    (raw.clamp(0.0, 100.0) * 100.0).round() / 100.0
}

/// One reading. `mem_total` and `cpu_count` are the configured size when given.
/// The anonymous memory (heaps, stacks; not files mapped in, which processes share and the
/// kernel can reclaim) of every process this one can see: what the sandbox's programs hold.
pub fn visible_anonymous() -> u64 {
    each_process("status")
        .filter_map(|s| key_of(&s, "RssAnon:"))
        .map(|kib| kib * 1024)
        .sum()
}

pub fn measure(
    sampler: &mut CpuSampler,
    mem_total: Option<u64>,
    cpu_count: Option<u32>,
) -> Metrics {
    let cpu_count = cpu_count.unwrap_or_else(cpus);
    let cpu_used_pct = sampler.sample(cpu_count);
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let cg = own_cgroup_v2();
    let (used, cache) = match &cg {
        Some(dir) => {
            let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
            (
                read_u64(&dir.join("memory.current")).unwrap_or(0),
                key_of(&stat, "file ").unwrap_or(0),
            )
        }
        None => (
            visible_rss(),
            key_of(&meminfo, "Cached:").unwrap_or(0) * 1024,
        ),
    };
    let cg_max = cg.as_ref().and_then(|d| read_u64(&d.join("memory.max")));
    let total = mem_total
        .or(cg_max)
        .unwrap_or_else(|| key_of(&meminfo, "MemTotal:").unwrap_or(0) * 1024);
    // SAFETY: statvfs fills the zeroed struct for a NUL-terminated path.
    let (disk_used, disk_total) = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c"/".as_ptr(), &mut st) == 0 {
            let frsize = st.f_frsize as u64;
            (
                (st.f_blocks as u64).saturating_sub(st.f_bfree as u64) * frsize,
                st.f_blocks as u64 * frsize,
            )
        } else {
            (0, 0)
        }
    };
    Metrics {
        ts: chrono::Utc::now().timestamp(),
        cpu_count,
        cpu_used_pct,
        mem_total: total,
        mem_used: used.min(total.max(used)),
        mem_cache: cache,
        mem_total_mib: total / (1024 * 1024),
        mem_used_mib: used / (1024 * 1024),
        disk_used,
        disk_total,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_proc_stat(text), Some((150, 1000)));
        assert_eq!(parse_proc_stat("intr 1 2"), None);
    }

    #[test]
    fn measures_something_plausible() {
        let mut s = CpuSampler::default();
        let m = measure(&mut s, Some(512 << 20), Some(1));
        assert_eq!(m.mem_total, 512 << 20);
        assert_eq!(m.mem_total_mib, 512);
        assert_eq!(m.cpu_count, 1);
        assert!((0.0..=100.0).contains(&m.cpu_used_pct));
        assert!(m.disk_total >= m.disk_used && m.disk_total > 0);
        assert!(m.mem_used > 0);
    }
}
