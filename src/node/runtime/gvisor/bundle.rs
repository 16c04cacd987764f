//! The OCI bundle of a gVisor sandbox: the template's root (runsc keeps the sandbox's writes
//! in an overlay in the sandbox's memory, so a checkpoint holds them), this
//! binary and the host libraries it links against bound in read-only (so the agent runs on
//! any image, whatever its libc), and the directory shared with the node for the sandbox's
//! door. The agent is the container's init.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxNamespaceBuilder, LinuxNamespaceType,
    Mount, MountBuilder, ProcessBuilder, RootBuilder, Spec,
};

use crate::model::{Error, Result};
use crate::sandbox::gvisor_init::RUN_DIR;

const BIN: &str = "/.sandbox-gateway/bin/sandbox-gateway";
const LIB: &str = "/.sandbox-gateway/lib";

/// What goes into one sandbox's bundle.
pub struct BundleSpec<'a> {
    pub root: &'a Path,
    pub agent: &'a Path,
    /// Host libraries the agent needs (its ELF loader among them).
    pub libs: &'a [PathBuf],
    pub loader: &'a Path,
    /// The host directory behind `RUN_DIR`.
    pub run_dir: &'a Path,
    pub hostname: &'a str,
    pub init_token: &'a str,
    pub memory_bytes: u64,
    pub cpu_count: u32,
    /// Processes and threads inside (the init holds what it starts to it).
    pub pids: u32,
    /// The network namespace to join (a holder's, for egress); None gives the sandbox a new,
    /// empty one.
    pub netns: Option<&'a Path>,
    /// What the sandbox runs beside envd (its template's services).
    pub services: &'a [crate::sandbox::services::Service],
    /// Volumes: a host directory (a view of the volume, see `views`) and where the sandbox
    /// sees it, read-write.
    pub volumes: &'a [(PathBuf, String)],
}

/// What root inside may hold: the container default that `crate::sandbox::seccomp` keeps for
/// the built-in runtime, less NET_RAW (gVisor offers no raw sockets unless asked to). The
/// Sentry enforces these; the host never sees them.
const CAPABILITIES: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Mknod,
    Capability::AuditWrite,
    Capability::Setfcap,
];

fn err(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("building the OCI bundle: {e}"))
}

fn bind(src: &Path, dst: &str, writable: bool) -> Result<Mount> {
    let mode = if writable { "rw" } else { "ro" };
    MountBuilder::default()
        .destination(dst)
        .typ("bind")
        .source(src)
        .options(
            ["rbind", mode, "nosuid", "nodev"]
                .map(str::to_string)
                .to_vec(),
        )
        .build()
        .map_err(err)
}

pub fn spec(b: &BundleSpec<'_>) -> Result<Spec> {
    let name = |p: &Path| {
        p.file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    };
    let loader = format!("{LIB}/{}", name(b.loader));
    let mut args: Vec<String> = vec![
        loader,
        "--library-path".into(),
        LIB.into(),
        BIN.into(),
        "agent".into(),
        "--gvisor-init".into(),
        "--memory-bytes".into(),
        b.memory_bytes.to_string(),
        "--cpu-count".into(),
        b.cpu_count.to_string(),
        "--pids".into(),
        b.pids.to_string(),
    ];
    if b.netns.is_some() {
        args.push("--egress".into());
    }
    for s in b.services {
        args.push("--service".into());
        args.push(s.name().into());
    }
    let caps: oci_spec::runtime::Capabilities = CAPABILITIES.iter().copied().collect();
    let capabilities = LinuxCapabilitiesBuilder::default()
        .bounding(caps.clone())
        .effective(caps.clone())
        .permitted(caps)
        .build()
        .map_err(err)?;
    let process = ProcessBuilder::default()
        .args(args)
        .env(vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            format!("SANDBOX_GATEWAY_ENVD_INIT_TOKEN={}", b.init_token),
        ])
        .cwd("/")
        .capabilities(capabilities)
        // gVisor's kernel runs the sandbox's processes with no_new_privs even when this is
        // false (sudo refuses there; the built-in runtime lets it reach the sandbox's root).
        .no_new_privileges(true)
        .build()
        .map_err(err)?;
    let mut mounts = oci_spec::runtime::get_default_mounts();
    mounts.push(bind(b.agent, BIN, false)?);
    for lib in b.libs {
        mounts.push(bind(lib, &format!("{LIB}/{}", name(lib)), false)?);
    }
    mounts.push(bind(b.run_dir, RUN_DIR, true)?);
    // gVisor's own cgroups, the container's group of each controller at /sys/fs/cgroup/NAME:
    // the init holds what it starts to the sandbox's pids there (`gvisor_init::limit_tasks`).
    mounts.push(
        MountBuilder::default()
            .destination("/sys/fs/cgroup")
            .typ("cgroup")
            .source("cgroup")
            .options(["nosuid", "nodev", "noexec"].map(String::from).to_vec())
            .build()
            .map_err(err)?,
    );
    for (source, target) in b.volumes {
        mounts.push(bind(source, target, true)?);
    }
    let namespaces = [
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Network,
    ]
    .into_iter()
    .map(|t| {
        let mut ns = LinuxNamespaceBuilder::default().typ(t);
        if let (LinuxNamespaceType::Network, Some(path)) = (t, b.netns) {
            ns = ns.path(path);
        }
        ns.build().map_err(err)
    })
    .collect::<Result<Vec<_>>>()?;
    let linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .build()
        .map_err(err)?;
    let mut spec = Spec::default();
    spec.set_process(Some(process));
    spec.set_root(Some(
        RootBuilder::default()
            .path(b.root)
            // Writable for the sandbox: runsc's overlay (--overlay2=root:memory) keeps every
            // write in the sandbox's memory and never touches the template.
            .readonly(false)
            .build()
            .map_err(err)?,
    ));
    spec.set_hostname(Some(b.hostname.to_string()));
    spec.set_mounts(Some(mounts));
    spec.set_linux(Some(linux));
    Ok(spec)
}

pub fn write(dir: &Path, spec: &Spec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating the bundle", e))?;
    let json = serde_json::to_vec_pretty(spec).map_err(err)?;
    crate::fsx::write_atomic(&dir.join("config.json"), &json)
        .map_err(|e| Error::io("writing the bundle", e))
}

/// Points the bundle's network namespace at `netns` (a new holder's, before each start).
pub fn join_netns(dir: &Path, netns: &Path) -> Result<()> {
    let path = dir.join("config.json");
    let mut spec = Spec::load(&path).map_err(err)?;
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    namespaces.retain(|n| n.typ() != LinuxNamespaceType::Network);
    namespaces.push(
        LinuxNamespaceBuilder::default()
            .typ(LinuxNamespaceType::Network)
            .path(netns)
            .build()
            .map_err(err)?,
    );
    linux.set_namespaces(Some(namespaces));
    spec.set_linux(Some(linux));
    write(dir, &spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_run_the_agent_through_its_own_loader() {
        let libs = [
            PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
            PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
        ];
        let s = spec(&BundleSpec {
            root: Path::new("/t/base/rootfs-plain"),
            agent: Path::new("/usr/bin/sandbox-gateway"),
            libs: &libs,
            loader: &libs[1],
            run_dir: Path::new("/d/run"),
            hostname: "sb-1",
            init_token: "tok",
            memory_bytes: 1 << 29,
            cpu_count: 1,
            pids: 64,
            netns: None,
            services: &[crate::sandbox::services::Service::CodeInterpreter],
            volumes: &[(PathBuf::from("/d/volumes/0"), "/mnt/work".into())],
        })
        .unwrap();
        let json = serde_json::to_value(&s).unwrap();
        let args = json["process"]["args"].as_array().unwrap();
        let n = args.len();
        assert_eq!(args[n - 2], "--service");
        assert_eq!(args[n - 1], "code-interpreter");
        assert_eq!(args[0], "/.sandbox-gateway/lib/ld-linux-x86-64.so.2");
        assert_eq!(args[3], BIN);
        assert!(
            json["process"]["env"]
                .to_string()
                .contains("SANDBOX_GATEWAY_ENVD_INIT_TOKEN=tok")
        );
        assert_eq!(json["root"]["readonly"], false);
        let mounts = json["mounts"].to_string();
        assert!(mounts.contains("/.sandbox-gateway/run") && mounts.contains("libc.so.6"));
        let volume = json["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["destination"] == "/mnt/work")
            .unwrap();
        assert_eq!(volume["source"], "/d/volumes/0");
        for opt in ["rw", "nosuid", "nodev"] {
            assert!(volume["options"].to_string().contains(opt), "{volume}");
        }
        assert_eq!(json["hostname"], "sb-1");
        let caps = json["process"]["capabilities"]["bounding"].to_string();
        assert!(caps.contains("CAP_CHOWN") && caps.contains("CAP_SETUID"));
        assert!(
            !caps.contains("CAP_SYS_ADMIN")
                && !caps.contains("CAP_NET_RAW")
                && !caps.contains("CAP_NET_ADMIN")
        );
        assert!(!args.iter().any(|a| a == "--egress"));
        let ns = json["linux"]["namespaces"].to_string();
        assert!(ns.contains("network") && !ns.contains("path"));
    }

    #[test]
    fn egress_bundles_join_the_holders_namespace() {
        let libs = [PathBuf::from("/lib64/ld-linux-x86-64.so.2")];
        let s = spec(&BundleSpec {
            root: Path::new("/r"),
            agent: Path::new("/a"),
            libs: &libs,
            loader: &libs[0],
            run_dir: Path::new("/d/run"),
            hostname: "sb-2",
            init_token: "t",
            memory_bytes: 1 << 29,
            cpu_count: 1,
            pids: 64,
            netns: Some(Path::new("/proc/42/ns/net")),
            services: &[],
            volumes: &[],
        })
        .unwrap();
        let json = serde_json::to_value(&s).unwrap();
        assert!(json["process"]["args"].to_string().contains("--egress"));
        let nets: Vec<_> = json["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["type"] == "network")
            .collect();
        assert_eq!(nets.len(), 1);
        assert_eq!(nets[0]["path"], "/proc/42/ns/net");
    }
}
