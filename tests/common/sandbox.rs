//! A small client for tests that reach a sandbox the way the gateway does: a CONNECT tunnel
//! through the node's data plane (with the sandbox's own token), then plain HTTP/1.1 to envd
//! or to any port of the sandbox. Commands go over envd's Connect protocol (JSON codec).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

use base64::Engine;
use sandbox_gateway::model::SandboxRecord;
use serde_json::{Value, json};

pub const ENVD: u16 = 49983;

/// An HTTP answer: status, headers (lower-case names) and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// What a command did.
#[derive(Debug)]
pub struct Ran {
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
    pub end: Value,
}

pub struct SandboxClient {
    pub node: String,
    pub id: String,
    pub token: String,
    pub timeout: Duration,
}

fn read_head(r: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

fn read_body(r: &mut impl BufRead, headers: &[(String, String)]) -> std::io::Result<Vec<u8>> {
    let get = |k: &str| {
        headers
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let mut body = Vec::new();
    if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(std::io::Error::other)?;
            if n == 0 {
                let mut crlf = String::new();
                r.read_line(&mut crlf)?;
                break;
            }
            let mut chunk = vec![0u8; n + 2];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(len) = get("content-length").and_then(|l| l.parse::<usize>().ok()) {
        body.resize(len, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(body)
}

impl SandboxClient {
    pub fn of(record: &SandboxRecord) -> Self {
        SandboxClient {
            node: record.address.clone(),
            id: record.id.clone(),
            token: record.token.clone(),
            timeout: Duration::from_secs(30),
        }
    }

    /// A tunnel to `port`; Err carries the node's refusal (status and body) or the failure.
    pub fn tunnel(&self, port: u16) -> Result<TcpStream, (u16, String)> {
        let mut s = TcpStream::connect(&self.node).map_err(|e| (0, e.to_string()))?;
        s.set_read_timeout(Some(self.timeout)).ok();
        write!(
            s,
            "CONNECT {}:{port} HTTP/1.1\r\nProxy-Authorization: Bearer {}\r\n\r\n",
            self.id, self.token
        )
        .map_err(|e| (0, e.to_string()))?;
        let mut r = BufReader::new(s.try_clone().map_err(|e| (0, e.to_string()))?);
        let (status, headers) = read_head(&mut r).map_err(|e| (0, e.to_string()))?;
        if status != 200 {
            let body = read_body(&mut r, &headers).unwrap_or_default();
            return Err((status, String::from_utf8_lossy(&body).to_string()));
        }
        Ok(s)
    }

    /// One HTTP/1.1 request to `port` inside the sandbox.
    pub fn request(
        &self,
        port: u16,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Answer, (u16, String)> {
        let mut s = self.tunnel(port)?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: sandbox\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes())
            .map_err(|e| (0, e.to_string()))?;
        // A server may answer (507, 401) before it has read the whole body and close; its
        // answer is what counts, so a failed write is not yet a failure.
        let wrote = s.write_all(body);
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r).map_err(|e| {
            let why = wrote
                .as_ref()
                .err()
                .map_or(e.to_string(), |w| w.to_string());
            (0, why)
        })?;
        let body = read_body(&mut r, &headers).map_err(|e| (0, e.to_string()))?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// envd's `/health` status, or the node's refusal status.
    pub fn health(&self) -> u16 {
        match self.request(ENVD, "GET", "/health", &[], b"") {
            Ok(a) => a.status,
            Err((s, _)) => s,
        }
    }

    /// Runs `bash -l -c cmd` as `user` (envd's default user when None).
    pub fn run_as(&self, user: Option<&str>, cmd: &str) -> Result<Ran, String> {
        let body = start_body(&["-l", "-c", cmd]);
        let basic = user.map(|u| {
            format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:"))
            )
        });
        let mut headers = vec![
            ("Content-Type", "application/connect+json"),
            ("Connect-Protocol-Version", "1"),
            ("X-Access-Token", self.token.as_str()),
        ];
        if let Some(b) = &basic {
            headers.push(("Authorization", b.as_str()));
        }
        let a = self
            .request(ENVD, "POST", "/process.Process/Start", &headers, &body)
            .map_err(|(s, m)| format!("{s}: {m}"))?;
        if a.status != 200 {
            return Err(format!("{}: {}", a.status, a.text()));
        }
        parse_start_stream(&a.body)
    }

    pub fn run(&self, cmd: &str) -> Ran {
        self.run_as(None, cmd)
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
    }

    pub fn write(&self, path: &str, data: &[u8]) -> Answer {
        let q = format!("/files?path={}", urlencode(path));
        self.request(
            ENVD,
            "POST",
            &q,
            &[
                ("Content-Type", "application/octet-stream"),
                ("X-Access-Token", self.token.as_str()),
            ],
            data,
        )
        .unwrap_or_else(|(s, m)| panic!("upload refused: {s} {m}"))
    }

    pub fn read(&self, path: &str) -> Answer {
        let q = format!("/files?path={}", urlencode(path));
        self.request(
            ENVD,
            "GET",
            &q,
            &[("X-Access-Token", self.token.as_str())],
            b"",
        )
        .unwrap_or_else(|(s, m)| panic!("download refused: {s} {m}"))
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `process.Process/Start`'s request body (one Connect envelope, JSON codec) for
/// `/bin/bash ARGS` without stdin.
pub fn start_body(args: &[&str]) -> Vec<u8> {
    let msg = json!({"process": {"cmd": "/bin/bash", "args": args, "envs": {}}, "stdin": false});
    let payload = serde_json::to_vec(&msg).unwrap_or_default();
    let mut body = vec![0u8];
    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    body.extend_from_slice(&payload);
    body
}

/// The command's output and end from a whole `process.Process/Start` answer body; a
/// truncated envelope ends the parse, an error in the end-of-stream message is an error.
pub fn parse_start_stream(body: &[u8]) -> Result<Ran, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut end = Value::Null;
    let mut rest = body;
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let Some(raw) = rest.get(5..5 + len) else {
            break;
        };
        let frame: Value = serde_json::from_slice(raw).unwrap_or(Value::Null);
        rest = &rest[5 + len..];
        if flags & 2 != 0 {
            if frame.get("error").is_some() {
                return Err(format!("stream error: {frame}"));
            }
            break;
        }
        let ev = &frame["event"];
        if let Some(d) = ev["data"]["stdout"].as_str() {
            stdout.extend(b64.decode(d).unwrap_or_default());
        }
        if let Some(d) = ev["data"]["stderr"].as_str() {
            stderr.extend(b64.decode(d).unwrap_or_default());
        }
        if !ev["end"].is_null() {
            end = ev["end"].clone();
        }
    }
    Ok(Ran {
        exit_code: end["exitCode"].as_i64().unwrap_or(0),
        stdout: String::from_utf8_lossy(&stdout).to_string(),
        stderr: String::from_utf8_lossy(&stderr).to_string(),
        end,
    })
}
