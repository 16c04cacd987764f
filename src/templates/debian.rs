//! Templates from Debian packages: `mmdebstrap` builds a minimal system with the packages
//! asked for, from the host's apt sources (or deb.debian.org when the host has none), adds
//! the user `user` (uid 1000, as on e2b) and lets pip install packages. Derived templates
//! (another template plus steps) are `derive`'s.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::shift::{Shift, shift_tree};
use super::{Kind, Progress, TemplateMeta, new_meta};
use crate::model::{Error, Result};
use crate::sandbox::spec::{IdMap, RootKind};

/// What `base` holds, as on e2b's base template: a shell and the usual tools, Python with pip
/// (`python` too), Node.js with npm, git, curl and sudo.
pub const BASE_PACKAGES: &[&str] = &[
    "bash",
    "ca-certificates",
    "coreutils",
    "curl",
    "git",
    "iproute2",
    "less",
    "nodejs",
    "npm",
    "passwd",
    "procps",
    "python3",
    "python3-pip",
    "python3-venv",
    "python-is-python3",
    "sudo",
];

const SUITE_FALLBACK: &str = "bookworm";
const MIRROR_FALLBACK: &str = "http://deb.debian.org/debian";

pub fn find_mmdebstrap() -> Option<PathBuf> {
    which("mmdebstrap")
}

fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The base packages plus `extra`, without duplicates; package names are checked so that
/// nothing reaches the command line as an option.
pub fn package_list(extra: &[String]) -> Vec<String> {
    let mut out: Vec<String> = BASE_PACKAGES.iter().map(|s| s.to_string()).collect();
    for p in extra {
        if !out.contains(p) {
            out.push(p.clone());
        }
    }
    out
}

pub(super) fn validate_packages(packages: &[String]) -> Result<()> {
    for p in packages {
        let ok = !p.is_empty()
            && p.len() <= 128
            && p.as_bytes()[0].is_ascii_alphanumeric()
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+-.:=~".contains(&b));
        if !ok {
            return Err(Error::invalid(format!(
                "{p:?} is not a Debian package name"
            )));
        }
    }
    Ok(())
}

/// The host's Debian suite, when it is Debian.
fn host_suite() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    let is_debian = text.lines().any(|l| l == "ID=debian");
    let code = text
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))?
        .trim_matches('"')
        .to_string();
    (is_debian && !code.is_empty()).then_some(code)
}

fn host_has_apt_sources() -> bool {
    Path::new("/etc/apt/sources.list").is_file()
        || std::fs::read_dir("/etc/apt/sources.list.d").is_ok_and(|d| {
            d.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().to_string();
                n.ends_with(".list") || n.ends_with(".sources")
            })
        })
}

/// Runs `cmd`, passing each line it prints on stderr to `progress` with a prefix.
pub(super) fn run_with_progress(
    mut cmd: Command,
    label: &str,
    progress: Progress<'_>,
) -> Result<()> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // A build in the background of `serve` must end with the process: the thread that runs
    // this waits for the child until it is done, so the child is killed when that thread (or
    // the whole process) goes. What the child starts is its own to end (see `in_chroot`).
    // SAFETY: prctl is async-signal-safe; this runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io(format!("starting {label}"), e))?;
    let mut tail: Vec<String> = Vec::new();
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
            progress(&format!("  {line}"));
            tail.push(line);
            if tail.len() > 20 {
                tail.remove(0);
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::io(format!("waiting for {label}"), e))?;
    if !status.success() {
        return Err(Error::internal(format!(
            "{label} failed ({status}): {}",
            tail.join(" | ")
        )));
    }
    Ok(())
}

/// Hooks run inside the new tree: the e2b user with passwordless sudo (as on e2b; it reaches
/// only the sandbox's own root), and pip allowed to install (Debian marks its Python as
/// externally managed, which would refuse `pip install` outright).
const CUSTOMIZE: &[&str] = &[
    "chroot \"$1\" useradd --create-home --uid 1000 --user-group --groups sudo --shell /bin/bash user",
    "echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > \"$1\"/etc/sudoers.d/user && chmod 0440 \"$1\"/etc/sudoers.d/user",
    "rm -f \"$1\"/usr/lib/python3*/EXTERNALLY-MANAGED",
];

pub fn bootstrap(
    mmdebstrap: &Path,
    staging: &Path,
    name: &str,
    packages: &[String],
    ids: IdMap,
    progress: Progress<'_>,
) -> Result<TemplateMeta> {
    validate_packages(packages)?;
    let suite = host_suite().unwrap_or_else(|| SUITE_FALLBACK.to_string());
    let root = staging.join(super::ROOTFS);
    progress(&format!(
        "building template {name} from Debian {suite} with mmdebstrap ({} packages; about a minute on a fast mirror)",
        packages.len()
    ));
    let mut cmd = Command::new(mmdebstrap);
    cmd.arg("--variant=minbase")
        .arg(format!("--include={}", packages.join(",")))
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-include=/usr/share/doc/*/copyright")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*");
    for hook in CUSTOMIZE {
        cmd.arg(format!("--customize-hook={hook}"));
    }
    cmd.arg(&suite).arg(&root);
    if !host_has_apt_sources() {
        cmd.arg(MIRROR_FALLBACK);
    }
    run_with_progress(cmd, "mmdebstrap", progress)?;
    shift_tree(&root, ids, Shift::In)
        .map_err(|e| Error::io("moving the template into the sandbox id range", e))?;
    let mut meta = new_meta(
        name,
        Kind::Debian,
        RootKind::Complete,
        ids,
        format!("mmdebstrap --variant=minbase {suite}"),
    );
    meta.packages = packages.to_vec();
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_names_are_checked() {
        assert!(validate_packages(&["python3".into(), "libc6-dev".into(), "g++".into()]).is_ok());
        assert!(validate_packages(&["--allow-unauthenticated".into()]).is_err());
        assert!(validate_packages(&["a b".into()]).is_err());
        assert!(validate_packages(&["".into()]).is_err());
        let list = package_list(&["jq".into(), "git".into()]);
        assert_eq!(list.iter().filter(|p| *p == "git").count(), 1);
        assert!(list.contains(&"jq".to_string()));
    }
}
