//! The sandbox's door: the Unix socket its init listens on in the directory it shares with the
//! node (see `crate::sandbox::gvisor_init`), and what the node says there: one-line requests,
//! the generation that lets a closed door open again, and connections to the sandbox's ports.

use super::*;

impl GvisorRuntime {
    pub(super) fn door(dir: &Path) -> PathBuf {
        dir.join("run").join(DOOR)
    }

    /// A new generation tells the sandbox's init that it may open its door again.
    pub(super) fn bump_generation(dir: &Path) -> Result<()> {
        // Replaced whole by a rename: a sandbox that runs on through a checkpoint reads it
        // while it is written, and an empty read would look like a new generation.
        let run = dir.join("run");
        let next = run.join(format!(".{GENERATION}.next"));
        std::fs::write(&next, ids::random_hex(8))
            .and_then(|()| std::fs::rename(&next, run.join(GENERATION)))
            .map_err(io_err("writing the door generation"))
    }

    /// Waits until the door answers. `stale` is the inode of a door the sandbox closed and
    /// opens anew (a quiesce the sandbox runs on from): until its socket is replaced, a
    /// connection may reach the old one, which takes it and never answers.
    pub(super) async fn wait_door(
        &self,
        dir: &Path,
        stale: Option<u64>,
        timeout: Duration,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let door = Self::door(dir);
        loop {
            let replaced = stale.is_none() || Self::door_inode(dir) != stale;
            // Each try is bounded, so one connection that is never answered cannot hold the
            // wait past its deadline.
            let left = deadline.saturating_duration_since(Instant::now());
            if replaced
                && let Ok(Ok(pong)) =
                    tokio::time::timeout(left.min(PING_WITHIN), ask_at(&door, "PING")).await
                && pong == "PONG\n"
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(super::super::boot_too_slow(
                    format!("the sandbox in {} (its door)", dir.display()),
                    timeout,
                ));
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    }

    /// The inode of the sandbox's door socket, if it has one.
    pub(super) fn door_inode(dir: &Path) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(Self::door(dir)).ok().map(|m| m.ino())
    }

    /// Sends `request` through the sandbox's door and answers its one-line reply.
    pub(super) async fn ask(dir: &Path, request: &str) -> Result<String> {
        ask_at(&Self::door(dir), request)
            .await
            .map_err(|e| Error::unavailable(format!("asking the sandbox through its door: {e}")))
    }

    /// Closes the sandbox's door and cuts its connections: gVisor cannot checkpoint a sandbox
    /// that holds host sockets.
    pub(super) async fn quiesce(&self, dir: &Path) -> Result<()> {
        let answer = Self::ask(dir, "QUIESCE").await?;
        if answer != "OK\n" {
            return Err(Error::unavailable(format!(
                "the sandbox did not close its door: {:?}",
                answer.trim()
            )));
        }
        // The init closes its end; give the Sentry a moment to drop the host socket.
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(())
    }

    /// A connection to `port` inside the sandbox in `dir`, spliced by its init.
    pub(super) async fn open_port(dir: &Path, id: &str, port: u16) -> Result<Conn> {
        let mut s = UnixStream::connect(Self::door(dir))
            .await
            .map_err(|e| Error::unavailable(format!("sandbox {id} is not serving: {e}")))?;
        s.write_all(format!("PORT {port}\n").as_bytes())
            .await
            .map_err(|e| Error::unavailable(format!("sandbox {id}: {e}")))?;
        // One byte at a time: what follows the answer line is the port's own data.
        let mut line = Vec::new();
        loop {
            let b = s
                .read_u8()
                .await
                .map_err(|e| Error::unavailable(format!("sandbox {id}: {e}")))?;
            if b == b'\n' || line.len() > 512 {
                break;
            }
            line.push(b);
        }
        if line == b"OK" {
            Ok(Box::new(s))
        } else {
            Err(Error::unavailable(format!(
                "port {port} of sandbox {id}: {}",
                String::from_utf8_lossy(&line)
            )))
        }
    }
}

/// Sends `request` to the door at `door` and answers its reply line (with its newline; empty
/// if the sandbox closed the connection without one).
pub(super) async fn ask_at(door: &Path, request: &str) -> std::io::Result<String> {
    let mut s = UnixStream::connect(door).await?;
    s.write_all(format!("{request}\n").as_bytes()).await?;
    let mut answer = String::new();
    tokio::io::BufReader::new(s).read_line(&mut answer).await?;
    Ok(answer)
}
