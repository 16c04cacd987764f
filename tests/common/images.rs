//! Images for the tests: an archive as `docker save` writes it, made here from the test
//! template's own tree, and a real registry (Debian's `docker-registry`) that `skopeo` pushes
//! it to, plain or behind TLS and a password.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sandbox_gateway::node::config::DEFAULT_UID_BASE;

use super::{free_port, templates_dir};

fn sh(cmd: &str) {
    let ok = Command::new("bash")
        .args(["-c", cmd])
        .status()
        .unwrap()
        .success();
    assert!(ok, "{cmd}");
}

/// An image archive as `docker save` writes it: the test template's tree (ids moved back to
/// the image's own, the large runtimes left out) as layer 1, and a layer 2 that adds, replaces and whites out files. Its
/// config sets `IMPORTED=yes` and the working directory `/opt`.
pub fn make_image(dir: &Path) -> PathBuf {
    let rootfs = templates_dir().join("base/rootfs");
    std::fs::create_dir_all(dir.join("l1")).unwrap();
    std::fs::create_dir_all(dir.join("l2/opt/a")).unwrap();
    std::fs::create_dir_all(dir.join("extra/opt/a")).unwrap();
    // Map the template's shifted ids back to image ids for tar.
    let map: String = [0u32, 5, 100, 1000, 65534]
        .iter()
        .map(|i| format!("+{} u{i}:{i}\n", DEFAULT_UID_BASE + i))
        .collect();
    std::fs::write(dir.join("ids.map"), map).unwrap();
    std::fs::write(dir.join("extra/opt/a/old.txt"), "old").unwrap();
    std::fs::write(dir.join("extra/opt/keep.txt"), "keep").unwrap();
    std::fs::write(dir.join("l2/opt/a/new.txt"), "new").unwrap();
    std::fs::write(dir.join("l2/opt/a/.wh..wh..opq"), "").unwrap();
    std::fs::write(dir.join("l2/opt/.wh.keep.txt"), "").unwrap();
    let d = dir.display();
    // Without what these tests never run (node, python, git, ICU data), so that pushing and
    // pulling it takes seconds.
    let slim = [
        "./usr/share/nodejs",
        "./usr/lib/x86_64-linux-gnu/libnode*",
        "./usr/lib/x86_64-linux-gnu/libicu*",
        "./usr/lib/x86_64-linux-gnu/perl",
        "./usr/lib/x86_64-linux-gnu/*.a",
        "./usr/lib/python3*",
        "./usr/lib/git-core",
        "./usr/share/doc",
        "./usr/share/perl",
    ]
    .map(|p| format!("--exclude='{p}'"))
    .join(" ");
    sh(&format!(
        "tar --owner-map={d}/ids.map --group-map={d}/ids.map {slim} -cf {d}/l1/layer.tar -C {} . \
         && tar --numeric-owner -rf {d}/l1/layer.tar -C {d}/extra ./opt \
         && tar --numeric-owner -cf {d}/l2/layer.tar -C {d}/l2 ./opt",
        rootfs.display()
    ));
    // The config names each layer by the digest of its tar (registries' clients check it).
    let diff_ids: Vec<String> = ["l1", "l2"]
        .iter()
        .map(|l| {
            let out = Command::new("sha256sum")
                .arg(dir.join(l).join("layer.tar"))
                .output()
                .unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            format!("\"sha256:{}\"", text.split_whitespace().next().unwrap())
        })
        .collect();
    std::fs::write(
        dir.join("config.json"),
        format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin","IMPORTED=yes"],"WorkingDir":"/opt"}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
            diff_ids.join(",")
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("manifest.json"),
        r#"[{"Config":"config.json","RepoTags":["test:1"],"Layers":["l1/layer.tar","l2/layer.tar"]}]"#,
    )
    .unwrap();
    let image = dir.join("image.tar");
    sh(&format!(
        "tar -cf {} -C {d} manifest.json config.json l1/layer.tar l2/layer.tar",
        image.display()
    ));
    image
}

/// A `docker-registry` on a loopback port, stopped when dropped.
pub struct Registry {
    /// `host:port` as image references name it.
    pub addr: String,
    creds: Option<(String, String)>,
    proc: Child,
}

impl Registry {
    /// A registry storing under `dir`: plain HTTP on 127.0.0.1, or with `tls` (certificate
    /// and key PEM, for `localhost`) and `creds` (its only user) on localhost.
    pub fn start(dir: &Path, tls: Option<&(String, String)>, creds: Option<(&str, &str)>) -> Self {
        std::fs::create_dir_all(dir.join("storage")).unwrap();
        let port = free_port();
        let host = if tls.is_some() {
            "localhost"
        } else {
            "127.0.0.1"
        };
        let mut config = format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.join("storage").display()
        );
        if let Some((cert, key)) = tls {
            std::fs::write(dir.join("cert.pem"), cert).unwrap();
            std::fs::write(dir.join("key.pem"), key).unwrap();
            config.push_str(&format!(
                "  tls:\n    certificate: {d}/cert.pem\n    key: {d}/key.pem\n",
                d = dir.display()
            ));
        }
        if let Some((user, password)) = creds {
            sh(&format!(
                "htpasswd -Bbn {user} {password} > {}/htpasswd",
                dir.display()
            ));
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: tests\n    path: {}/htpasswd\n",
                dir.display()
            ));
        }
        std::fs::write(dir.join("config.yml"), config).unwrap();
        let proc = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::null())
            // It logs every 404 of a push's existence checks, even at level error.
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry (Debian's package) runs");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            addr: format!("{host}:{port}"),
            creds: creds.map(|(u, p)| (u.to_string(), p.to_string())),
            proc,
        }
    }

    /// Pushes the `docker save` archive `archive` as `name` (`repo:tag`) with skopeo.
    pub fn push(&self, archive: &Path, name: &str) {
        let mut cmd = Command::new("skopeo");
        cmd.args(["copy", "-q", "--dest-tls-verify=false"]);
        if let Some((u, p)) = &self.creds {
            cmd.arg(format!("--dest-creds={u}:{p}"));
        }
        let out = cmd
            .arg(format!("docker-archive:{}", archive.display()))
            .arg(format!("docker://{}/{name}", self.addr))
            .output()
            .expect("skopeo (Debian's package) runs");
        assert!(
            out.status.success(),
            "skopeo copy to {}/{name}: {}",
            self.addr,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}
