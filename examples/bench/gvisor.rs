//! The gVisor runtime side by side with the built-in one, in the same run: pause, resume,
//! snapshot and fork of a sandbox holding touched memory (gVisor captures it; the built-in
//! runtime freezes in place and copies files), and warm claims and memory per idle sandbox of a
//! warm pool. The reference's published microVM figures stand beside them as a fixed column.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sandbox_gateway::dispatch::{ClaimRequest, Dispatcher, DispatcherConfig};
use sandbox_gateway::model::{PoolKey, SandboxRecord, ids};

use crate::common::*;
use crate::envd::{Envd, Via, check};
use crate::gvisor_pool::{PoolCost, bench_pool, render_pool};

pub const RUNTIMES: [&str; 2] = ["builtin", "gvisor"];

/// gVisor with its memory in 4 KiB pages: the host's shared-memory huge pages set to `never`
/// for that node, which is told to keep it (see `node::runtime::gvisor::hostmem`).
const SMALL_PAGES: &str = "gvisor (4 KiB pages)";
/// The verbs section's runtimes: each runtime, and gVisor again without huge pages.
const VERB_RUNTIMES: [&str; 3] = ["builtin", "gvisor", SMALL_PAGES];

/// The host's shared-memory huge pages held at `never` while it lives; what was there before
/// comes back on drop.
struct SmallPages(String);

impl SmallPages {
    fn set() -> Res<Self> {
        use sandbox_gateway::node::runtime::gvisor::hostmem::{SHMEM_ENABLED, selected};
        let listing = std::fs::read_to_string(SHMEM_ENABLED)?;
        let before = selected(&listing)
            .ok_or("shmem_enabled is not a choice list")?
            .to_string();
        std::fs::write(SHMEM_ENABLED, "never")?;
        Ok(SmallPages(before))
    }
}

impl Drop for SmallPages {
    fn drop(&mut self) {
        use sandbox_gateway::node::runtime::gvisor::hostmem::SHMEM_ENABLED;
        let _ = std::fs::write(SHMEM_ENABLED, &self.0);
    }
}

/// The host's shared-memory huge pages as the nodes left them (for the method line).
fn shmem_described() -> String {
    use sandbox_gateway::node::runtime::gvisor::hostmem::SHMEM_ENABLED;
    std::fs::read_to_string(SHMEM_ENABLED)
        .map(|l| l.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// The runsc the nodes run (found on PATH, as they find it) and the platform `auto` picks.
fn runsc_described() -> String {
    use sandbox_gateway::node::runtime::gvisor::runsc::{
        build_date, pick_platform, version_on_path,
    };
    let version = version_on_path().unwrap_or_else(|| "runsc".into());
    format!(
        "{version}, platform {}",
        pick_platform("auto", build_date(&version))
    )
}
/// The reference's published figures (cocoonstack, `docs/lifecycle.md` and the snapshot-clone
/// tier), quoted, not measured here.
const REF_PAUSE: &str = "315 ms";
const REF_RESUME: &str = "109 ms";
const REF_FORK: &str = "28–75 ms";
/// Big enough for 512 MiB touched plus Python and, on gVisor, the Sentry and the in-memory
/// root overlay.
const SIZE: &str = "medium";

/// One runtime at one amount of touched memory: the medians of the runs.
pub struct VerbRow {
    pub runtime: &'static str,
    pub mib: u64,
    /// The sandbox's memory in use (its cgroup, as the node measures it) once touched, and
    /// while paused.
    pub mem_used: u64,
    pub mem_paused: u64,
    /// What the pause left on the node's disk (the instance's `paused` image).
    pub image: u64,
    /// What the snapshot's checkpoint holds.
    pub captured: u64,
    pub pause: Duration,
    /// Resume of a sandbox paused for `PAUSED_FOR`.
    pub resume: Duration,
    /// Resume called until the resumed sandbox answered a command.
    pub resume_answered: Duration,
    /// Resume called as soon as the pause answered.
    pub resume_at_once: Duration,
    pub snapshot: Duration,
    /// Fork called until the child answered a command.
    pub fork: Duration,
    /// The process that holds the memory goes on after resume, and in the fork child.
    pub kept: bool,
    pub child_kept: bool,
}

pub struct MemoryVerbs {
    pub runs: usize,
    pub rows: Vec<VerbRow>,
    /// Per runtime: a process started and ended inside its sandbox (`/bin/true` from a shell
    /// loop, the mean of 20), what a command and a restore's first command pay on top of
    /// the agent.
    pub spawns: Vec<(&'static str, Duration)>,
    /// The bench process writing one byte per 4 KiB page of `FRESH_MIB` just mapped in huge
    /// pages: the first time after 5 s of mapping nothing new, and again at once after
    /// unmapping it. A restored gVisor sandbox's memory is new memory of that kind.
    pub fresh_touch: Duration,
    pub reused_touch: Duration,
}

/// How long a sandbox stays paused before its timed resume: what a resume after a pause
/// costs, rather than one that catches the node still finishing the pause (timed apart).
const PAUSED_FOR: Duration = Duration::from_secs(1);

/// What `touch_costs` allocates.
const FRESH_MIB: usize = 256;

/// See `MemoryVerbs::fresh_touch`. On a virtual machine whose balloon hands free memory back
/// to the host (Linux's free page reporting, which hands back large free blocks only), the
/// first touch of huge pages waits for the host to back them again; memory freed a moment
/// ago has not been handed back yet.
fn touch_costs() -> Res<(Duration, Duration)> {
    std::thread::sleep(Duration::from_secs(5));
    let fresh = touch_huge(FRESH_MIB << 20)?;
    Ok((fresh, touch_huge(FRESH_MIB << 20)?))
}

/// Maps `bytes` of anonymous memory asking for huge pages (as the Sentry does for the
/// sandbox's memory), writes one byte per 4 KiB page, and unmaps it; answers the writing time.
fn touch_huge(bytes: usize) -> Res<Duration> {
    // SAFETY: a new private anonymous mapping of `bytes`, written only within its bounds and
    // unmapped before returning; nothing else refers to it.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error().into());
        }
        libc::madvise(p, bytes, libc::MADV_HUGEPAGE);
        let base = p.cast::<u8>();
        let started = Instant::now();
        for i in (0..bytes).step_by(4096) {
            base.add(i).write_volatile(1);
        }
        let took = started.elapsed();
        libc::munmap(p, bytes);
        Ok(took)
    }
}

/// Microseconds per `/bin/true` started and waited for by a shell loop inside the sandbox.
async fn spawn_cost(r: &SandboxRecord) -> Res<Duration> {
    let out = check(
        &mut envd_of(r),
        "s=$(date +%s%N); for i in $(seq 20); do /bin/true; done; e=$(date +%s%N); echo $(( (e - s) / 20000 ))",
    )
    .await?;
    let us: u64 = out
        .trim()
        .parse()
        .map_err(|_| format!("the spawn loop printed {out:?}"))?;
    Ok(Duration::from_micros(us))
}

impl MemoryVerbs {
    fn row(&self, runtime: &str, mib: u64) -> Option<&VerbRow> {
        self.rows
            .iter()
            .find(|r| r.runtime == runtime && r.mib == mib)
    }
}

/// Allocates N MiB (argv[1]), fills it with a random 1 MiB block repeated (deflate cannot
/// shrink it), writes its pid to /tmp/touched and sleeps.
const TOUCH: &str = r#"import os, sys, time
n = int(sys.argv[1])
b = bytearray(n << 20)
block = os.urandom(1 << 20)
for i in range(n):
    b[i << 20:(i + 1) << 20] = block
with open("/tmp/touched.tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace("/tmp/touched.tmp", "/tmp/touched")
time.sleep(1 << 20)
"#;

fn envd_of(r: &SandboxRecord) -> Envd {
    Envd::new(Via::Node {
        data: r.address.clone(),
        id: r.id.clone(),
        token: r.token.clone(),
    })
}

/// Whether process `pid` runs in the sandbox, on a fresh connection.
async fn alive(r: &SandboxRecord, pid: &str) -> Res<bool> {
    let out = check(
        &mut envd_of(r),
        &format!("kill -0 {pid} 2>/dev/null && echo alive || echo gone"),
    )
    .await?;
    Ok(out.trim() == "alive")
}

/// Starts the toucher for `mib` MiB and waits until it has touched it all; returns its pid.
async fn touch(r: &SandboxRecord, mib: u64) -> Res<String> {
    let cmd = format!(
        "cat > /tmp/touch.py <<'EOF'\n{TOUCH}EOF\n\
         setsid nohup python3 /tmp/touch.py {mib} >/tmp/touch.log 2>&1 &\n\
         for i in $(seq 1200); do [ -s /tmp/touched ] && break; sleep 0.1; done\n\
         [ -s /tmp/touched ] || {{ cat /tmp/touch.log >&2; exit 1; }}\n\
         cat /tmp/touched"
    );
    Ok(check(&mut envd_of(r), &cmd).await?.trim().to_string())
}

/// Allocated bytes of a directory tree (0 when it is absent).
fn tree_bytes(p: &Path) -> u64 {
    let Ok(m) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if !m.is_dir() {
        return m.blocks() * 512;
    }
    std::fs::read_dir(p)
        .map(|d| d.flatten().map(|e| tree_bytes(&e.path())).sum())
        .unwrap_or(0)
}

/// `runs` rounds of pause, resume, snapshot (a checkpoint, deleted) and fork (one child,
/// released once it answered) on a sandbox of each runtime that touched each of `sizes` MiB.
pub async fn bench_memory_verbs(sizes: &[u64], runs: usize) -> Res<MemoryVerbs> {
    let (fresh_touch, reused_touch) = tokio::task::spawn_blocking(touch_costs).await??;
    let mut rows = Vec::new();
    let mut spawns = Vec::new();
    for runtime in VERB_RUNTIMES {
        let token = ids::random_hex(16);
        let small_pages = runtime == SMALL_PAGES;
        // gVisor's memory in 4 KiB pages: the host's setting before a node tunes it, kept by
        // the node, and put back after.
        let host = small_pages.then(SmallPages::set).transpose()?;
        let mut extra: Vec<String> = vec!["--runtime".into()];
        extra.push(
            if runtime == "builtin" {
                "builtin"
            } else {
                "gvisor"
            }
            .into(),
        );
        if small_pages {
            extra.push("--protect-kernel-defaults".into());
        }
        let node = Daemon::node_with(&NodeSpec {
            token: &token,
            name: &format!("mem-{}", if small_pages { "gvisor-4k" } else { runtime }),
            pools: &[format!("base/none/{SIZE}=0")],
            extra: &extra,
        })?;
        let cfg = DispatcherConfig {
            call_timeout: Duration::from_secs(300),
            ..Default::default()
        };
        let d = Dispatcher::new(cfg, &token);
        d.add_node(&node.address)?;
        d.wait_for_nodes(1, Duration::from_secs(30)).await?;
        let memory = runtime != "builtin";
        for &mib in sizes {
            eprintln!("  {runtime}, {mib} MiB touched...");
            let sb = d
                .claim(ClaimRequest {
                    namespace: "bench".into(),
                    name: format!("mem-{mib}"),
                    key: PoolKey::new("base", "none", SIZE)?,
                    ttl_seconds: 3600,
                    metadata: Default::default(),
                    env_vars: Default::default(),
                    lifecycle: Default::default(),
                    network: Default::default(),
                    volume_mounts: Vec::new(),
                })
                .await?
                .record;
            let pid = touch(&sb, mib).await?;
            if mib == sizes[0] {
                spawns.push((runtime, spawn_cost(&sb).await?));
            }
            let mem_used = d.stats(None, &sb.id).await?.mem_used_bytes;
            let image_dir = PathBuf::from(&sb.state_dir).join("paused");
            let mut t: [Vec<Duration>; 6] = Default::default();
            let (mut mem_paused, mut image, mut captured) = (0, 0, 0);
            let (mut kept, mut child_kept) = (true, true);
            for _ in 0..runs {
                let s = Instant::now();
                d.set_paused(None, &sb.id, true).await?;
                t[0].push(s.elapsed());
                image = tree_bytes(&image_dir);
                mem_paused = d.stats(None, &sb.id).await?.mem_used_bytes;
                tokio::time::sleep(PAUSED_FOR).await;
                let s = Instant::now();
                d.set_paused(None, &sb.id, false).await?;
                t[1].push(s.elapsed());
                kept &= alive(&sb, &pid).await?;
                t[2].push(s.elapsed());
                let s = Instant::now();
                let ck = d.create_checkpoint(None, &sb.id, "", memory).await?;
                t[3].push(s.elapsed());
                captured = ck.size_bytes;
                d.delete_checkpoint(&ck.id, "").await?;
                let s = Instant::now();
                let kids = d.fork(None, &sb.id, 1, 600).await?;
                let mut answered = Ok(());
                for k in &kids {
                    match alive(k, &pid).await {
                        Ok(a) => child_kept &= a,
                        Err(e) => answered = Err(e),
                    }
                }
                t[4].push(s.elapsed());
                for k in &kids {
                    d.release(None, &k.id).await?;
                }
                answered?;
            }
            // Last, since a checkpoint soon after a restore is slower here and would skew
            // the rounds' pauses and snapshots.
            for _ in 0..runs {
                d.set_paused(None, &sb.id, true).await?;
                let s = Instant::now();
                d.set_paused(None, &sb.id, false).await?;
                t[5].push(s.elapsed());
                kept &= alive(&sb, &pid).await?;
            }
            d.release(None, &sb.id).await?;
            let [
                pause,
                resume,
                resume_answered,
                snapshot,
                fork,
                resume_at_once,
            ] = t.map(median);
            rows.push(VerbRow {
                runtime,
                mib,
                mem_used,
                mem_paused,
                image,
                captured,
                pause,
                resume,
                resume_answered,
                resume_at_once,
                snapshot,
                fork,
                kept,
                child_kept,
            });
        }
        d.shutdown().await;
        node.stop();
        drop(host);
    }
    Ok(MemoryVerbs {
        runs,
        rows,
        spawns,
        fresh_touch,
        reused_touch,
    })
}

/// What the gVisor sections measured (those that ran).
#[derive(Default)]
pub struct GvisorRun {
    pub verbs: Option<MemoryVerbs>,
    pub pool: Option<Vec<PoolCost>>,
}

/// Runs one gVisor section: `gvisor-verbs` (3 rounds at 64, 256 and 512 MiB touched) or
/// `gvisor-pool` (a pool of 8, samples/20 warm claims, 16 to 64).
pub async fn measure(section: &str, samples: usize, run: &mut GvisorRun) -> Res<()> {
    match section {
        "gvisor-verbs" => run.verbs = Some(bench_memory_verbs(&[64, 256, 512], 3).await?),
        _ => run.pool = Some(bench_pool(8, (samples / 20).clamp(16, 64)).await?),
    }
    Ok(())
}

fn mib_cell(bytes: u64) -> String {
    format!("{:.0} MiB", mib(bytes))
}

/// Milliseconds to about three significant digits.
fn ms0(d: Duration) -> String {
    match d.as_secs_f64() * 1000.0 {
        m if m < 10.0 => format!("{m:.2} ms"),
        m if m < 100.0 => format!("{m:.1} ms"),
        m => format!("{m:.0} ms"),
    }
}

fn ms_f(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whether gVisor's pause grows with touched memory only: its image grows by about the
/// added touched memory (not by the memory limit), and its time grows with it. The verdict
/// and the fit (fixed part and cost per 100 MiB).
fn pause_verdict(v: &MemoryVerbs) -> Option<(bool, String)> {
    let rows: Vec<&VerbRow> = v.rows.iter().filter(|r| r.runtime == "gvisor").collect();
    let (lo, hi) = (rows.first()?, rows.last()?);
    if hi.mib <= lo.mib {
        return None;
    }
    let added = (hi.mib - lo.mib) as f64;
    let grew = mib(hi.image.saturating_sub(lo.image));
    let per_100 = (ms_f(hi.pause) - ms_f(lo.pause)) / added * 100.0;
    let fixed = ms_f(lo.pause) - per_100 * lo.mib as f64 / 100.0;
    let monotonic = rows.windows(2).all(|w| w[1].pause >= w[0].pause);
    let tracks = grew >= 0.8 * added && grew <= 1.25 * added;
    let small = mib(lo.image) < 4.0 * lo.mib as f64 + 64.0;
    let ok = tracks && small && monotonic;
    Some((
        ok,
        format!(
            "image {:.0} → {:.0} MiB for {} → {} MiB touched (+{grew:.0} MiB for +{added:.0}); \
             pause ≈ {fixed:.0} ms + {per_100:.0} ms per 100 MiB{}",
            mib(lo.image),
            mib(hi.image),
            lo.mib,
            hi.mib,
            if monotonic {
                ""
            } else {
                "; not monotonic in the size"
            }
        ),
    ))
}

/// The "At a glance" rows (same columns as main's table).
pub fn summary_rows(o: &mut String, g: &GvisorRun) {
    let meets = |ok: bool| {
        if ok {
            "meets the target"
        } else {
            "misses the target"
        }
    };
    if let Some(v) = &g.verbs {
        if let Some(r) = v.row("gvisor", 256) {
            let _ = writeln!(
                o,
                "| gVisor resume with 256 MiB touched, paused for {} s (median; until it answers a command; resumed the moment its pause answered) | {} ({}; {}) | reference {REF_RESUME} (published); target ≤ 150 ms | {} |",
                PAUSED_FOR.as_secs(),
                ms0(r.resume),
                ms0(r.resume_answered),
                ms0(r.resume_at_once),
                meets(ms_f(r.resume) <= 150.0)
            );
            let _ = writeln!(
                o,
                "| gVisor pause with 256 MiB touched (median) | {} | reference {REF_PAUSE} (published) | {} |",
                ms0(r.pause),
                if ms_f(r.pause) <= 315.0 {
                    "ahead"
                } else {
                    "behind"
                }
            );
            let _ = writeln!(
                o,
                "| gVisor fork with 256 MiB touched (median; until the child answers a command) | {} | target ≤ 500 ms; reference {REF_FORK} (published, a snapshot clone) | {} |",
                ms0(r.fork),
                meets(ms_f(r.fork) <= 500.0)
            );
        }
        if let Some((ok, fit)) = pause_verdict(v) {
            let _ = writeln!(
                o,
                "| gVisor pause proportional to touched memory only | {fit} | target: proportional to touched memory only | {} |",
                meets(ok)
            );
        }
    }
    if let Some(p) = &g.pool {
        let cell = |f: &dyn Fn(&PoolCost) -> String| {
            p.iter()
                .map(|c| format!("{} {}", c.runtime, f(c)))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let by = |rt: &str| p.iter().find(|c| c.runtime == rt);
        let (claims, memory) = match (by("gvisor"), by("builtin")) {
            (Some(g), Some(b)) => (
                format!(
                    "gVisor's p50 {:.2}× and p99 {:.1}× builtin's: the hand-over does not touch \
                     the runtime, but the refill's boots share the machine",
                    g.claim.p50.as_secs_f64() / b.claim.p50.as_secs_f64().max(1e-9),
                    g.claim.p99.as_secs_f64() / b.claim.p99.as_secs_f64().max(1e-9)
                ),
                format!(
                    "gVisor {:.1}× builtin; both far below a microVM's reservation",
                    g.cgroup as f64 / (b.cgroup as f64).max(1.0)
                ),
            ),
            _ => ("—".to_string(), "—".to_string()),
        };
        let _ = writeln!(
            o,
            "| warm claim p50 / p99 from a pool of {}, builtin and gVisor | {} | sandboxd 0.2–0.7 ms | {claims} |",
            p.first().map_or(0, |c| c.pool),
            cell(&|c| format!("{} / {}", ms(c.claim.p50), ms(c.claim.p99)))
        );
        let _ = writeln!(
            o,
            "| memory per idle sandbox (its cgroup, less inactive page cache), builtin and gVisor | {} | a microVM's guest memory (512 MiB for 1 CPU) | {memory} |",
            cell(&|c| format!("{:.1} MiB", mib(c.cgroup)))
        );
    }
}

pub fn render(o: &mut String, g: &GvisorRun) {
    if let Some(v) = &g.verbs {
        render_verbs(o, v);
    }
    if let Some(p) = &g.pool {
        render_pool(o, p);
    }
}

fn render_verbs(o: &mut String, v: &MemoryVerbs) {
    let _ = writeln!(
        o,
        "## gVisor: pause, resume, snapshot and fork against touched memory\n"
    );
    let _ = writeln!(
        o,
        "Method: for each runtime in turn, one `sandbox-gateway node --runtime RUNTIME` \
         (gVisor: {}); per row one claimed `base/none/{SIZE}` sandbox \
         (1 GiB limit; net `none`, which every runsc build checkpoints) in which, through envd over the node's data plane, a python3 process \
         allocates a bytearray of N MiB, fills it with a random 1 MiB block repeated (no \
         compression shrinks it) and sleeps. Then, through the dispatcher over loopback gRPC, \
         {} rounds of: pause; {} s later, resume (timed until the call returns, and until the sandbox \
         answers a command on a new connection); snapshot (a checkpoint, with memory on \
         gVisor; then deleted); fork (one child, timed until the child answers a command; then \
         released); then as many rounds of pause and resume as soon as the pause answered \
         (\"at once\": a gVisor node readies a paused sandbox's restore after answering the \
         pause, see `node::runtime::gvisor::standby`, and a resume that comes sooner waits for \
         that; these come last because a checkpoint soon after a restore is slower here). \
         Medians. \"in use\" is the sandbox's cgroup memory after touching and \
         while paused; \"pause image\" is what the pause left on the node's disk; \"snapshot\" \
         is the checkpoint's size; \"same process\" says whether the touching process still \
         runs after resume / in the fork child. The reference column is the reference's \
         published figures for a microVM (512 MiB guest), not measured here. gVisor runs \
         twice: as a node leaves the host (shared-memory huge pages {}; a gVisor node moves \
         `never` to `advise`, see `node::runtime::gvisor::hostmem`), and with the host held at \
         `never` for that node (`--protect-kernel-defaults`), so its memory is in 4 KiB pages.\n",
        runsc_described(),
        v.runs,
        PAUSED_FOR.as_secs(),
        shmem_described()
    );
    let _ = writeln!(
        o,
        "| runtime | touched | in use / paused | pause image | snapshot | pause | resume (answering) | resume at once | snapshot | fork (child answering) | same process after resume / in child |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|");
    let yes = |b: bool| if b { "yes" } else { "no" };
    for r in &v.rows {
        let _ = writeln!(
            o,
            "| {} | {} MiB | {} / {} | {} | {} | {} | {} ({}) | {} | {} | {} | {} / {} |",
            r.runtime,
            r.mib,
            mib_cell(r.mem_used),
            mib_cell(r.mem_paused),
            mib_cell(r.image),
            mib_cell(r.captured),
            ms0(r.pause),
            ms0(r.resume),
            ms0(r.resume_answered),
            ms0(r.resume_at_once),
            ms0(r.snapshot),
            ms0(r.fork),
            yes(r.kept),
            yes(r.child_kept)
        );
    }
    let _ = writeln!(
        o,
        "| reference (published, microVM, not measured) | 512 MiB guest | — | — | — | {REF_PAUSE} | {REF_RESUME} | — | — | {REF_FORK} (snapshot clone) | — |"
    );
    let sizes: Vec<u64> = {
        let mut s: Vec<u64> = v.rows.iter().map(|r| r.mib).collect();
        s.sort();
        s.dedup();
        s
    };
    let _ = writeln!(o, "\ngVisor / builtin (median times):\n");
    let _ = writeln!(o, "| touched | pause | resume | snapshot | fork |");
    let _ = writeln!(o, "|---|---|---|---|---|");
    for mib in sizes {
        if let (Some(g), Some(b)) = (v.row("gvisor", mib), v.row("builtin", mib)) {
            let x = |a: Duration, b: Duration| {
                format!("{:.1}×", a.as_secs_f64() / b.as_secs_f64().max(1e-9))
            };
            let _ = writeln!(
                o,
                "| {mib} MiB | {} | {} | {} | {} |",
                x(g.pause, b.pause),
                x(g.resume, b.resume),
                x(g.snapshot, b.snapshot),
                x(g.fork, b.fork)
            );
        }
    }
    let _ = writeln!(
        o,
        "\ngVisor with huge pages / with 4 KiB pages (median times; below 1 is faster):\n"
    );
    let _ = writeln!(
        o,
        "| touched | pause | resume (answering) | snapshot | fork |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|");
    for r in v.rows.iter().filter(|r| r.runtime == "gvisor") {
        if let Some(s) = v.row(SMALL_PAGES, r.mib) {
            let x = |a: Duration, b: Duration| {
                format!("{:.2}", a.as_secs_f64() / b.as_secs_f64().max(1e-9))
            };
            let _ = writeln!(
                o,
                "| {} MiB | {} | {} ({}) | {} | {} |",
                r.mib,
                x(r.pause, s.pause),
                x(r.resume, s.resume),
                x(r.resume_answered, s.resume_answered),
                x(r.snapshot, s.snapshot),
                x(r.fork, s.fork)
            );
        }
    }
    let _ = writeln!(
        o,
        "\nWhat a command and a restore pay on this machine: a process started and waited for inside the sandbox (`/bin/true` from a shell loop, mean of 20) takes {}; writing one byte per 4 KiB of {FRESH_MIB} MiB the bench process just mapped in huge pages (as the Sentry maps a sandbox's memory) takes {} after 5 s of mapping nothing and {} at once after unmapping it (on a virtual machine that hands free memory back to its host, as this one does with free page reporting for blocks of 8 MiB and more, a first touch waits for the host to back the memory again, so the first figure depends on how much recently freed memory the kernel still holds). A fork's child restores into new memory the size of its parent's; a resume reuses what the pause freed.",
        v.spawns
            .iter()
            .map(|(rt, d)| format!("{} on {rt}", ms0(*d)))
            .collect::<Vec<_>>()
            .join(", "),
        ms0(v.fresh_touch),
        ms0(v.reused_touch)
    );
    let _ = writeln!(o);
    if let Some(r) = v.row("gvisor", 256) {
        let _ = writeln!(
            o,
            "Target, resume ≤ 150 ms at 256 MiB: gVisor resumed in {} (answering after {}): {}.",
            ms0(r.resume),
            ms0(r.resume_answered),
            if ms_f(r.resume) <= 150.0 {
                "meets it"
            } else {
                "misses it"
            }
        );
    }
    if let Some((ok, fit)) = pause_verdict(v) {
        let _ = writeln!(
            o,
            "Target, pause proportional to touched memory only: {fit}: {}.",
            if ok { "meets it" } else { "misses it" }
        );
    }
    let _ = writeln!(
        o,
        "\nNot the same operations: the built-in runtime's pause freezes the cgroup in place \
         (memory stays resident, nothing is written) and its snapshot and fork copy the disk \
         image, so a fork child starts fresh processes; gVisor's pause checkpoints memory, \
         processes and files to the node's disk and frees the memory, its resume restores \
         them, and a snapshot or fork checkpoints the running source (which runs on in place \
         where runsc allows it, and is restored from the image where not) and, for a fork, \
         restores a child from the same image.\n"
    );
}
