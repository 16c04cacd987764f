//! Derived templates: a copy of another template with steps applied, as host root in a chroot
//! of its own mount namespace (with /proc, /dev and the host's resolver): Debian packages with
//! apt, Python packages with pip (wheels only, so no package's build script runs here), files,
//! and shell commands. `template build NAME --from PARENT --packages …` is
//! apt alone; a built-in recipe (`recipes`) uses all of them.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::debian::{run_with_progress, validate_packages};
use super::shift::{Shift, shift_tree};
use super::{Kind, Progress, Template, TemplateMeta, new_meta};
use crate::model::{Error, Result};
use crate::sandbox::spec::IdMap;

/// A file a step puts into the tree.
#[derive(Debug, Clone)]
pub struct File {
    /// Absolute path inside the template.
    pub path: &'static str,
    pub content: &'static [u8],
    pub mode: u32,
}

/// What is done to the copy, in this order: apt, pip, files, commands.
#[derive(Debug, Clone, Default)]
pub struct Steps {
    pub apt: Vec<String>,
    /// A pip requirements file (pinned versions), installed into the system's Python.
    pub pip: Option<&'static str>,
    pub files: Vec<File>,
    /// Shell commands run last, each in the chroot with `sh -c`.
    pub commands: Vec<&'static str>,
}

impl Steps {
    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.apt.is_empty() {
            parts.push(format!("apt: {}", self.apt.join(", ")));
        }
        if self.pip.is_some() {
            parts.push("pip requirements".to_string());
        }
        if !self.files.is_empty() {
            parts.push(format!("{} files", self.files.len()));
        }
        if !self.commands.is_empty() {
            parts.push(format!("{} commands", self.commands.len()));
        }
        parts.join("; ")
    }
}

/// Where the steps' inputs wait inside the tree while it is built.
const WORK: &str = "tmp/sandbox-gateway-build";

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The start of every script `unshare` runs: `$1` is the tree, `run` runs a command in the
/// chroot with a plain environment. The host's CA bundle stands in, read-only, for the
/// tree's while it builds (a host whose egress intercepts TLS trusts a CA the template does
/// not), and
/// `/usr/share/man/man1` exists for packages whose scripts link a manual page there (the
/// templates leave manuals out).
const PRELUDE: &str = "set -e; r=\"$1\"; mount -t proc proc \"$r/proc\"; mount --rbind /dev \"$r/dev\"; \
     ca=/etc/ssl/certs/ca-certificates.crt; \
     if [ -f \"$ca\" ] && [ -f \"$r$ca\" ]; then mount --bind \"$ca\" \"$r$ca\"; \
     mount -o remount,bind,ro \"$r$ca\"; fi; \
     mkdir -p \"$r/usr/share/man/man1\"; \
     run() { chroot \"$r\" env -i DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1 \
     HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
     SSL_CERT_FILE=$ca PIP_CERT=$ca NODE_EXTRA_CA_CERTS=$ca \"$@\"; }; ";

/// The packages: apt, then pip.
fn packages_script(steps: &Steps) -> String {
    let mut s = String::from(PRELUDE);
    if !steps.apt.is_empty() {
        s.push_str(&format!(
            "run apt-get update -qq; run apt-get install -y -qq --no-install-recommends {}; ",
            steps.apt.join(" ")
        ));
    }
    if steps.pip.is_some() {
        s.push_str(&format!(
            "run python3 -m pip install --break-system-packages --no-cache-dir \
             --only-binary=:all: --progress-bar off -r /{WORK}/requirements.txt; "
        ));
    }
    s.push_str("true");
    s
}

/// After the files are in place: the commands, then what the build leaves behind goes.
fn finish_script(steps: &Steps) -> String {
    let mut s = String::from(PRELUDE);
    for c in &steps.commands {
        s.push_str(&format!("run sh -c {}; ", quote(c)));
    }
    s.push_str(&format!(
        "run apt-get clean; rm -rf \"$r/{WORK}\" \"$r\"/var/lib/apt/lists/* \"$r\"/root/.npm \"$r\"/root/.cache/pip"
    ));
    s
}

/// Runs `script` in mount and PID namespaces of its own: its mounts go with it, and when
/// `unshare` is killed (with the build, see `run_with_progress`) so is the script, and with
/// the script, as the namespace's first process, everything it started (apt, dpkg, pip).
fn in_chroot(root: &Path, script: &str, label: &str, progress: Progress<'_>) -> Result<()> {
    let mut cmd = Command::new("unshare");
    cmd.args([
        "--mount",
        "--pid",
        "--fork",
        "--kill-child",
        "--propagation",
        "private",
        "sh",
        "-c",
        script,
        "derive",
    ])
    .arg(root);
    run_with_progress(cmd, label, progress)
}

/// What the package steps read (the pip requirements).
fn write_inputs(root: &Path, steps: &Steps) -> Result<()> {
    let work = root.join(WORK);
    std::fs::create_dir_all(&work).map_err(|e| Error::io("preparing the build inputs", e))?;
    if let Some(req) = steps.pip {
        std::fs::write(work.join("requirements.txt"), req)
            .map_err(|e| Error::io("writing the pip requirements", e))?;
    }
    Ok(())
}

fn write_files(root: &Path, steps: &Steps) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for f in &steps.files {
        let rel = f.path.trim_start_matches('/');
        if rel.is_empty() || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(Error::internal(format!(
                "a recipe names a bad path {:?}",
                f.path
            )));
        }
        let dest: PathBuf = root.join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("creating {}", parent.display()), e))?;
        }
        std::fs::write(&dest, f.content)
            .and_then(|_| std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(f.mode)))
            .map_err(|e| Error::io(format!("writing {}", f.path), e))?;
    }
    Ok(())
}

/// A copy of `parent` with `steps` applied. The caller fills in what the new template is
/// (its packages, services, aliases) beyond what it inherits.
pub fn derive(
    parent: &Template,
    staging: &Path,
    name: &str,
    steps: &Steps,
    ids: IdMap,
    progress: Progress<'_>,
) -> Result<TemplateMeta> {
    validate_packages(&steps.apt)?;
    let root = staging.join(super::ROOTFS);
    progress(&format!(
        "building template {name} from {} ({})",
        parent.meta.name,
        steps.describe()
    ));
    let mut cp = Command::new("cp");
    cp.args(["-a", "--reflink=auto"])
        .arg(&parent.root)
        .arg(&root);
    run_with_progress(cp, "copying the parent template", progress)?;
    shift_tree(&root, ids, Shift::Out).map_err(|e| Error::io("preparing the copy", e))?;
    let _ = std::fs::copy("/etc/resolv.conf", root.join("etc/resolv.conf"));
    // Packages first, so that a package's own copy of a file (a kernelspec) does not replace
    // the recipe's.
    let ran = write_inputs(&root, steps)
        .and_then(|_| {
            in_chroot(
                &root,
                &packages_script(steps),
                "installing packages",
                progress,
            )
        })
        .and_then(|_| write_files(&root, steps))
        .and_then(|_| {
            in_chroot(
                &root,
                &finish_script(steps),
                "the build's commands",
                progress,
            )
        });
    let shifted = shift_tree(&root, ids, Shift::In)
        .map_err(|e| Error::io("moving the template into the sandbox id range", e));
    ran?;
    shifted?;
    let mut meta = new_meta(
        name,
        Kind::Derived,
        parent.meta.root_kind,
        ids,
        format!("{} + {}", parent.meta.name, steps.describe()),
    );
    meta.packages = parent.meta.packages.clone();
    meta.packages.extend(steps.apt.iter().cloned());
    meta.env = parent.meta.env.clone();
    meta.workdir = parent.meta.workdir.clone();
    // Its sandboxes run what the parent's do (the services' files came with the copy), and
    // need what the parent's need.
    meta.services = parent.meta.services.clone();
    meta.size = parent.meta.size.clone();
    Ok(meta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_runs_each_step_in_the_chroot_and_quotes_what_it_names() {
        let steps = Steps {
            apt: vec!["jq".into(), "r-base-core".into()],
            pip: Some("numpy==2.2.6\n"),
            files: vec![],
            commands: vec!["echo 'hi' > /x"],
        };
        let s = packages_script(&steps);
        assert!(s.contains("apt-get install -y -qq --no-install-recommends jq r-base-core"));
        assert!(s.contains("--only-binary=:all:") && s.contains("requirements.txt"));
        let f = finish_script(&steps);
        assert!(f.contains("run sh -c 'echo '\\''hi'\\'' > /x'"));
        assert!(f.ends_with("\"$r\"/root/.cache/pip"));
        let apt_only = packages_script(&Steps {
            apt: vec!["jq".into()],
            ..Default::default()
        });
        assert!(!apt_only.contains("pip install"));
    }

    #[test]
    fn files_land_inside_the_tree_only() {
        let d = tempfile::tempdir().unwrap();
        let steps = Steps {
            files: vec![File {
                path: "/etc/sandbox-gateway/x.json",
                content: b"{}",
                mode: 0o644,
            }],
            ..Default::default()
        };
        write_files(d.path(), &steps).unwrap();
        assert_eq!(
            std::fs::read(d.path().join("etc/sandbox-gateway/x.json")).unwrap(),
            b"{}"
        );
        for bad in ["/../etc/passwd", "/", "/a//b"] {
            let steps = Steps {
                files: vec![File {
                    path: bad,
                    content: b"",
                    mode: 0o644,
                }],
                ..Default::default()
            };
            assert!(write_files(d.path(), &steps).is_err(), "{bad}");
        }
    }
}
