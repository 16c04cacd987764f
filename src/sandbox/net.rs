//! A sandbox's network namespace, set up by its supervisor (host root) so that the namespace
//! belongs to the host's user namespace: the sandbox's own root cannot change its interfaces,
//! routes or sysctls. `none` keeps loopback only; `egress` adds slirp4netns (user-mode
//! networking: no bridge, no host interface) and `prohibit` routes for every private and local
//! range and the host's own addresses, so the internet is reachable and the host is not.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

use super::spec::Net;
use crate::model::network::{self, parse_cidr};

/// Ranges no sandbox may reach, whatever else its policy says: "this network", private,
/// shared (carrier NAT), loopback, link-local, multicast and reserved IPv4 space. The host's
/// own addresses and the networks it is attached to are added at run time.
pub const ALWAYS_BLOCKED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
];
/// slirp4netns's fixed network: the sandbox is 10.0.2.100, its gateway 10.0.2.2 (with host
/// loopback forwarding disabled) and its resolver 10.0.2.3.
pub const SLIRP_DNS: &str = "10.0.2.3";
const SLIRP_SUBNET: &str = "10.0.2.0/24";

/// A gVisor sandbox's own network, between its namespace and the router namespace where
/// slirp4netns serves (see `crate::sandbox::netholder`): the router's end of the veth pair, its
/// address (the sandbox's gateway, where the egress proxy listens), and the sandbox's end.
pub const ROUTER_DEVICE: &str = "vsb0";
pub const ROUTER_ADDR: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 0, 3, 1);
const ROUTED_DEVICE: &str = "eth0";
const ROUTED_ADDR: &str = "10.0.3.100/24";
/// slirp4netns's, and so every link's, MTU.
const MTU: u32 = 65520;

const SLIRP_READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Equips the calling process's new network namespace for `net`: loopback and sysctls, and
/// for egress slirp4netns (started in `host_netns`) with the blocked ranges out of reach.
/// The returned slirp4netns lives as long as the value.
pub fn equip(
    net: Net,
    slirp4netns: Option<&Path>,
    blocked: &[String],
    host_netns: &File,
) -> io::Result<Option<Slirp>> {
    let ctx =
        |what: &'static str| move |e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    setup_namespace().map_err(ctx("setting up the network namespace"))?;
    match net {
        Net::None => Ok(None),
        Net::Egress => {
            let program =
                slirp4netns.ok_or_else(|| io::Error::other("net egress needs slirp4netns"))?;
            let slirp = start_slirp(program, host_netns, SLIRP_READY_TIMEOUT)
                .map_err(ctx("starting slirp4netns"))?;
            block_routes(blocked).map_err(ctx("keeping private ranges out of reach"))?;
            Ok(Some(slirp))
        }
    }
}

/// Brings loopback up and lets the sandbox bind low ports and ping: both are per-namespace
/// sysctls that only the host can write, and neither reaches outside the namespace.
pub fn setup_namespace() -> io::Result<()> {
    loopback_up()?;
    std::fs::write("/proc/sys/net/ipv4/ip_unprivileged_port_start", "0")?;
    std::fs::write("/proc/sys/net/ipv4/ping_group_range", "0 2147483647")?;
    Ok(())
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket call; the descriptor is owned right after.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: an all-zero ifreq is valid; the name is set below.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we pass.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A running slirp4netns; it exits by itself when the supervisor's end of its exit pipe
/// closes, and is killed when dropped.
pub struct Slirp {
    child: Child,
    _exit_write: OwnedFd,
}

impl Drop for Slirp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds is a valid array of two ints.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors are fresh and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

const SLIRP_READY_FD: RawFd = 3;
const SLIRP_EXIT_FD: RawFd = 4;

/// Starts slirp4netns in the host's network namespace (`host_netns`), attached to ours, and
/// waits until it has configured `tap0` with an address, a default route and DNS.
pub fn start_slirp(program: &Path, host_netns: &File, timeout: Duration) -> io::Result<Slirp> {
    let (ready_read, ready_write) = pipe()?;
    let (exit_read, exit_write) = pipe()?;
    let netns_path = format!("/proc/{}/ns/net", std::process::id());
    let mut cmd = Command::new(program);
    cmd.args([
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
    ])
    .arg(format!("--ready-fd={SLIRP_READY_FD}"))
    .arg(format!("--exit-fd={SLIRP_EXIT_FD}"))
    .args(["--netns-type=path", &netns_path, "tap0"])
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    let host = host_netns.as_raw_fd();
    let (rw, er) = (ready_write.as_raw_fd(), exit_read.as_raw_fd());
    // SAFETY: the supervisor is single-threaded; the closure only makes system calls on
    // descriptors prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(host, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::dup2(rw, SLIRP_READY_FD) < 0 || libc::dup2(er, SLIRP_EXIT_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    drop(ready_write);
    drop(exit_read);
    let mut slirp = Slirp {
        child,
        _exit_write: exit_write,
    };
    let deadline = Instant::now() + timeout;
    let mut ready = File::from(ready_read);
    let mut pfd = libc::pollfd {
        fd: ready.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::other("slirp4netns did not become ready in time"));
        }
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        break;
    }
    let mut byte = [0u8; 1];
    match ready.read(&mut byte) {
        Ok(1) => Ok(slirp),
        _ => {
            let status = slirp.child.try_wait().ok().flatten();
            Err(io::Error::other(format!(
                "slirp4netns exited before it was ready ({status:?})"
            )))
        }
    }
}

/// Makes every blocked range unroutable. A `prohibit` route is more specific than the default
/// route through tap0, so packets to these ranges fail at once with EACCES; slirp's own
/// subnet (gateway and resolver) stays reachable as the more specific connected route.
pub fn block_routes(blocked: &[String]) -> io::Result<()> {
    let mut batch = String::new();
    for cidr in blocked {
        if cidr == SLIRP_SUBNET {
            continue;
        }
        batch.push_str(&format!("route replace prohibit {cidr}\n"));
    }
    // IPv6 never reaches out (slirp4netns runs without it), but say so in the table too.
    batch.push_str("route replace prohibit ::/0\n");
    ip_batch(&batch)
}

/// Links the calling process's namespace, equipped for egress, as a router to the namespace
/// `routed` (a gVisor sandbox's, which has loopback only so far): a veth pair between them and
/// forwarding on; `equip_routed`, run in `routed`, does the other end. The router answers ARP
/// for the routed address on slirp4netns's side, so slirp's replies find their way back
/// without address translation.
pub fn link_router(routed: &File) -> io::Result<()> {
    // `ip` finds the namespace as its own inherited descriptor.
    let flags = fcntl(routed, FcntlArg::F_GETFD)?;
    let mut flags = FdFlag::from_bits_truncate(flags);
    flags.remove(FdFlag::FD_CLOEXEC);
    fcntl(routed, FcntlArg::F_SETFD(flags))?;
    ip_batch(&format!(
        "link add {ROUTER_DEVICE} mtu {MTU} type veth peer name {ROUTED_DEVICE} mtu {MTU} netns /proc/self/fd/{}\n\
         addr add {ROUTER_ADDR}/24 dev {ROUTER_DEVICE}\n\
         link set {ROUTER_DEVICE} up\n",
        routed.as_raw_fd()
    ))?;
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")?;
    std::fs::write("/proc/sys/net/ipv4/conf/tap0/proxy_arp", "1")
}

/// Gives the calling process's namespace (linked by `link_router`) its address and routes.
pub fn equip_routed(blocked: &[String]) -> io::Result<()> {
    ip_batch(&routes_in_routed(blocked))
}

/// The routed namespace's address and routes: to everything but the blocked ranges, and to
/// slirp's resolver, through the router. gVisor copies a namespace's routes into its own
/// network stack when the sandbox starts but has no use for `prohibit` routes, so there the
/// blocked ranges must be absent instead: with no route, a connection to them fails inside the
/// sandbox (and the router's own `prohibit` routes would turn it away again).
fn routes_in_routed(blocked: &[String]) -> String {
    let mut batch = format!(
        "addr add {ROUTED_ADDR} dev {ROUTED_DEVICE}\nlink set {ROUTED_DEVICE} up\nroute replace {SLIRP_DNS}/32 via {ROUTER_ADDR} dev {ROUTED_DEVICE}\n"
    );
    for cidr in allowed_prefixes(blocked) {
        batch.push_str(&format!(
            "route replace {cidr} via {ROUTER_ADDR} dev {ROUTED_DEVICE}\n"
        ));
    }
    batch
}

fn ip_batch(batch: &str) -> io::Result<()> {
    let mut child = Command::new("ip")
        .args(["-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(batch.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "ip -batch failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// The IPv4 space outside `blocked`, as the fewest CIDR prefixes (entries that are not IPv4
/// prefixes are ignored).
pub fn allowed_prefixes(blocked: &[String]) -> Vec<String> {
    let ranges = network::merge(blocked.iter().filter_map(|c| parse_cidr(c)).collect());
    network::prefixes(&network::complement(&ranges))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn covered(prefixes: &[String], ip: &str) -> bool {
        let ip = u32::from(ip.parse::<std::net::Ipv4Addr>().expect("address"));
        prefixes
            .iter()
            .filter_map(|p| parse_cidr(p))
            .any(|(a, b)| a <= ip && ip <= b)
    }

    #[test]
    fn nothing_blocked_allows_everything_in_one_prefix() {
        assert_eq!(allowed_prefixes(&[]), strings(&["0.0.0.0/0"]));
    }

    #[test]
    fn one_half_blocked_leaves_the_other() {
        assert_eq!(
            allowed_prefixes(&strings(&["0.0.0.0/1"])),
            strings(&["128.0.0.0/1"])
        );
        assert_eq!(
            allowed_prefixes(&strings(&["128.0.0.0/1"])),
            strings(&["0.0.0.0/1"])
        );
    }

    #[test]
    fn the_allowed_space_and_the_blocked_space_partition_ipv4() {
        let mut blocked = strings(ALWAYS_BLOCKED);
        blocked.extend(strings(&[
            "203.0.113.7/32",
            "198.51.100.0/24",
            "not-a-prefix",
            "::/0",
        ]));
        let allowed = allowed_prefixes(&blocked);
        let size = |p: &String| {
            let (a, b) = parse_cidr(p).expect("prefix");
            b as u64 - a as u64 + 1
        };
        let mut all: Vec<(u32, u32)> = allowed
            .iter()
            .chain(blocked.iter())
            .filter_map(|p| parse_cidr(p))
            .collect();
        all.sort_unstable();
        for w in all.windows(2) {
            assert!(w[0].1 < w[1].0, "overlap between {:?} and {:?}", w[0], w[1]);
        }
        let total: u64 = allowed.iter().map(size).sum::<u64>()
            + blocked
                .iter()
                .filter(|p| parse_cidr(p).is_some())
                .map(size)
                .sum::<u64>();
        assert_eq!(total, 1u64 << 32);
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "151.101.2.132",
            "203.0.113.8",
            "223.255.255.255",
        ] {
            assert!(covered(&allowed, ip), "{ip} should be reachable");
        }
        for ip in [
            "10.1.2.3",
            "127.0.0.1",
            "169.254.169.254",
            "172.20.0.1",
            "192.168.1.1",
            "203.0.113.7",
            "198.51.100.9",
            "100.64.0.1",
            "224.0.0.1",
            "0.1.2.3",
        ] {
            assert!(!covered(&allowed, ip), "{ip} should be unreachable");
        }
    }

    #[test]
    fn a_routed_namespace_reaches_the_resolver_and_the_allowed_space_through_the_router() {
        let batch = routes_in_routed(&strings(&["0.0.0.0/1", "10.0.0.0/8"]));
        let lines: Vec<&str> = batch.lines().collect();
        assert_eq!(lines[0], "addr add 10.0.3.100/24 dev eth0");
        assert!(lines.contains(&"route replace 10.0.2.3/32 via 10.0.3.1 dev eth0"));
        assert!(lines.contains(&"route replace 128.0.0.0/1 via 10.0.3.1 dev eth0"));
        // No default route, and nothing else of the blocked space.
        assert_eq!(
            lines.iter().filter(|l| l.contains(" via ")).count(),
            2,
            "{batch}"
        );
    }

    #[test]
    fn bare_addresses_and_bad_prefixes_parse_as_expected() {
        assert_eq!(parse_cidr("1.2.3.4"), Some((0x01020304, 0x01020304)));
        assert_eq!(parse_cidr("1.2.3.4/24"), Some((0x01020300, 0x010203ff)));
        assert_eq!(parse_cidr("1.2.3.4/33"), None);
        assert_eq!(parse_cidr("::/0"), None);
    }
}
