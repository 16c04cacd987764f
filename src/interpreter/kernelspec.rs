//! Kernelspecs (`kernels/NAME/kernel.json` in the Jupyter data directories) and how a
//! kernel's process is started from one: its command line, environment, session and fate.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

use super::languages::Family;

/// How a kernel wants to be interrupted (its kernelspec's `interrupt_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// SIGINT to the kernel's process group (Jupyter's default).
    Signal,
    /// `interrupt_request` on the control channel.
    Message,
}

/// A kernelspec: `DIR/kernel.json` in one of the Jupyter data directories.
#[derive(Debug, Clone)]
pub struct KernelSpec {
    pub name: String,
    pub dir: PathBuf,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub language: String,
    pub interrupt: Interrupt,
    /// Unix sockets, unless the kernel can only speak TCP (its kernelspec's metadata says
    /// `"sandbox-gateway": {"transport": "tcp"}`).
    pub tcp: bool,
}

#[derive(Deserialize)]
struct SpecFile {
    argv: Vec<String>,
    #[serde(default)]
    language: String,
    #[serde(default)]
    interrupt_mode: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    metadata: serde_json::Value,
}

impl KernelSpec {
    /// The kernelspec called `name` in the first of `dirs` (Jupyter data directories, each
    /// with a `kernels/` folder) that has it.
    pub fn find(dirs: &[PathBuf], name: &str) -> Option<KernelSpec> {
        // A kernel name is a directory name: nothing that could climb out of `kernels/`.
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            || name.starts_with('.')
        {
            return None;
        }
        dirs.iter().find_map(|d| {
            let dir = d.join("kernels").join(name);
            let bytes = std::fs::read(dir.join("kernel.json")).ok()?;
            let file: SpecFile = serde_json::from_slice(&bytes)
                .map_err(|e| {
                    tracing::warn!(kernel = name, error = %e, "kernel.json does not parse");
                })
                .ok()?;
            let tcp = file.metadata["sandbox-gateway"]["transport"] == "tcp";
            (!file.argv.is_empty()).then(|| KernelSpec {
                name: name.to_string(),
                dir,
                argv: file.argv,
                env: file.env,
                language: file.language,
                interrupt: match file.interrupt_mode.as_deref() {
                    Some("message") => Interrupt::Message,
                    _ => Interrupt::Signal,
                },
                tcp,
            })
        })
    }

    pub fn family(&self) -> Family {
        Family::of(&self.language)
    }
}

/// Where and how a kernel process starts.
#[derive(Debug, Clone)]
pub struct Launch {
    pub spec: KernelSpec,
    pub cwd: PathBuf,
    /// A directory only the server may enter: connection files and sockets live there.
    pub runtime_dir: PathBuf,
    /// The environment every kernel starts with (the kernelspec's own comes on top).
    pub env: Vec<(String, String)>,
    /// How long the kernel may take to answer its first request.
    pub start_timeout: Duration,
}

pub(super) fn kill_group(pid: i32) {
    if pid > 0 {
        // SAFETY: SIGKILL to the kernel's process group (it leads its own session), then to
        // the process itself in case it left the group.
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

pub(super) fn remove_sockets(prefix: &Path) {
    for port in 1..=5 {
        let _ = std::fs::remove_file(format!("{}-{port}", prefix.display()));
    }
}

/// The kernel's command line with its placeholders filled in.
pub(super) fn argv(spec: &KernelSpec, conn_file: &Path) -> Vec<String> {
    spec.argv
        .iter()
        .map(|a| {
            a.replace("{connection_file}", &conn_file.to_string_lossy())
                .replace("{resource_dir}", &spec.dir.to_string_lossy())
        })
        .collect()
}

pub(super) fn spawn(launch: &Launch, conn_file: &Path) -> std::io::Result<tokio::process::Child> {
    let args = argv(&launch.spec, conn_file);
    let mut cmd = tokio::process::Command::new(&args[0]);
    cmd.args(&args[1..])
        .env_clear()
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .envs(&launch.spec.env)
        .current_dir(&launch.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            // Its own session, so that an interrupt or a kill reaches everything it started.
            libc::setsid();
            // It dies with the server (worker threads live as long as the server does).
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            // The OOM killer takes kernels before the server that reports on them.
            let path = c"/proc/self/oom_score_adj";
            let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd >= 0 {
                let v = b"500";
                libc::write(fd, v.as_ptr().cast(), v.len());
                libc::close(fd);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Five loopback ports free a moment ago (for a kernel that speaks TCP).
pub(super) fn free_loopback_ports() -> std::io::Result<[u16; 5]> {
    let listeners = (0..5)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)))
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut ports = [0u16; 5];
    for (p, l) in ports.iter_mut().zip(&listeners) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernelspecs_are_found_by_name_and_never_by_path() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("kernels/python3");
        std::fs::create_dir_all(&k).unwrap();
        std::fs::write(
            k.join("kernel.json"),
            r#"{"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Python 3", "language": "python", "env": {"A": "1"}}"#,
        )
        .unwrap();
        let m = d.path().join("kernels/msg");
        std::fs::create_dir_all(&m).unwrap();
        std::fs::write(
            m.join("kernel.json"),
            r#"{"argv": ["k", "{connection_file}", "{resource_dir}"], "language": "bash", "interrupt_mode": "message",
                "metadata": {"sandbox-gateway": {"transport": "tcp"}}}"#,
        )
        .unwrap();
        std::fs::create_dir_all(d.path().join("kernels/broken")).unwrap();
        std::fs::write(d.path().join("kernels/broken/kernel.json"), "{").unwrap();
        let dirs = vec![PathBuf::from("/nonexistent"), d.path().to_path_buf()];

        let py = KernelSpec::find(&dirs, "python3").unwrap();
        assert_eq!(py.family(), Family::Python);
        assert_eq!(py.interrupt, Interrupt::Signal);
        assert_eq!(py.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            argv(&py, Path::new("/run/k.json")),
            ["python3", "-m", "ipykernel_launcher", "-f", "/run/k.json"]
        );
        assert!(!py.tcp);
        let msg = KernelSpec::find(&dirs, "msg").unwrap();
        assert_eq!(msg.interrupt, Interrupt::Message);
        assert!(msg.tcp);
        assert_eq!(
            argv(&msg, Path::new("/c.json"))[2],
            m.to_string_lossy().to_string()
        );
        for bad in ["broken", "missing", "../kernels/python3", "", ".", "a/b"] {
            assert!(KernelSpec::find(&dirs, bad).is_none(), "{bad}");
        }
    }
}
