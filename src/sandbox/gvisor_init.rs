//! The init of a gVisor sandbox: pid 1 inside runsc. It starts the agent (envd) as pid 2,
//! reaps orphans, and serves the sandbox's only door to the node: a Unix socket in a directory
//! the node shares with the sandbox (runsc `--host-uds=create`). A connection names a port
//! (`PORT 49983`) and is then spliced to that port on the sandbox's own loopback, so envd and
//! the sandbox's servers are reachable without any network.
//!
//! gVisor cannot checkpoint a sandbox that holds a host socket, so before a checkpoint the node
//! sends `QUIESCE`: the door is closed and every spliced connection cut. The door opens again
//! when the node changes the generation file beside it, which it does just before it restores
//! the checkpoint (in this sandbox or in a copy of it).
//!
//! `SYNC` flushes the sandbox's file data to the root it writes through (a build's).
//!
//! `SAVE <ns>` stops every other process and streams the sandbox's files (`savefiles`) for a
//! filesystem-only pause; the node ends the sandbox after, or sends `CONT` if the save failed.
//! `LOAD` takes such a stream into a fresh sandbox before it is handed out.
//!
//! This gVisor build also cannot save a TCP socket that an epoll instance watches, and a failed
//! checkpoint ends the sandbox. So envd listens on a Unix socket here (the door's port 49983
//! leads to it), and `SAVEABLE` lets the node ask first whether any other process holds such a
//! socket (see `unsaveable`).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where the shared directory is inside the sandbox.
pub const RUN_DIR: &str = "/.sandbox-gateway/run";
pub const DOOR: &str = "door.sock";
pub const GENERATION: &str = "generation";
/// envd's socket, inside the sandbox's own file system (never shared with the host).
const ENVD_SOCKET: &str = "/.sandbox-gateway/envd.sock";

/// The sandbox's group in gVisor's own pids controller (runsc mounts it from the bundle).
const TASKS_DIR: &str = "/sys/fs/cgroup/pids";

/// The agent's pid (envd), which the memory guard never ends.
static AGENT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Runs as pid 1; never returns.
pub fn run(
    init_token: String,
    memory_bytes: u64,
    cpu_count: u32,
    pids: Option<u32>,
    egress: bool,
    services: &[super::services::Service],
) -> ! {
    // runsc hands the container a host file as its standard streams; nothing a sandbox writes
    // may grow the host's disk, so they end here.
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
        for target in 0..=2 {
            // SAFETY: dup2 onto the standard descriptors of this single-threaded process.
            unsafe { libc::dup2(fd, target) };
        }
    }
    // The root is the sandbox's own (an overlay in its memory): give it fresh names and, with
    // egress, slirp4netns's resolver.
    let hostname = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().to_string())
        .unwrap_or_else(|_| "sandbox".into());
    let resolver = egress.then_some(super::net::SLIRP_DNS);
    if let Err(e) = super::mounts::write_identity(&hostname, resolver) {
        eprintln!("init: writing /etc identity: {e}");
    }
    // What the init starts is held to the sandbox's pids; the init, outside, is not.
    let limited = limit_tasks(pids).unwrap_or_else(|e| {
        eprintln!("init: holding the sandbox's tasks to its pids: {e}");
        false
    });
    // The agent first, while this process is single-threaded.
    // SAFETY: fork of a single-threaded process; the child becomes the agent.
    let agent = unsafe { libc::fork() };
    AGENT.store(agent, std::sync::atomic::Ordering::Relaxed);
    if agent == 0 {
        let cfg = crate::envd::EnvdConfig {
            init_token: Some(init_token),
            mem_total_bytes: Some(memory_bytes),
            cpu_count: Some(cpu_count),
            envs_file: Some(crate::interpreter::envs::SANDBOX_ENVS_FILE.into()),
            ..Default::default()
        };
        let _ = std::fs::remove_file(ENVD_SOCKET);
        let code = match UnixListener::bind(ENVD_SOCKET) {
            Ok(l) => match crate::envd::run(vec![crate::envd::Listener::Unix(l)], cfg, || {}) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("agent: {e}");
                    1
                }
            },
            Err(e) => {
                eprintln!("agent: binding {ENVD_SOCKET}: {e}");
                1
            }
        };
        // SAFETY: the agent's process ends here.
        unsafe { libc::_exit(code) };
    }
    super::services::start(services, super::services::Exposure::Socket, memory_bytes);
    if limited
        && let Err(e) = std::fs::write(
            Path::new(TASKS_DIR).join("cgroup.procs"),
            std::process::id().to_string(),
        )
    {
        eprintln!("init: leaving the limited tasks: {e}");
    }
    for &service in services {
        std::thread::spawn(move || bridge(service.port(), service.socket()));
    }
    // The door opens once envd answers, so that the node's first PING means "ready".
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while UnixStream::connect(ENVD_SOCKET).is_err() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::spawn(|| door(Path::new(RUN_DIR)));
    loop {
        let mut status = 0;
        // SAFETY: reaping any child of pid 1.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == agent
            || (pid < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD))
        {
            // SAFETY: the sandbox ends with its agent.
            unsafe { libc::_exit(1) };
        }
    }
}

/// Holds what the init starts next (envd, the services and all they start) to `pids` tasks
/// with gVisor's own pids controller, as the built-in runtime's pids cgroup does: past it a
/// fork or a new thread fails with EAGAIN inside. Without it a flood went on until the Sentry,
/// each thread inside being a host thread, met the host's limit (set above this one) and the
/// sandbox stopped answering. The limit is on a group below the sandbox's own, which the init
/// joins for its forks and leaves after, so that its door answers through a flood. Answers
/// whether the init joined it.
fn limit_tasks(pids: Option<u32>) -> io::Result<bool> {
    let Some(pids) = pids else {
        return Ok(false);
    };
    let group = Path::new(TASKS_DIR).join("sandbox");
    std::fs::create_dir_all(&group)?;
    std::fs::write(group.join("pids.max"), pids.to_string())?;
    std::fs::write(group.join("cgroup.procs"), std::process::id().to_string())?;
    Ok(true)
}

fn generation(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(GENERATION)).unwrap_or_default()
}

/// Open connections by number, so that QUIESCE can cut them all.
type Open = Arc<Mutex<(u64, std::collections::HashMap<u64, UnixStream>)>>;

fn lock(
    open: &Open,
) -> std::sync::MutexGuard<'_, (u64, std::collections::HashMap<u64, UnixStream>)> {
    open.lock().unwrap_or_else(|p| p.into_inner())
}

fn door(dir: &Path) {
    let path: PathBuf = dir.join(DOOR);
    let open: Open = Arc::default();
    loop {
        let seen = generation(dir);
        let _ = std::fs::remove_file(&path);
        match UnixListener::bind(&path) {
            Ok(listener) => {
                if let Some(mut quiesced) = serve(&listener, &open) {
                    // Closed before the node hears OK: a checkpoint that finds the listener
                    // still open fails ("bound host socket").
                    drop(listener);
                    let _ = quiesced.write_all(b"OK\n");
                }
            }
            Err(e) => eprintln!("door: binding {}: {e}", path.display()),
        }
        // Closed for a checkpoint: wait for the node's next generation.
        while generation(dir) == seen {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Accepts until a QUIESCE arrives; answers its connection, for the caller to answer once
/// the listener is closed.
fn serve(listener: &UnixListener, open: &Open) -> Option<UnixStream> {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let mut reader = BufReader::new(match conn.try_clone() {
            Ok(c) => c,
            Err(_) => continue,
        });
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() {
            continue;
        }
        let mut conn = conn;
        match line.trim().split_once(' ').unwrap_or((line.trim(), "")) {
            ("QUIESCE", _) => {
                for (_, c) in lock(open).1.drain() {
                    let _ = c.shutdown(Shutdown::Both);
                }
                return Some(conn);
            }
            ("PING", _) => {
                let _ = conn.write_all(b"PONG\n");
            }
            // Before a build's writes are committed: gVisor keeps file data in its own page
            // cache, and a root it writes through gets that data only when flushed.
            ("SYNC", _) => {
                // SAFETY: sync takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let _ = conn.write_all(b"OK\n");
            }
            ("SAVE", since) => {
                let Ok(since) = since.parse::<i64>() else {
                    let _ = conn.write_all(b"ERR not a time\n");
                    continue;
                };
                // Nothing may write while the files are read; the node ends them all next.
                signal_others(libc::SIGSTOP);
                if conn.write_all(b"OK\n").is_ok()
                    && let Err(e) = super::savefiles::save(Path::new("/"), since, &mut conn)
                {
                    eprintln!("init: saving the files: {e}");
                }
                let _ = conn.shutdown(Shutdown::Both);
            }
            // The node's memory guard (see `crate::node::runtime::gvisor::oomguard`): the
            // sandbox is near its memory limit, so its largest process ends, as the kernel's
            // OOM killer would end it, before the host ends the whole sandbox.
            ("RECLAIM", floor) => {
                let floor = floor.parse::<u64>().unwrap_or(u64::MAX);
                let answer = match largest_process() {
                    Some((pid, rss, name)) if rss >= floor => {
                        // SAFETY: kill with a pid read from /proc.
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                        format!("KILLED {pid} {name} {} MiB\n", rss >> 20)
                    }
                    _ => "NONE\n".to_string(),
                };
                let _ = conn.write_all(answer.as_bytes());
            }
            ("CONT", _) => {
                signal_others(libc::SIGCONT);
                let _ = conn.write_all(b"OK\n");
            }
            ("LOAD", _) => {
                let _ = conn.write_all(b"OK\n");
                // The stream follows the request on this connection (what the reader holds
                // of it first).
                let answer = match super::savefiles::load(Path::new("/"), &mut reader) {
                    Ok(()) => "DONE\n".to_string(),
                    Err(e) => format!("ERR {e}\n"),
                };
                let _ = conn.write_all(answer.as_bytes());
            }
            ("SAVEABLE", _) => {
                let answer = match unsaveable() {
                    None => "OK\n".to_string(),
                    Some(why) => format!("NO {why}\n"),
                };
                let _ = conn.write_all(answer.as_bytes());
            }
            ("PORT", port) => match port.parse::<u16>().map(connect_port) {
                Ok(Ok(inner)) => {
                    if conn.write_all(b"OK\n").is_err() {
                        continue;
                    }
                    let Ok(c) = conn.try_clone() else { continue };
                    let id = {
                        let mut o = lock(open);
                        o.0 += 1;
                        let id = o.0;
                        o.1.insert(id, c);
                        id
                    };
                    let buffered = reader.buffer().to_vec();
                    splice(conn, inner, buffered, (open.clone(), id));
                }
                Ok(Err(e)) => {
                    let _ = conn.write_all(format!("ERR port is not open: {e}\n").as_bytes());
                }
                Err(_) => {
                    let _ = conn.write_all(b"ERR not a port\n");
                }
            },
            _ => {
                let _ = conn.write_all(b"ERR unknown request\n");
            }
        }
    }
    None
}

/// The process holding the most memory, other than this init and the agent: (pid, resident
/// bytes, name).
fn largest_process() -> Option<(libc::pid_t, u64, String)> {
    let agent = AGENT.load(std::sync::atomic::Ordering::Relaxed);
    // SAFETY: sysconf has no preconditions.
    let page = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&p| p > 1 && p != agent)
        .filter_map(|p| {
            let statm = std::fs::read_to_string(format!("/proc/{p}/statm")).ok()?;
            let rss = resident_bytes(&statm, page)?;
            let name = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            Some((p, rss, name.trim().to_string()))
        })
        .max_by_key(|(_, rss, _)| *rss)
}

/// The resident size a `/proc/PID/statm` line gives (its second field, in pages).
fn resident_bytes(statm: &str, page: u64) -> Option<u64> {
    let pages = statm.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(pages.saturating_mul(page))
}

/// Sends `signal` to every process of the sandbox but this init, twice over, so that one
/// forked while the first pass ran is caught too.
fn signal_others(signal: libc::c_int) {
    for _ in 0..2 {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return;
        };
        for pid in procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
            .filter(|&p| p > 1)
        {
            // SAFETY: kill with a pid read from /proc; at worst it is gone (ESRCH).
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// A connection into the sandbox: envd's Unix socket, or a TCP port on its loopback.
enum Inner {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Inner {
    fn try_clone(&self) -> io::Result<Inner> {
        Ok(match self {
            Inner::Unix(s) => Inner::Unix(s.try_clone()?),
            Inner::Tcp(s) => Inner::Tcp(s.try_clone()?),
        })
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Inner::Unix(s) => s.shutdown(how),
            Inner::Tcp(s) => s.shutdown(how),
        };
    }
}

impl Read for Inner {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Inner::Unix(s) => s.read(buf),
            Inner::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Inner {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Inner::Unix(s) => s.write(buf),
            Inner::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// In-sandbox clients reach a service on its TCP port, as on the built-in runtime (`curl
/// localhost:49999/health`): the init accepts there with a blocking thread, no event loop
/// (this gVisor build cannot checkpoint a TCP socket an epoll instance watches), and splices
/// each connection to the service's socket. Connections made from inside are not the
/// door's, so a checkpoint leaves them alone.
fn bridge(port: u16, socket: &'static str) {
    let listener = match std::net::TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("init: listening on port {port}: {e}");
            return;
        }
    };
    let open: Open = Arc::default();
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        // Not up (yet, or again): the client sees its connection closed.
        let Ok(unix) = UnixStream::connect(socket) else {
            continue;
        };
        splice(unix, Inner::Tcp(tcp), Vec::new(), (open.clone(), 0));
    }
}

fn connect_port(port: u16) -> io::Result<Inner> {
    if port == super::spec::ENVD_PORT {
        return UnixStream::connect(ENVD_SOCKET).map(Inner::Unix);
    }
    // The code interpreter listens on a socket here, for the same reason envd does.
    if port == crate::interpreter::PORT && std::path::Path::new(crate::interpreter::SOCKET).exists()
    {
        return UnixStream::connect(crate::interpreter::SOCKET).map(Inner::Unix);
    }
    TcpStream::connect(("127.0.0.1", port)).map(Inner::Tcp)
}

/// Why a checkpoint of this sandbox would fail (and end it), if it would: a process that has
/// an epoll instance and a TCP socket (Node.js, asyncio and most event-loop servers do). The
/// check is conservative: such a process may watch only other files, but this gVisor build
/// gives no way to tell.
fn unsaveable() -> Option<String> {
    let mut tcp_inodes = std::collections::HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            if let Some(inode) = line.split_whitespace().nth(9) {
                tcp_inodes.insert(inode.to_string());
            }
        }
    }
    let me = std::process::id().to_string();
    let procs = std::fs::read_dir("/proc").ok()?;
    for p in procs.flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == me {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let (mut epoll, mut tcp) = (false, false);
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let target = target.to_string_lossy();
            if target == "anon_inode:[eventpoll]" {
                epoll = true;
            } else if let Some(inode) = target
                .strip_prefix("socket:[")
                .and_then(|t| t.strip_suffix(']'))
            {
                tcp |= tcp_inodes.contains(inode);
            }
        }
        if epoll && tcp {
            let comm = std::fs::read_to_string(p.path().join("comm")).unwrap_or_default();
            return Some(format!(
                "process {pid} ({}) watches a TCP socket with epoll, which this gVisor build cannot checkpoint",
                comm.trim()
            ));
        }
    }
    None
}

/// Copies both ways on two threads until either side closes; then forgets the connection.
fn splice(unix: UnixStream, inner: Inner, already_read: Vec<u8>, (open, id): (Open, u64)) {
    let (Ok(mut unix_r), Ok(mut inner_w)) = (unix.try_clone(), inner.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        if !already_read.is_empty() && inner_w.write_all(&already_read).is_err() {
            return;
        }
        let _ = io::copy(&mut unix_r, &mut inner_w);
        inner_w.shutdown(Shutdown::Write);
    });
    let (mut inner_r, mut unix_w) = (inner, unix);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            match inner_r.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if unix_w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = unix_w.shutdown(Shutdown::Write);
        lock(&open).1.remove(&id);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_size_is_the_second_statm_field_in_pages() {
        assert_eq!(
            resident_bytes("258270 76800 1024 1 0 76900 0\n", 4096),
            Some(76800 * 4096)
        );
        assert_eq!(resident_bytes("12", 4096), None);
        assert_eq!(resident_bytes("1 x 2", 4096), None);
    }
}
