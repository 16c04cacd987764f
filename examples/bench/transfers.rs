//! File transfers through the gateway's data plane (envd's `/files`) against a raw loopback
//! TCP copy of the same bytes, and the gateway's memory during a large upload.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use sandbox_gateway::node::runtime::dial::Dialer;
use sandbox_gateway::sandbox::spec::ENVD_ABSTRACT_SOCKET;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::claims::wait_gateway_warm;
use crate::commands::{e2b_create_sandbox, host_port};
use crate::common::*;
use crate::envd::{Body, Envd, Via, check, node_record};

const MIB: u64 = 1 << 20;

/// A 1 MiB block of bytes that does not compress, shared by every chunk.
fn block() -> Bytes {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let v: Vec<u8> = (0..MIB)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    Bytes::from(v)
}

/// `mib` MiB as a streamed request body.
fn body_of(block: &Bytes, mib: u64) -> Body {
    let chunks = (0..mib).map({
        let b = block.clone();
        move |_| Ok::<_, std::io::Error>(Frame::data(b.clone()))
    });
    StreamBody::new(futures::stream::iter(chunks)).boxed_unsync()
}

/// `mib` MiB written to one loopback TCP socket and read from its peer in the bench.
async fn raw_copy(block: &Bytes, mib: u64) -> Res<Duration> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let t = Instant::now();
    let reader = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut n = 0u64;
        loop {
            let k = s.read(&mut buf).await?;
            if k == 0 {
                return Ok::<u64, std::io::Error>(n);
            }
            n += k as u64;
        }
    });
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.set_nodelay(true)?;
    for _ in 0..mib {
        s.write_all(block).await?;
    }
    s.shutdown().await?;
    let got = reader.await??;
    let took = t.elapsed();
    if got != mib * MIB {
        return Err(format!("the raw copy moved {got} bytes").into());
    }
    Ok(took)
}

/// A relay of the bench's own, the least any proxy does: each connection to `127.0.0.1:port`
/// is joined to a new connection to the agent's Unix socket in the sandbox's network
/// namespace (as the gateway's embedded node dials it), and a blocking thread per direction
/// copies bytes in reads of up to 1 MiB. No HTTP, no checks, no event loop; it bounds what a
/// proxy can reach on this machine.
async fn bare_relay(dialer: Arc<Dialer>, supervisor: i32) -> Res<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let netns = std::path::PathBuf::from(format!("/proc/{supervisor}/ns/net"));
            let Ok(agent) = dialer.connect_abstract(netns, ENVD_ABSTRACT_SOCKET).await else {
                continue;
            };
            let (Ok(client), Ok(agent)) = (client.into_std(), agent.into_std()) else {
                continue;
            };
            let _ = client.set_nodelay(true);
            let _ = client.set_nonblocking(false);
            let _ = agent.set_nonblocking(false);
            let (Ok(client2), Ok(agent2)) = (client.try_clone(), agent.try_clone()) else {
                continue;
            };
            std::thread::spawn(move || pump(client, agent));
            std::thread::spawn(move || pump(agent2, client2));
        }
    });
    Ok(addr)
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side.
fn pump<F: std::io::Read, T: std::io::Write + HalfClose>(mut from: F, mut to: T) {
    let mut buf = vec![0u8; MIB as usize];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    to.half_close();
}

trait HalfClose {
    fn half_close(&self);
}

impl HalfClose for std::net::TcpStream {
    fn half_close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl HalfClose for std::os::unix::net::UnixStream {
    fn half_close(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

pub struct Transfers {
    pub mib: u64,
    pub runs: usize,
    pub disk_mib: u64,
    pub raw: Duration,
    pub gw_up: Duration,
    pub gw_down: Duration,
    pub relay_up: Duration,
    pub relay_down: Duration,
    pub direct_up: Duration,
    pub direct_down: Duration,
    pub big_mib: u64,
    pub big_took: Duration,
    /// The gateway's RSS once the sandbox exists, before any transfer.
    pub rss_start: u64,
    pub rss_before: u64,
    pub rss_peak: u64,
    pub rss_after: u64,
    /// How many times the RSS was read during the large upload.
    pub rss_samples: u64,
}

fn vm_rss(pid: i32) -> u64 {
    rss_pss(pid).0
}

async fn up(envd: &mut Envd, path: &str, block: &Bytes, mib: u64) -> Res<Duration> {
    let t = Instant::now();
    envd.upload(path, mib * MIB, body_of(block, mib)).await?;
    Ok(t.elapsed())
}

async fn down(envd: &mut Envd, path: &str, mib: u64) -> Res<Duration> {
    let t = Instant::now();
    let n = envd.download(path).await?;
    let took = t.elapsed();
    if n != mib * MIB {
        return Err(format!("downloaded {n} bytes of {path}").into());
    }
    Ok(took)
}

/// `runs` rounds of a `mib` MiB upload and download through the gateway and directly against
/// the agent, beside a raw loopback copy; then one `big_mib` upload through the gateway while
/// the gateway's RSS is sampled.
pub async fn bench_transfers(mib: u64, runs: usize, big_mib: u64) -> Res<Transfers> {
    let disk_mib = ((big_mib + 2 * mib) * 2).next_multiple_of(1024);
    let gw = Daemon::gateway_with(
        &["base/egress=1".to_string()],
        &["--sandbox-disk-mib".to_string(), disk_mib.to_string()],
    )?;
    let http = reqwest::Client::new();
    wait_gateway_warm(&gw, 1).await?;
    let sb = e2b_create_sandbox(&http, &gw.address).await?;
    let (node, fleet) = gw.embedded_node()?;
    let rec = node_record(&node, &fleet, &sb.id).await?;
    let supervisor = processes_of(Path::new(&rec.state_dir))?
        .supervisor()
        .ok_or("the sandbox's supervisor was not found")?;
    let mut gateway = Envd::new(Via::Gateway {
        addr: host_port(&gw.address),
        id: sb.id.clone(),
        token: sb.jwt.clone(),
    });
    let dialer = Arc::new(Dialer::new()?);
    let mut direct = Envd::new(Via::Netns {
        pid: supervisor,
        token: rec.token.clone(),
        dialer: dialer.clone(),
    });
    let mut relay = Envd::new(Via::Plain {
        addr: bare_relay(dialer, supervisor).await?,
        token: rec.token.clone(),
    });
    gateway.connect().await?;
    direct.connect().await?;
    relay.connect().await?;
    let pid = gw.pid();
    let rss_start = vm_rss(pid);
    let block = block();
    // One uncounted round warms the page cache, the disk's allocation and the connections.
    raw_copy(&block, mib).await?;
    up(&mut gateway, "/home/user/gw.bin", &block, mib).await?;
    down(&mut gateway, "/home/user/gw.bin", mib).await?;
    up(&mut direct, "/home/user/direct.bin", &block, mib).await?;
    down(&mut direct, "/home/user/direct.bin", mib).await?;
    up(&mut relay, "/home/user/relay.bin", &block, mib).await?;
    down(&mut relay, "/home/user/relay.bin", mib).await?;
    let mut t: [Vec<Duration>; 7] = Default::default();
    for _ in 0..runs {
        t[0].push(raw_copy(&block, mib).await?);
        t[1].push(up(&mut gateway, "/home/user/gw.bin", &block, mib).await?);
        t[2].push(down(&mut gateway, "/home/user/gw.bin", mib).await?);
        t[3].push(up(&mut direct, "/home/user/direct.bin", &block, mib).await?);
        t[4].push(down(&mut direct, "/home/user/direct.bin", mib).await?);
        t[5].push(up(&mut relay, "/home/user/relay.bin", &block, mib).await?);
        t[6].push(down(&mut relay, "/home/user/relay.bin", mib).await?);
    }
    check(
        &mut direct,
        "rm -f /home/user/gw.bin /home/user/direct.bin /home/user/relay.bin && sync",
    )
    .await?;

    // The large upload, with the gateway's RSS sampled every 5 ms on a thread of its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = vm_rss(pid);
    let peak = Arc::new(AtomicU64::new(rss_before));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, stop) = (peak.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                peak.fetch_max(vm_rss(pid), Ordering::Relaxed);
                n += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
            n
        })
    };
    let big = up(&mut gateway, "/home/user/big.bin", &block, big_mib).await;
    stop.store(true, Ordering::Relaxed);
    let rss_samples = sampler.join().unwrap_or(0);
    let big_took = big?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_after = vm_rss(pid);
    let size = check(&mut direct, "stat -c %s /home/user/big.bin").await?;
    if size.trim() != (big_mib * MIB).to_string() {
        return Err(format!("the large upload left a file of {} bytes", size.trim()).into());
    }
    drop((gateway, direct, relay));
    gw.stop();
    let [
        raw,
        gw_up,
        gw_down,
        direct_up,
        direct_down,
        relay_up,
        relay_down,
    ] = t.map(median);
    Ok(Transfers {
        mib,
        runs,
        disk_mib,
        raw,
        gw_up,
        gw_down,
        relay_up,
        relay_down,
        direct_up,
        direct_down,
        big_mib,
        big_took,
        rss_start,
        rss_before,
        rss_peak: peak.load(Ordering::Relaxed),
        rss_after,
        rss_samples,
    })
}

pub fn throughput(mib: u64, d: Duration) -> f64 {
    mib as f64 / d.as_secs_f64().max(1e-9)
}

pub fn render(o: &mut String, t: &Transfers) {
    let _ = writeln!(o, "## Transfers\n");
    let _ = writeln!(
        o,
        "Method: `sandbox-gateway serve` with its embedded node started with \
         `--sandbox-disk-mib {}` (every sandbox's disk image holds the large upload twice \
         over); one sandbox created through e2b, which gives the `small` tier (1 CPU, 512 MiB; \
         e2b creates pick no tier): {} MiB fit in its page cache, the large upload does not, \
         so that one also waits on writeback to the sandbox's disk. Uploads are envd's \
         `POST /files?path=` with an `application/octet-stream` body of {} MiB (a 1 MiB block \
         that does not compress, streamed in 1 MiB chunks, with its length), downloads \
         `GET /files?path=` of the file just written, read to the end and counted; both over \
         one keep-alive HTTP/1.1 connection, (a) through the gateway (`E2b-Sandbox-Id` \
         headers and the envdAccessToken; the gateway asks its embedded node for a tunnel by a \
         call, the node dials the agent's abstract Unix socket in the sandbox's network \
         namespace, and the gateway streams over it), (b) through a bare relay of the bench's \
         own (a loopback TCP listener whose connections it joins to new connections to that \
         same socket of the agent, a blocking thread per direction copying bytes in reads of \
         up to 1 MiB, with no HTTP, no checks and no event loop: what the least a proxy can do \
         costs on this machine) and (c) \
         directly to the agent (a TCP socket to its port, made in the sandbox's network \
         namespace). The raw copy is the same bytes written to one loopback TCP socket and \
         read from its peer, both in the bench. Median of {} runs after one uncounted run \
         each; throughput is size / time from sending the request to the end of the answer.\n",
        t.disk_mib, t.mib, t.mib, t.runs
    );
    let _ = writeln!(
        o,
        "| {} MiB | time (median) | throughput | share of the raw copy |",
        t.mib
    );
    let _ = writeln!(o, "|---|---|---|---|");
    let raw = throughput(t.mib, t.raw);
    for (name, d) in [
        ("raw loopback TCP copy", t.raw),
        ("upload through the gateway", t.gw_up),
        ("download through the gateway", t.gw_down),
        ("upload through a bare relay", t.relay_up),
        ("download through a bare relay", t.relay_down),
        ("upload direct to the agent", t.direct_up),
        ("download direct to the agent", t.direct_down),
    ] {
        let tp = throughput(t.mib, d);
        let _ = writeln!(
            o,
            "| {name} | {} | {tp:.0} MiB/s | {:.0} % |",
            ms(d),
            tp * 100.0 / raw.max(1e-9)
        );
    }
    let _ = writeln!(
        o,
        "\nThrough the gateway, as a share of the raw copy: upload **{:.0} %**, download \
         **{:.0} %** (target ≥ 50 %); through the bare relay: upload {:.0} %, download \
         {:.0} %; the gateway as a share of the bare relay: upload {:.0} %, download {:.0} %; \
         as a share of the same transfer direct to the agent: upload {:.0} %, download \
         {:.0} %.\n",
        throughput(t.mib, t.gw_up) * 100.0 / raw.max(1e-9),
        throughput(t.mib, t.gw_down) * 100.0 / raw.max(1e-9),
        throughput(t.mib, t.relay_up) * 100.0 / raw.max(1e-9),
        throughput(t.mib, t.relay_down) * 100.0 / raw.max(1e-9),
        t.relay_up.as_secs_f64() * 100.0 / t.gw_up.as_secs_f64().max(1e-9),
        t.relay_down.as_secs_f64() * 100.0 / t.gw_down.as_secs_f64().max(1e-9),
        t.direct_up.as_secs_f64() * 100.0 / t.gw_up.as_secs_f64().max(1e-9),
        t.direct_down.as_secs_f64() * 100.0 / t.gw_down.as_secs_f64().max(1e-9)
    );
    let _ = writeln!(
        o,
        "Gateway memory during a {} MiB upload through it (VmRSS of the `serve` process, which \
         also runs the embedded node, read {} times during the upload, with 5 ms pauses between reads; \
         \"before\" is just before it, after the {} MiB transfers above; \"after\" is 2 s \
         after it finished): before **{:.1} MiB**, peak **{:.1} MiB**, after {:.1} MiB — \
         growth **{:.1} MiB** (target < 32 MiB). Before any transfer, once the sandbox \
         existed, it was {:.1} MiB. The upload took {} ({:.0} MiB/s).\n",
        t.big_mib,
        t.rss_samples,
        t.mib,
        mib(t.rss_before),
        mib(t.rss_peak),
        mib(t.rss_after),
        mib(t.rss_peak.saturating_sub(t.rss_before)),
        mib(t.rss_start),
        ms(t.big_took),
        throughput(t.big_mib, t.big_took)
    );
}
