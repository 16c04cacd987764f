//! Clients that stop reading, through the real gateway binary and a real sandbox: a download
//! of 64 MiB through the e2b data plane by a client that takes the reply's head and then
//! nothing is cut once `--stalled-client-seconds` pass, and the gateway lets go of the
//! connection (and so of the response and its tunnel to the sandbox); a client that pauses
//! for less than that gets the whole file; and the gateway goes on serving.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const BIG: usize = 64 << 20;
const STALL_LIMIT: Duration = Duration::from_secs(2);

/// `GET /files?path=/tmp/big` through the gateway's data plane on a raw connection; answers
/// the connection after the reply's head (200) and the body bytes read with it.
fn ask_download(gw_url: &str, sandbox: &Value) -> (TcpStream, usize) {
    let addr = gw_url.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).expect("connect to the gateway");
    let request = format!(
        "GET /files?path=/tmp/big HTTP/1.1\r\nHost: {addr}\r\nE2b-Sandbox-Id: {}\r\n\
         E2b-Sandbox-Port: 49983\r\nX-Access-Token: {}\r\nConnection: close\r\n\r\n",
        sandbox["sandboxID"].as_str().unwrap_or_default(),
        sandbox["envdAccessToken"].as_str().unwrap_or_default(),
    );
    s.write_all(request.as_bytes()).expect("send the request");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        let n = s.read(&mut buf).expect("the reply's head");
        assert!(n > 0, "the gateway closed before the head: {head:?}");
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    (s, head.len() - end)
}

/// Reads to the end; answers the bytes read and how the reading ended (`None`: EOF).
fn drain(mut s: TcpStream) -> (usize, Option<ErrorKind>) {
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (total, None),
            Ok(n) => total += n,
            Err(e) => return (total, Some(e.kind())),
        }
    }
}

/// The inode of the gateway's end of the loopback connection from `client` to `gw_url`.
fn server_end(gw_url: &str, client: &TcpStream) -> Option<String> {
    let gw_port = gw_url.rsplit(':').next()?.parse::<u16>().ok()?;
    let client_port = client.local_addr().ok()?.port();
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    std::fs::read_to_string("/proc/net/tcp")
        .ok()?
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 9 && port(f[1]) == Some(gw_port) && port(f[2]) == Some(client_port))
        .map(|f| f[9].to_string())
}

/// True while the gateway has a descriptor on the socket `inode`.
fn holds(gw: &Gateway, inode: &str) -> bool {
    let want = format!("socket:[{inode}]");
    std::fs::read_dir(format!("/proc/{}/fd", gw.proc.child.id()))
        .map(|d| {
            d.flatten()
                .any(|e| std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        })
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_and_one_that_pauses_is_not() {
    let tmp = tempfile::tempdir().unwrap();
    let limit = STALL_LIMIT.as_secs().to_string();
    let gw = Gateway::start(
        tmp.path(),
        &["--pool", "base=1", "--stalled-client-seconds", &limit],
    );
    gw.wait_warm(1, "the warm pool").await;
    let sandbox = gw
        .create(
            KEY_A,
            json!({"templateID": "base", "timeout": 600, "allow_internet_access": false}),
        )
        .await;
    let made = gw
        .run(
            &sandbox,
            &format!("head -c {BIG} /dev/urandom > /tmp/big && stat -c %s /tmp/big"),
        )
        .await;
    assert_eq!(made, Ok((0, format!("{BIG}\n"))));
    gw.wait_warm(1, "the pool to refill").await;

    // A pause shorter than the limit: the whole file.
    let url = gw.url.clone();
    let sb = sandbox.clone();
    let paused = tokio::task::spawn_blocking(move || {
        let (s, early) = ask_download(&url, &sb);
        std::thread::sleep(STALL_LIMIT / 2);
        let (rest, end) = drain(s);
        (early + rest, end)
    })
    .await
    .unwrap();
    assert_eq!(
        paused,
        (BIG, None),
        "a client that paused was not served whole"
    );

    // A client that stops reading: the gateway holds the connection and the tunnel while
    // the client reads nothing, and lets both go once the limit has passed.
    let url = gw.url.clone();
    let sb = sandbox.clone();
    let (s, early) = tokio::task::spawn_blocking(move || ask_download(&url, &sb))
        .await
        .unwrap();
    let stalled_at = Instant::now();
    let inode = server_end(&gw.url, &s).expect("the gateway's end of the download");
    assert!(
        holds(&gw, &inode),
        "the gateway has no descriptor on {inode}"
    );
    eventually(
        Duration::from_secs(30),
        "the gateway to let go of the stalled download",
        || !holds(&gw, &inode),
    )
    .await;
    let freed = stalled_at.elapsed();
    assert!(
        freed >= STALL_LIMIT,
        "let go after {freed:?}, before the limit of {STALL_LIMIT:?}"
    );
    let (got, end) = tokio::task::spawn_blocking(move || drain(s)).await.unwrap();
    assert!(
        early + got < BIG,
        "the stalled client still got the whole file"
    );
    assert!(
        !matches!(end, Some(ErrorKind::WouldBlock | ErrorKind::TimedOut)),
        "the client was left hanging instead of being told: {end:?}"
    );
    eprintln!(
        "stalled download: cut {freed:?} into the stall, the client read {} of {BIG} bytes then {end:?}",
        early + got
    );

    // The gateway goes on serving, the sandbox too.
    assert_eq!(
        gw.run(&sandbox, "echo alive").await,
        Ok((0, "alive\n".into()))
    );
}
