//! The proxy itself: one listener per sandbox, on the loopback of the sandbox's own network
//! namespace or on the router address of a gVisor sandbox's router namespace (made there by a
//! thread of the node that enters the namespace for that one call), where the namespace's
//! nftables send every TCP connection that leaves. Each connection's
//! original destination comes from conntrack (`SO_ORIGINAL_DST`); its name, on ports 80 and
//! 443, from its first bytes. Allowed connections are dialled from the node and spliced; a
//! denied one is closed without a byte; one to a host whose rule sets headers is answered by the
//! proxy itself (see `intercept`). A rules update cuts the open connections the new rules deny.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

use super::ca::SandboxCa;
use super::intercept::{self, Interception, Job};
use super::peek::{self, Peeked};
use super::policy::{Rules, Verdict};
use crate::model::network::{Ranges, parse_cidr};
use crate::model::{Error, Result};

/// How long a connection may take to show its name.
const PEEK_FOR: Duration = Duration::from_secs(10);
/// How long a dial may take.
pub(super) const DIAL_FOR: Duration = Duration::from_secs(15);
/// Most connections one sandbox may have open through the proxy: each holds two of the node's
/// descriptors, and a sandbox must not be able to take them all.
pub const MAX_OPEN: usize = 1024;

/// Where allowed connections go, and what they may never reach.
#[derive(Debug, Default)]
pub struct Dialer {
    /// The node's blocked ranges (private, the host's own): never dialled, by address or name.
    blocked: Ranges,
    /// Names resolved here before DNS (an operator's internal names; the tests' servers).
    hosts: HashMap<String, Vec<Ipv4Addr>>,
}

impl Dialer {
    pub fn new(blocked: &[String], hosts: &[(String, Ipv4Addr)]) -> Dialer {
        let mut map: HashMap<String, Vec<Ipv4Addr>> = HashMap::new();
        for (name, ip) in hosts {
            map.entry(name.to_ascii_lowercase()).or_default().push(*ip);
        }
        Dialer {
            blocked: blocked.iter().filter_map(|c| parse_cidr(c)).collect(),
            hosts: map,
        }
    }

    fn is_blocked(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        self.blocked.iter().any(|&(a, b)| a <= ip && ip <= b)
    }

    async fn connect(&self, to: SocketAddrV4) -> io::Result<TcpStream> {
        if self.is_blocked(*to.ip()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{to} is out of every sandbox's reach"),
            ));
        }
        tokio::time::timeout(DIAL_FOR, TcpStream::connect(to))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "dial timed out"))?
    }

    /// Resolves `name` on the node (never at the address the sandbox asked for) and dials the
    /// first reachable address that is not blocked.
    async fn connect_name(&self, name: &str, port: u16) -> io::Result<TcpStream> {
        self.connect_name_where(name, port, &|_| true).await
    }

    /// `connect_name`, among the addresses `permit` allows.
    pub(super) async fn connect_name_where(
        &self,
        name: &str,
        port: u16,
        permit: &(dyn Fn(Ipv4Addr) -> bool + Send + Sync),
    ) -> io::Result<TcpStream> {
        let addrs: Vec<Ipv4Addr> = match self.hosts.get(name) {
            Some(a) => a.clone(),
            None => tokio::net::lookup_host((name, port))
                .await?
                .filter_map(|a| match a {
                    SocketAddr::V4(v4) => Some(*v4.ip()),
                    SocketAddr::V6(_) => None,
                })
                .collect(),
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{name} has no address"));
        for ip in addrs {
            if !permit(ip) {
                last = io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{name} is at {ip}, which the sandbox's rules deny"),
                );
                continue;
            }
            match self.connect(SocketAddrV4::new(ip, port)).await {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }
}

/// One open connection, as the rules judged it.
struct Open {
    name: Option<String>,
    dst: SocketAddrV4,
    abort: AbortHandle,
}

/// One sandbox's proxy.
struct Entry {
    port: u16,
    /// The CA intercepted connections are answered with.
    ca: Arc<SandboxCa>,
    rules: RwLock<Rules>,
    open: Mutex<HashMap<u64, Open>>,
    accept: AbortHandle,
}

impl Entry {
    fn rules(&self) -> Rules {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Open>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts what is open and no longer allowed.
    fn recheck(&self) {
        let rules = self.rules();
        let mut open = self.open();
        open.retain(|_, o| {
            let keep = rules.decide(o.name.as_deref(), *o.dst.ip()) != Verdict::Deny;
            if !keep {
                o.abort.abort();
            }
            keep
        });
    }
}

/// Every sandbox's proxy on this node, by instance id.
pub struct Proxies {
    dialer: Arc<Dialer>,
    interception: Arc<Interception>,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    /// Each instance's CA, made when first needed and kept while it lives (its sandbox trusts
    /// it even while its rules set no headers).
    cas: Mutex<HashMap<String, Arc<SandboxCa>>>,
}

impl Proxies {
    /// A node's proxies: `blocked` is never dialled, `hosts` are resolved before DNS, secrets
    /// come from `secrets`, and upstreams are verified against the system's roots and `trust`.
    pub fn new(
        blocked: &[String],
        hosts: &[(String, Ipv4Addr)],
        secrets: Option<Arc<crate::secrets::SecretStore>>,
        trust: &[String],
    ) -> Result<Proxies> {
        Ok(Proxies {
            dialer: Arc::new(Dialer::new(blocked, hosts)),
            interception: Arc::new(Interception::new(secrets, trust)?),
            entries: Mutex::new(HashMap::new()),
            cas: Mutex::new(HashMap::new()),
        })
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The instance's CA, made on first use.
    pub fn ca(&self, id: &str) -> Result<Arc<SandboxCa>> {
        let mut cas = self.cas.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ca) = cas.get(id) {
            return Ok(ca.clone());
        }
        let ca = Arc::new(SandboxCa::new(id)?);
        cas.insert(id.to_string(), ca.clone());
        Ok(ca)
    }

    /// Puts `rules` in force for the instance `id` whose connections arrive in the network
    /// namespace `netns` for the address `addr`, starting its proxy if it has none, and
    /// answers the port its connections go to.
    pub async fn ensure(
        &self,
        id: &str,
        netns: PathBuf,
        addr: Ipv4Addr,
        rules: Rules,
    ) -> Result<u16> {
        if let Some(e) = self.entries().get(id).cloned() {
            *e.rules.write().unwrap_or_else(|p| p.into_inner()) = rules;
            e.recheck();
            return Ok(e.port);
        }
        let listener = tokio::task::spawn_blocking(move || listen_in(netns, addr))
            .await
            .map_err(|e| Error::internal(format!("starting the egress proxy: {e}")))?
            .map_err(|e| Error::io("opening the egress proxy in the sandbox's network", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| Error::io("the egress proxy's port", e))?
            .port();
        let listener = TcpListener::from_std(listener)
            .map_err(|e| Error::io("the egress proxy's listener", e))?;
        let ca = self.ca(id)?;
        let mut entries = self.entries();
        if let Some(e) = entries.get(id) {
            // Another call got there first; its listener serves.
            return Ok(e.port);
        }
        let entry = Arc::new_cyclic(|weak: &std::sync::Weak<Entry>| {
            let weak = weak.clone();
            let dialer = self.dialer.clone();
            let interception = self.interception.clone();
            let accept = tokio::spawn(async move {
                let mut next = 0u64;
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let Some(entry) = weak.upgrade() else { return };
                    next += 1;
                    serve(entry, dialer.clone(), interception.clone(), stream, next);
                }
            })
            .abort_handle();
            Entry {
                port,
                ca,
                rules: RwLock::new(rules),
                open: Mutex::new(HashMap::new()),
                accept,
            }
        });
        entries.insert(id.to_string(), entry);
        Ok(port)
    }

    /// Stops the instance's proxy and cuts its connections, and forgets its CA: the instance
    /// is gone.
    pub fn forget_instance(&self, id: &str) {
        self.forget(id);
        self.cas
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }

    /// Stops the instance's proxy and cuts its connections.
    pub fn forget(&self, id: &str) {
        if let Some(e) = self.entries().remove(id) {
            e.accept.abort();
            for (_, o) in e.open().drain() {
                o.abort.abort();
            }
        }
    }
}

/// A listener on `addr` (a free port) inside the network namespace at `netns`. A thread of its
/// own enters the namespace, so no other work of the node ever runs there.
fn listen_in(netns: PathBuf, addr: Ipv4Addr) -> io::Result<std::net::TcpListener> {
    std::thread::spawn(move || {
        let ns = File::open(&netns)?;
        // SAFETY: setns on this thread only, with a descriptor we own.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let l = std::net::TcpListener::bind((addr, 0))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .join()
    .map_err(|_| io::Error::other("the thread entering the sandbox's network panicked"))?
}

/// Where the sandbox meant the connection to go, as conntrack kept it before the redirect.
fn original_destination(s: &TcpStream) -> io::Result<SocketAddrV4> {
    // SAFETY: an all-zero sockaddr_in is valid; getsockopt writes at most `len` bytes.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_IP,
            libc::SO_ORIGINAL_DST,
            (&mut addr as *mut libc::sockaddr_in).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
        u16::from_be(addr.sin_port),
    ))
}

/// Reads the connection's first bytes until they name it (or cannot).
async fn name_of(s: &mut TcpStream, port: u16, buf: &mut Vec<u8>) -> Option<String> {
    let judge = |b: &[u8]| match port {
        80 => peek::http_host(b),
        _ => peek::tls_server_name(b),
    };
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            match judge(buf) {
                Peeked::Name(n) => return Some(n),
                Peeked::Nameless => return None,
                Peeked::Incomplete => {}
            }
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(PEEK_FOR, read).await.ok().flatten()
}

/// Serves one connection on its own task, registered so that a rules update can cut it.
fn serve(
    entry: Arc<Entry>,
    dialer: Arc<Dialer>,
    interception: Arc<Interception>,
    mut stream: TcpStream,
    key: u64,
) {
    let Ok(dst) = original_destination(&stream) else {
        // Not redirected here (someone inside dialled the listener itself): nothing to serve.
        return;
    };
    if entry.open().len() >= MAX_OPEN {
        tracing::warn!(
            max = MAX_OPEN,
            "a sandbox has too many connections through the egress proxy; refusing one"
        );
        return;
    }
    let rules = entry.rules();
    let ca = entry.ca.clone();
    let weak = Arc::downgrade(&entry);
    // The task starts once it is registered, so that its own removal comes after.
    let (registered, wait) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let _ = wait.await;
        let mut buf = Vec::new();
        let name = if rules.reads_names() && matches!(dst.port(), 80 | 443) {
            name_of(&mut stream, dst.port(), &mut buf).await
        } else {
            None
        };
        if let Some(entry) = weak.upgrade()
            && let Some(o) = entry.open().get_mut(&key)
        {
            o.name = name.clone();
        }
        // Judged with the rules in force now (an update may have come while it was peeked).
        let rules = weak.upgrade().map(|e| e.rules()).unwrap_or(rules);
        let verdict = rules.decide(name.as_deref(), *dst.ip());
        let headers = name.as_deref().and_then(|n| rules.headers_for(n)).cloned();
        match (verdict, headers, name) {
            (Verdict::Deny, _, _) => {}
            (verdict, Some(headers), Some(host)) => {
                // Dialled by name: by an allowed name anywhere it resolves (but the blocked
                // ranges); else only where the rules would let the sandbox go itself.
                let by_name = matches!(verdict, Verdict::Name(_));
                let judge = rules.clone();
                let job = Job {
                    host: crate::model::domains::normalize_host(&host),
                    port: dst.port(),
                    tls: dst.port() == 443,
                    headers,
                    tenant: rules.tenant().to_string(),
                    dialer: dialer.clone(),
                    permit: Box::new(move |ip| by_name || judge.decide(None, ip) != Verdict::Deny),
                    shared: interception,
                };
                intercept::serve(crate::iox::Prefixed::new(buf, stream), job, &ca).await;
            }
            (verdict, _, _) => {
                let upstream = match verdict {
                    Verdict::Name(n) => dialer.connect_name(&n, dst.port()).await.ok(),
                    _ => dialer.connect(dst).await.ok(),
                };
                if let Some(mut up) = upstream
                    && up.write_all(&buf).await.is_ok()
                {
                    let _ = tokio::io::copy_bidirectional(&mut stream, &mut up).await;
                }
            }
        }
        if let Some(entry) = weak.upgrade() {
            entry.open().remove(&key);
        }
    });
    entry.open().insert(
        key,
        Open {
            name: None,
            dst,
            abort: task.abort_handle(),
        },
    );
    let _ = registered.send(());
}
