//! The processes envd started and are still running, and each one's output fan-out.
//!
//! Output goes to every attached stream (the Start stream, Connect streams) through bounded
//! channels: a slow reader slows the command (its pipe fills) instead of growing envd's
//! memory, and with no reader attached output is dropped, as envd does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use connectrpc::ConnectError;
use tokio::net::unix::pipe::Sender as ChildStdin;
use tokio::sync::mpsc;

use super::pty::PtyMaster;
use crate::envd::errors::{internal, not_found};
use crate::envd::proto::process::__buffa::oneof::process_event::data_event::Output;
use crate::envd::proto::process::__buffa::oneof::process_selector::Selector;
use crate::envd::proto::process::process_event::EndEvent;
use crate::envd::proto::process::{ProcessConfig, ProcessInfo, ProcessSelector};

/// Chunks buffered per attached stream before the command is held back (32 KiB each at most).
const SUBSCRIBER_BUFFER: usize = 16;

#[derive(Debug, Clone)]
pub enum HubMsg {
    Data(Output),
    End(EndEvent),
}

#[derive(Default)]
pub struct Hub {
    subs: Mutex<Option<Vec<mpsc::Sender<HubMsg>>>>,
}

impl Hub {
    pub fn new() -> Hub {
        Hub {
            subs: Mutex::new(Some(Vec::new())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<mpsc::Sender<HubMsg>>>> {
        match self.subs.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// A new reader of everything from now on; `None` once the process has ended.
    pub fn subscribe(&self) -> Option<mpsc::Receiver<HubMsg>> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.lock().as_mut()?.push(tx);
        Some(rx)
    }

    fn senders(&self) -> Vec<mpsc::Sender<HubMsg>> {
        self.lock().as_ref().cloned().unwrap_or_default()
    }

    fn forget_closed(&self) {
        if let Some(v) = self.lock().as_mut() {
            v.retain(|s| !s.is_closed());
        }
    }

    /// Hands a chunk to every reader, waiting for room (back-pressure).
    pub async fn publish(&self, out: Output) {
        let mut gone = false;
        for s in self.senders() {
            gone |= s.send(HubMsg::Data(out.clone())).await.is_err();
        }
        if gone {
            self.forget_closed();
        }
    }

    /// The last message: readers get the end event and the hub takes no new readers.
    pub async fn end(&self, ev: EndEvent) {
        let subs = self.lock().take().unwrap_or_default();
        for s in subs {
            let _ = s.send(HubMsg::End(ev.clone())).await;
        }
    }
}

pub struct Proc {
    pub pid: u32,
    pub config: ProcessConfig,
    pub tag: Option<String>,
    pub hub: Hub,
    /// The write end of the command's stdin pipe, until CloseStdin (absent with `stdin: false`).
    pub stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pub pty: Option<Arc<PtyMaster>>,
}

impl Proc {
    pub fn info(&self) -> ProcessInfo {
        ProcessInfo {
            config: self.config.clone().into(),
            pid: self.pid,
            tag: self.tag.clone(),
            ..Default::default()
        }
    }

    /// Signals the command's whole process group (it leads its own session), so what it
    /// started goes too.
    pub fn signal(&self, sig: i32) -> std::io::Result<()> {
        let pid =
            i32::try_from(self.pid).map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: kill with a negative pid signals that process group.
        let rc = unsafe { libc::kill(-pid, sig) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // The leader may have moved to another group; signal it directly then.
            // SAFETY: as above, for the single process.
            if unsafe { libc::kill(pid, sig) } != 0 {
                return Err(e);
            }
        }
        Ok(())
    }

    pub async fn write_input(&self, data: &[u8], to_pty: bool) -> Result<(), ConnectError> {
        use tokio::io::AsyncWriteExt;
        match (&self.pty, to_pty) {
            (Some(p), true) => p
                .write_all(data)
                .await
                .map_err(|e| internal(format!("error writing to tty: {e}"))),
            (Some(_), false) => Err(internal(
                "error writing to stdin: tty assigned to process — input should be written to the pty, not the stdin",
            )),
            (None, true) => Err(internal(
                "error writing to tty: tty not assigned to process — input should be written to the stdin, not the tty",
            )),
            (None, false) => {
                let mut guard = self.stdin.lock().await;
                let Some(stdin) = guard.as_mut() else {
                    return Err(internal(
                        "error writing to stdin: stdin not enabled or closed",
                    ));
                };
                stdin.write_all(data).await.map_err(|e| {
                    internal(format!(
                        "error writing to stdin of process '{}': {e}",
                        self.pid
                    ))
                })?;
                stdin
                    .flush()
                    .await
                    .map_err(|e| internal(format!("error writing to stdin: {e}")))
            }
        }
    }
}

/// Process groups of running commands, process-wide, so the agent can end them all when its
/// node goes away (each command leads its own session, outside the agent's group).
static LIVE_GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

fn live_groups() -> std::sync::MutexGuard<'static, Vec<i32>> {
    match LIVE_GROUPS.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Sends SIGKILL to every running command's process group.
pub fn kill_all_commands() {
    for pgid in live_groups().iter() {
        // SAFETY: signalling a process group this process created.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

#[derive(Default)]
pub struct ProcessTable {
    procs: Mutex<HashMap<u32, Arc<Proc>>>,
}

impl ProcessTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Proc>>> {
        match self.procs.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    pub fn insert(&self, p: Arc<Proc>) {
        if let Ok(pgid) = i32::try_from(p.pid) {
            live_groups().push(pgid);
        }
        self.lock().insert(p.pid, p);
    }

    pub fn remove(&self, pid: u32) {
        live_groups().retain(|g| i64::from(*g) != i64::from(pid));
        self.lock().remove(&pid);
    }

    pub fn list(&self) -> Vec<ProcessInfo> {
        let mut v: Vec<ProcessInfo> = self.lock().values().map(|p| p.info()).collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// The process a selector names: by pid, or the first with the tag.
    pub fn get(&self, sel: Option<&ProcessSelector>) -> Result<Arc<Proc>, ConnectError> {
        let procs = self.lock();
        match sel.and_then(|s| s.selector.as_ref()) {
            Some(Selector::Pid(pid)) => procs
                .get(pid)
                .cloned()
                .ok_or_else(|| not_found(format!("process with pid {pid} not found"))),
            Some(Selector::Tag(tag)) => procs
                .values()
                .find(|p| p.tag.as_deref() == Some(tag.as_str()))
                .cloned()
                .ok_or_else(|| not_found(format!("process with tag {tag} not found"))),
            None => Err(ConnectError::new(
                connectrpc::ErrorCode::InvalidArgument,
                "a process selector (pid or tag) is required",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fans_out_and_ends() {
        let hub = Hub::new();
        let mut a = hub.subscribe().unwrap();
        let b = hub.subscribe().unwrap();
        drop(b);
        hub.publish(Output::Stdout(b"hi".to_vec())).await;
        assert!(matches!(a.recv().await, Some(HubMsg::Data(Output::Stdout(d))) if d == b"hi"));
        hub.end(EndEvent::default()).await;
        assert!(matches!(a.recv().await, Some(HubMsg::End(_))));
        assert!(a.recv().await.is_none());
        assert!(hub.subscribe().is_none(), "no readers after the end");
        // Nobody listening: output is dropped, publishing does not wait.
        let lonely = Hub::new();
        lonely.publish(Output::Stdout(vec![0; 10])).await;
    }
}
