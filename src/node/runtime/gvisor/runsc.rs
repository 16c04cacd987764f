//! The runsc command line, as the gVisor runtime uses it: one state root per node, every
//! sandbox without a network (its door is a host Unix socket), its writes in an in-memory
//! overlay (a build step's go through to the root it is given), and cgroups left to the node
//! (runsc starts inside the sandbox's cgroups).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use super::super::cgroup::{CgroupSet, Cgroups};
use super::views::ChildMounts;
use crate::model::{Error, Result};

#[derive(Debug, Clone)]
pub struct Runsc {
    pub path: PathBuf,
    /// Where runsc keeps its containers' state.
    pub root: PathBuf,
    pub platform: String,
    /// As `runsc --version` prints it.
    pub version: String,
    /// The build's date (YYYYMMDD), when the version says it.
    pub date: Option<u32>,
    /// A directory for runsc's debug logs, when set.
    pub debug_log: Option<PathBuf>,
    /// Whether this build can checkpoint a sandbox with network connections, dropping them
    /// (`--net-disconnect-ok`; clients reconnect, as e2b documents for its snapshots).
    pub saves_connections: bool,
    /// Whether this build checkpoints TCP sockets an epoll instance watches (Node.js and
    /// asyncio servers); older ones fail, and the failed checkpoint ends the sandbox.
    pub saves_watched_sockets: bool,
    /// Whether `checkpoint --leave-running` lets the sandbox run on in place (newer builds;
    /// older ones restart it from the image, which the node does itself, see `capture`).
    pub resumes_after_checkpoint: bool,
    /// Whether `restore` loads an image into a container `create` made (newer builds; older
    /// ones refuse it: "container already exists"), which standbys and a fork's children
    /// started ahead rely on.
    pub restores_into_created: bool,
    /// Whether `checkpoint` takes `--compression` (newer builds, which compress by default):
    /// images are written uncompressed, since compressing is most of a pause's cost per MiB
    /// here (see PERFORMANCE.md) and the checkpoint budget bounds their size.
    pub chooses_compression: bool,
}

/// The build date in `runsc version 0.0~20221219.0` or `runsc version release-20240801.0`.
pub fn build_date(version: &str) -> Option<u32> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .find(|part| part.len() == 8)
        .and_then(|d| d.parse().ok())
}

/// The first builds whose systrap platform runs on hosts without KVM, as these are (ptrace
/// is slow: every system call inside stops the Sentry's stub).
const SYSTRAP_SINCE: u32 = 20230601;

/// The first build seen to checkpoint epoll-watched TCP sockets (Debian's 2022-12-19 cannot).
const SAVES_WATCHED_SOCKETS_SINCE: u32 = 20240729;

/// The first build seen to go on running in place after `checkpoint --leave-running` (same
/// Sentry, its processes continuing) rather than being restarted from the image.
const RESUMES_AFTER_CHECKPOINT_SINCE: u32 = 20240729;

/// The first build seen to restore into a container made by `create` (Debian's 2022-12-19
/// refuses: "cannot lock container metadata file: container already exists").
const RESTORES_INTO_CREATED_SINCE: u32 = 20240729;

/// `auto` is systrap on builds that have a working one, ptrace on older ones; anything else
/// is taken as asked.
pub fn pick_platform(asked: &str, date: Option<u32>) -> &str {
    match asked {
        "auto" if date.is_some_and(|d| d >= SYSTRAP_SINCE) => "systrap",
        "auto" => "ptrace",
        other => other,
    }
}

/// The first line of `runsc --version` for the runsc on PATH (as a node finds it), if any.
pub fn version_on_path() -> Option<String> {
    let out = std::process::Command::new(which("runsc")?)
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    Some(text.lines().next()?.trim().to_string())
}

/// What `runsc ARGS` prints on both of its outputs (empty when it cannot run).
fn help_text(path: &Path, args: &[&str]) -> String {
    std::process::Command::new(path)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr)
        })
        .unwrap_or_default()
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin".into());
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/usr/local/bin"].map(PathBuf::from))
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

impl Runsc {
    /// Finds runsc (at `path`, else on PATH) and reads its version; None when it is absent.
    pub fn detect(path: Option<&Path>, root: PathBuf, platform: &str) -> Result<Option<Runsc>> {
        let Some(path) = path.map(Path::to_path_buf).or_else(|| which("runsc")) else {
            return Ok(None);
        };
        let out = std::process::Command::new(&path)
            .arg("--version")
            .output()
            .map_err(|e| Error::io(format!("running {} --version", path.display()), e))?;
        if !out.status.success() {
            return Err(Error::invalid(format!(
                "{} --version failed: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let version = text.lines().next().unwrap_or_default().trim().to_string();
        std::fs::create_dir_all(&root).map_err(|e| Error::io("creating the runsc root", e))?;
        let date = build_date(&version);
        // Flags a build knows are in its listings (older builds lack the newer ones).
        let flags = help_text(&path, &["flags"]);
        let checkpoint_flags = help_text(&path, &["checkpoint", "--help"]);
        Ok(Some(Runsc {
            chooses_compression: checkpoint_flags.contains("-compression"),
            saves_connections: flags.contains("-net-disconnect-ok"),
            saves_watched_sockets: date.is_some_and(|d| d >= SAVES_WATCHED_SOCKETS_SINCE),
            resumes_after_checkpoint: date.is_some_and(|d| d >= RESUMES_AFTER_CHECKPOINT_SINCE),
            restores_into_created: date.is_some_and(|d| d >= RESTORES_INTO_CREATED_SINCE),
            platform: pick_platform(platform, date).to_string(),
            date,
            path,
            root,
            version,
            debug_log: std::env::var_os("SANDBOX_GATEWAY_RUNSC_DEBUG").map(PathBuf::from),
        }))
    }

    /// The flags every call takes; `own_root` is for a sandbox that writes through to the
    /// root it is given (a build's, see `buildroot`) instead of into an overlay in its memory.
    fn global(&self, own_root: bool) -> Vec<OsString> {
        let mut a: Vec<OsString> = vec![
            "--root".into(),
            self.root.clone().into(),
            format!("--platform={}", self.platform).into(),
            "--host-uds=all".into(),
            if own_root {
                "--overlay2=none"
            } else {
                "--overlay2=root:memory"
            }
            .into(),
            "--ignore-cgroups".into(),
        ];
        if self.saves_connections {
            a.push("--net-disconnect-ok".into());
        }
        if let Some(d) = &self.debug_log {
            a.push("--debug".into());
            a.push(format!("--debug-log={}/", d.display()).into());
        }
        a
    }

    /// Runs one runsc command. Its standard error goes to a file, not a pipe: the sandbox
    /// processes `run` and `restore` leave behind inherit it and would hold a pipe open.
    async fn call(&self, what: &str, args: &[OsString], cgroup: Option<&CgroupSet>) -> Result<()> {
        self.spawn(what, args, cgroup, false, None)?.finish().await
    }

    /// Starts one runsc command as `call` does, optionally working around runsc's
    /// root-namespace check (see `hide_proc_sys_net`) and with mounts of its own (a build's
    /// root, volumes: see `views`); `Spawned::finish` waits for it.
    fn spawn(
        &self,
        what: &str,
        args: &[OsString],
        cgroup: Option<&CgroupSet>,
        network: bool,
        mounts: Option<&ChildMounts>,
    ) -> Result<Spawned> {
        let started = std::time::Instant::now();
        let err_path = self.root.join(format!(
            "{what}-{}.stderr",
            crate::model::ids::random_hex(6)
        ));
        let err_file = std::fs::File::create(&err_path)
            .map_err(|e| Error::io("creating the runsc error file", e))?;
        let mut cmd = tokio::process::Command::new(&self.path);
        cmd.args(self.global(mounts.is_some_and(ChildMounts::own_root)))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err_file);
        if network || mounts.is_some() {
            let mounts = mounts.cloned();
            // SAFETY: runs in the forked child before exec and makes only system calls (the
            // mounts' strings were made before the fork).
            unsafe {
                cmd.pre_exec(move || {
                    own_mount_namespace()?;
                    if network {
                        hide_proc_sys_net()?;
                    }
                    match &mounts {
                        Some(r) => r.apply(),
                        None => Ok(()),
                    }
                })
            };
        }
        let _held = match cgroup {
            Some(cg) => Cgroups::start_in(&mut cmd, cg, None)
                .map_err(|e| Error::io("joining the sandbox cgroups", e))?,
            None => Vec::new(),
        };
        // Made first, so that its drop removes the error file if the spawn fails.
        let mut spawned = Spawned {
            what: what.to_string(),
            child: None,
            err_path,
            started,
        };
        let child = cmd
            .spawn()
            .map_err(|e| Error::io(format!("running runsc {what}"), e))?;
        spawned.child = Some(child);
        Ok(spawned)
    }

    /// Starts a container of the bundle, detached, inside `cgroup`; with `egress` on the network
    /// of the namespace the bundle names, else on loopback only.
    pub async fn run(
        &self,
        bundle: &Path,
        id: &str,
        cgroup: &CgroupSet,
        egress: bool,
        mounts: Option<&ChildMounts>,
    ) -> Result<()> {
        let args = of_bundle("run", &["--detach".into()], bundle, id, egress);
        self.spawn("run", &args, Some(cgroup), egress, mounts)?
            .finish()
            .await
    }

    /// Makes a container of the bundle without starting it, inside `cgroup`: its Sentry and
    /// gofer run and wait, and a `restore` under the same name loads an image into them
    /// instead of starting its own (see `standby`).
    pub async fn create(
        &self,
        bundle: &Path,
        id: &str,
        cgroup: &CgroupSet,
        egress: bool,
    ) -> Result<()> {
        let args = of_bundle("create", &[], bundle, id, egress);
        self.spawn("create", &args, Some(cgroup), egress, None)?
            .finish()
            .await
    }

    /// Starts a container from a checkpoint image, detached; into the container of that name
    /// if one was made (`create`), else into a new one, whose processes start inside `cgroup`.
    pub async fn restore(
        &self,
        image: &Path,
        bundle: &Path,
        id: &str,
        cgroup: Option<&CgroupSet>,
        egress: bool,
    ) -> Result<()> {
        let flags = ["--image-path".into(), image.into(), "--detach".into()];
        let args = of_bundle("restore", &flags, bundle, id, egress);
        self.spawn("restore", &args, cgroup, egress, None)?
            .finish()
            .await
    }

    /// Starts `restore` as `restore` does, but held before it reads anything: runsc opens its
    /// error log (`--log`) first thing, and here that is a FIFO nobody reads yet, so runsc
    /// waits in that open with its start-up (about 25 ms here) done. `HeldRestore::release`
    /// lets it go on. Answers once runsc is seen waiting there; an error (and nothing left
    /// running) if it is not.
    pub async fn hold_restore(
        &self,
        image: &Path,
        bundle: &Path,
        id: &str,
        cgroup: &CgroupSet,
        egress: bool,
    ) -> Result<HeldRestore> {
        let fifo = self.root.join(format!("{id}.hold"));
        let _ = std::fs::remove_file(&fifo);
        nix::unistd::mkfifo(
            &fifo,
            nix::sys::stat::Mode::S_IRUSR | nix::sys::stat::Mode::S_IWUSR,
        )
        .map_err(|e| Error::io("making the restore's hold", e.into()))?;
        let mut args: Vec<OsString> = vec![format!("--log={}", fifo.display()).into()];
        let flags = ["--image-path".into(), image.into(), "--detach".into()];
        args.extend(of_bundle("restore", &flags, bundle, id, egress));
        // Made first, so that its drop removes the FIFO if anything below fails.
        let mut held = HeldRestore {
            fifo,
            image: image.to_path_buf(),
            spawned: None,
        };
        let spawned = self.spawn("restore", &args, Some(cgroup), egress, None)?;
        let pid = spawned.child.as_ref().and_then(|c| c.id());
        held.spawned = Some(spawned);
        let deadline = std::time::Instant::now() + HOLD_WITHIN;
        while !pid.is_some_and(opening) {
            if std::time::Instant::now() > deadline {
                // Dropped: runsc is killed; the caller deletes the container.
                return Err(Error::internal(format!(
                    "runsc restore of {id} was not seen waiting on its log within {HOLD_WITHIN:?}"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        Ok(held)
    }

    /// Writes the container's state (memory, processes, files) to `image`; the container
    /// stops, or with `leave_running` (builds with `resumes_after_checkpoint`) runs on.
    pub async fn checkpoint(&self, image: &Path, id: &str, leave_running: bool) -> Result<()> {
        let mut args: Vec<OsString> =
            vec!["checkpoint".into(), "--image-path".into(), image.into()];
        if self.chooses_compression {
            args.extend(["--compression".into(), "none".into()]);
        }
        if leave_running {
            args.push("--leave-running".into());
        }
        args.push(id.into());
        self.call("checkpoint", &args, None).await
    }

    /// Freezes a running container in place.
    pub async fn pause(&self, id: &str) -> Result<()> {
        self.call("pause", &["pause".into(), id.into()], None).await
    }

    /// Thaws a frozen container.
    pub async fn resume(&self, id: &str) -> Result<()> {
        self.call("resume", &["resume".into(), id.into()], None)
            .await
    }

    /// Forgets a container, killing what is left of it.
    pub async fn delete(&self, id: &str) -> Result<()> {
        let args: Vec<OsString> = vec!["delete".into(), "--force".into(), id.into()];
        self.call("delete", &args, None).await
    }

    /// Removes what runsc commands of an earlier run left in the state root (their error
    /// files, held restores' FIFOs: an unclean exit drops neither); answers how many.
    pub fn remove_leftovers(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return 0;
        };
        entries
            .flatten()
            .filter(|e| is_leftover(&e.file_name().to_string_lossy()))
            .filter(|e| std::fs::remove_file(e.path()).is_ok())
            .count()
    }

    /// The containers in this node's state root.
    pub async fn list(&self) -> Vec<String> {
        let out = tokio::process::Command::new(&self.path)
            .args([
                "--root".as_ref(),
                self.root.as_os_str(),
                "list".as_ref(),
                "-quiet".as_ref(),
            ])
            .output()
            .await;
        match out {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// A runsc command started; `finish` waits for it and reads its answer.
struct Spawned {
    what: String,
    /// None only while it is being made.
    child: Option<tokio::process::Child>,
    err_path: PathBuf,
    started: std::time::Instant,
}

impl Spawned {
    async fn finish(mut self) -> Result<()> {
        let what = self.what.clone();
        let status = match self.child.take() {
            Some(mut c) => c.wait().await,
            None => Err(std::io::Error::other("not started")),
        };
        let stderr = std::fs::read_to_string(&self.err_path).unwrap_or_default();
        let status = status.map_err(|e| Error::io(format!("running runsc {what}"), e))?;
        if !status.success() {
            let last = stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            // runsc reports a full disk (writing a checkpoint image, say) only in its output.
            if stderr.to_lowercase().contains("no space left on device") {
                return Err(Error::storage_full(format!(
                    "the node's data directory is full: runsc {what} failed: {last}"
                )));
            }
            return Err(Error::internal(format!("runsc {what} failed: {last}")));
        }
        tracing::debug!(
            what,
            ms = self.started.elapsed().as_secs_f64() * 1e3,
            "runsc answered"
        );
        Ok(())
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.err_path);
    }
}

/// How long a held restore may take to reach its wait (runsc's start-up, under load).
const HOLD_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A `runsc restore` waiting to go on (see `Runsc::hold_restore`). Dropped, it is killed
/// before it has done anything.
pub struct HeldRestore {
    fifo: PathBuf,
    /// The image it restores.
    pub image: PathBuf,
    spawned: Option<Spawned>,
}

impl HeldRestore {
    /// Lets the restore go on and waits for its answer.
    pub async fn release(mut self) -> Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening the read end completes runsc's open. It stays open until runsc ends: a
        // write into a FIFO with no reader would end runsc (SIGPIPE).
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&self.fifo)
            .map_err(|e| Error::io("releasing the held restore", e))?;
        let answer = match self.spawned.take() {
            Some(s) => s.finish().await,
            None => Err(Error::internal("the held restore was not started")),
        };
        drop(reader);
        answer
    }
}

impl Drop for HeldRestore {
    fn drop(&mut self) {
        // Not released: runsc still waits in its open, before it has done anything. Killed,
        // it is reaped by tokio once dropped.
        if let Some(c) = self.spawned.as_mut().and_then(|s| s.child.as_mut()) {
            let _ = c.start_kill();
        }
        self.spawned.take();
        let _ = std::fs::remove_file(&self.fifo);
    }
}

/// Whether process `pid` is in an `open` that has not returned: a held restore's runsc waits
/// in one for a reader of its log. Any of its threads may be the one.
fn opening(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .any(|t| in_open(&std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default()))
}

/// Whether a `/proc/PID/task/TID/syscall` line is a thread blocked in open or openat.
fn in_open(line: &str) -> bool {
    matches!(
        line.split_whitespace().next().and_then(|n| n.parse::<i64>().ok()),
        Some(n) if n == libc::SYS_openat || n == libc::SYS_open
    )
}

/// Whether a file in the state root is one of ours that a runsc command leaves only when the
/// node dies under it: `<verb>-<hex>.stderr` (see `spawn`) or `<container>.hold`.
fn is_leftover(name: &str) -> bool {
    name.ends_with(".hold") || name.ends_with(".stderr")
}

/// `runsc [NETWORK] VERB FLAGS --bundle BUNDLE ID`, the network as `egress` asks.
fn of_bundle(
    verb: &str,
    flags: &[OsString],
    bundle: &Path,
    id: &str,
    egress: bool,
) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![network_flag(egress).into(), verb.into()];
    a.extend(flags.iter().cloned());
    a.extend(["--bundle".into(), bundle.into(), id.into()]);
    a
}

fn network_flag(egress: bool) -> &'static str {
    if egress {
        "--network=sandbox"
    } else {
        "--network=none"
    }
}

/// A mount namespace of runsc's own, whose mounts never reach the node's. Not
/// `sandbox::mounts::make_private`: that one formats its error, and nothing may allocate
/// between fork and exec.
fn own_mount_namespace() -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )?;
    Ok(())
}

/// runsc (this build) refuses to take over a namespace's interfaces when
/// /proc/sys/net/core/rmem_default exists, which it takes to mean "the host's namespace"; newer
/// kernels show that file in every namespace. The namespace it is given is a holder's, never
/// the host's, so the check is answered by hiding /proc/sys/net in a mount namespace of runsc's
/// own (the sandbox builds its network stack without it).
fn hide_proc_sys_net() -> std::io::Result<()> {
    use nix::mount::{MsFlags, mount};
    mount(
        Some("none"),
        "/proc/sys/net",
        Some("tmpfs"),
        MsFlags::MS_RDONLY,
        None::<&str>,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_in_open_is_told_from_one_elsewhere() {
        let openat = format!(
            "{} 0xffffff9c 0xc000124000 0x80441 0x1a4 0x0 0x0 0x7ffd 0x4a",
            libc::SYS_openat
        );
        assert!(in_open(&openat));
        assert!(in_open(&format!("{} 0x1 0x2", libc::SYS_open)));
        assert!(!in_open(
            "202 0xc0000a0148 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x4a"
        ));
        assert!(!in_open("running"));
        assert!(!in_open("-1 0x7ffd 0x4a"));
        assert!(!in_open(""));
    }

    #[test]
    fn only_our_command_files_are_leftovers() {
        assert!(is_leftover("checkpoint-a1b2c3.stderr"));
        assert!(is_leftover("in_0123456789abcdef-a1b2c3.hold"));
        // runsc's own state: a container's state file and lock.
        assert!(!is_leftover(
            "in_0123456789abcdef-a1b2c3_sandbox:in_0123.state"
        ));
        assert!(!is_leftover(
            "in_0123456789abcdef-a1b2c3_sandbox:in_0123.lock"
        ));
        assert!(!is_leftover("runsc.lock"));
    }

    #[test]
    fn build_dates_come_from_either_version_style() {
        assert_eq!(build_date("runsc version 0.0~20221219.0"), Some(20221219));
        assert_eq!(
            build_date("runsc version release-20240801.0"),
            Some(20240801)
        );
        assert_eq!(build_date("runsc version 0.0.0"), None);
    }

    #[test]
    fn bundle_commands_put_flags_before_the_container() {
        let args = of_bundle(
            "restore",
            &["--image-path".into(), "/img".into()],
            Path::new("/b"),
            "c1",
            true,
        );
        assert_eq!(
            args,
            [
                "--network=sandbox",
                "restore",
                "--image-path",
                "/img",
                "--bundle",
                "/b",
                "c1"
            ]
            .map(OsString::from)
        );
        assert_eq!(
            of_bundle("create", &[], Path::new("/b"), "c2", false),
            ["--network=none", "create", "--bundle", "/b", "c2"].map(OsString::from)
        );
    }

    #[test]
    fn auto_picks_systrap_on_builds_that_have_it() {
        assert_eq!(pick_platform("auto", Some(20221219)), "ptrace");
        assert_eq!(pick_platform("auto", Some(20240729)), "systrap");
        assert_eq!(pick_platform("auto", None), "ptrace");
        assert_eq!(pick_platform("ptrace", Some(20240729)), "ptrace");
        assert_eq!(pick_platform("kvm", None), "kvm");
    }
}
