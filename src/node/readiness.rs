//! A sandbox whose template runs services (the code interpreter) is ready once they answer
//! their health check, not when envd does: a pool's sandbox must serve `run_code` at once,
//! its kernels started and warm. The node asks over the same door the data plane uses.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::runtime::{Instance, Runtime};
use crate::model::{Error, Result};
use crate::sandbox::services::Service;

/// Whether the answer to a health request says 200.
fn answered_ok(head: &[u8]) -> bool {
    head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200")
}

/// One health request; true on a 200.
async fn healthy<R: Runtime>(rt: &R, inst: &Instance<R::Handle>, service: Service) -> bool {
    let Ok(mut conn) = rt.dial(inst, service.port()).await else {
        return false;
    };
    let req = format!(
        "GET {} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        service.health_path()
    );
    if conn.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    let mut got = 0;
    while got < head.len() {
        match conn.read(&mut head[got..]).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got += n,
        }
    }
    answered_ok(&head)
}

/// Waits until every service of `services` answers 200, the instance dies, or `timeout`
/// passes.
pub async fn wait<R: Runtime>(
    rt: &R,
    inst: &Instance<R::Handle>,
    services: &[Service],
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    for &service in services {
        let mut pause = Duration::from_millis(5);
        loop {
            let attempt = tokio::time::timeout(Duration::from_secs(5), healthy(rt, inst, service));
            if matches!(attempt.await, Ok(true)) {
                break;
            }
            if !rt.is_alive(inst) {
                return Err(Error::internal(format!(
                    "the sandbox ended before its {} was ready",
                    service.name()
                )));
            }
            if Instant::now() + pause > deadline {
                return Err(super::runtime::boot_too_slow(
                    format!("the sandbox's {}", service.name()),
                    timeout,
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_200_is_ready() {
        assert!(answered_ok(b"HTTP/1.1 200 OK"));
        assert!(answered_ok(b"HTTP/1.0 200 "));
        assert!(!answered_ok(b"HTTP/1.1 503 "));
        assert!(!answered_ok(b"HTTP/1.1 20"));
        assert!(!answered_ok(b"garbage here"));
    }
}
