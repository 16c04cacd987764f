//! The container image (deploy/image/Containerfile) is built the way an operator without a
//! Docker engine builds it: Debian's `buildah` (vfs storage, chroot isolation, as root), from a
//! Debian bookworm base that mmdebstrap makes here (docker.io is not reachable; the
//! Containerfile's `BASE` argument names it). Then, inside the built image, every tool a node
//! calls is present and runs, the binary's shared libraries resolve, and the binary answers as
//! both node and gateway. All of buildah's storage lives in a temporary directory, removed at
//! the end.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// buildah with its storage (and run state) under `dir`.
struct Buildah {
    root: PathBuf,
    run: PathBuf,
}

impl Buildah {
    fn new(dir: &Path) -> Buildah {
        Buildah {
            root: dir.join("storage"),
            run: dir.join("run"),
        }
    }

    /// `buildah <args>` on this storage.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("buildah");
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--runroot")
            .arg(&self.run)
            .args(["--storage-driver", "vfs"])
            .args(args);
        cmd
    }

    /// Runs buildah with `args`; answers its stdout, or fails the test with its output.
    fn ok(&self, args: &[&str]) -> String {
        let out = self
            .command(args)
            .output()
            .expect("buildah runs (Debian's `buildah`; .ci/run installs it)");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "buildah {args:?}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

impl Drop for Buildah {
    fn drop(&mut self) {
        // Containers first (they hold mounts), then the images; the directory goes with the
        // test's temporary directory.
        for args in [&["rm", "--all"][..], &["rmi", "--all", "--force"]] {
            let _ = self.command(args).output();
        }
    }
}

#[test]
fn the_image_builds_without_a_docker_engine_and_holds_what_a_node_runs() {
    let tmp = tempfile::Builder::new()
        .prefix("sgw-image-")
        .tempdir()
        .expect("tmp");
    let b = Buildah::new(tmp.path());

    // A Debian bookworm base, as `debian:bookworm-slim` would be.
    let base_tar = tmp.path().join("base.tar");
    let made = Command::new("mmdebstrap")
        .args([
            "--variant=apt",
            "--include=ca-certificates",
            "--quiet",
            "bookworm",
        ])
        .arg(&base_tar)
        .output()
        .expect("mmdebstrap runs");
    assert!(
        made.status.success(),
        "mmdebstrap: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    let ctr = b.ok(&["from", "scratch"]).trim().to_string();
    b.ok(&["add", &ctr, &base_tar.display().to_string(), "/"]);
    b.ok(&["commit", "--quiet", &ctr, "localhost/debian-base:bookworm"]);

    // The build context the Containerfile asks for: the binary and the runsc installer.
    let ctx = tmp.path().join("ctx");
    std::fs::create_dir_all(&ctx).expect("ctx");
    std::fs::copy(BIN, ctx.join("sandbox-gateway")).expect("the binary");
    std::fs::copy(
        repo().join("deploy/install-runsc.sh"),
        ctx.join("install-runsc.sh"),
    )
    .expect("the runsc installer");
    let containerfile = repo().join("deploy/image/Containerfile");
    b.ok(&[
        "bud",
        "--isolation",
        "chroot",
        "--quiet",
        "--build-arg",
        "BASE=localhost/debian-base:bookworm",
        "-f",
        &containerfile.display().to_string(),
        "-t",
        "localhost/sandbox-gateway:test",
        &ctx.display().to_string(),
    ]);

    let config = b.ok(&[
        "inspect",
        "--type",
        "image",
        "--format",
        "{{.OCIv1.Config.Entrypoint}}",
        "localhost/sandbox-gateway:test",
    ]);
    assert_eq!(config.trim(), "[/usr/local/bin/sandbox-gateway]");

    // Inside the image: each tool the node calls (runtime/, templates/, sandbox/, volumes/)
    // is on PATH and runs, and the binary's libraries resolve.
    let ctr = b
        .ok(&["from", "localhost/sandbox-gateway:test"])
        .trim()
        .to_string();
    let script = r#"
set -e
for tool in sandbox-gateway mmdebstrap runsc slirp4netns ip nft unshare mkfs.ext4 cp sleep ldd; do
    printf '%s=%s\n' "$tool" "$(command -v "$tool")"
done
echo "gateway: $(sandbox-gateway --version)"
sandbox-gateway node --help | grep -q -- '--pool' && echo "node help: ok"
sandbox-gateway serve --help | grep -q -- '--e2b-listen' && echo "serve help: ok"
echo "runsc: $(runsc --version | head -1)"
echo "mmdebstrap: $(mmdebstrap --version)"
echo "slirp4netns: $(slirp4netns --version | head -1)"
echo "nft: $(nft --version)"
echo "ip: $(ip -V)"
echo "mkfs: $(mkfs.ext4 -V 2>&1 | head -1)"
echo "certs: $(ls /etc/ssl/certs | wc -l)"
if ldd /usr/local/bin/sandbox-gateway | grep -q 'not found'; then echo "ldd: missing"; else echo "ldd: ok"; fi
"#;
    let out = b.ok(&[
        "run",
        "--isolation",
        "chroot",
        &ctr,
        "--",
        "sh",
        "-c",
        script,
    ]);
    for tool in [
        "sandbox-gateway",
        "mmdebstrap",
        "runsc",
        "slirp4netns",
        "ip",
        "nft",
        "unshare",
        "mkfs.ext4",
        "cp",
        "sleep",
        "ldd",
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{tool}=")))
            .unwrap_or_else(|| panic!("no line for {tool}:\n{out}"));
        assert!(
            line.len() > tool.len() + 2,
            "{tool} is not in the image:\n{out}"
        );
    }
    let version = env!("CARGO_PKG_VERSION");
    for expected in [
        format!("gateway: sandbox-gateway {version}"),
        "node help: ok".into(),
        "serve help: ok".into(),
        "runsc: runsc version 0.0~20240729".into(),
        "mmdebstrap: mmdebstrap ".into(),
        "slirp4netns: slirp4netns version".into(),
        "nft: nftables v".into(),
        "ip: ip utility".into(),
        "mkfs: mke2fs ".into(),
        "ldd: ok".into(),
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(&expected)),
            "{expected:?} is not in:\n{out}"
        );
    }
    let certs: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("certs: "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(certs > 100, "CA certificates: {certs}\n{out}");
}
