//! Services a template's sandboxes run beside envd (today the code interpreter). The sandbox's
//! init starts a small keeper per service, which runs the service as a child and starts it
//! again when it dies (after a pause that grows while it keeps dying), so that killing the
//! service, as upstream's tests do, costs a moment and not the sandbox. Both are forks of the
//! init, so nothing is executed from the sandbox's files, and neither is dumpable (the init's
//! memory holds the node's boot secret).

use std::ffi::CStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// A service a template declares (its `template.json` `services`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Service {
    /// e2b's Code Interpreter API on port 49999 (`crate::interpreter`).
    CodeInterpreter,
}

impl Service {
    /// The port it serves inside the sandbox.
    pub fn port(self) -> u16 {
        match self {
            Service::CodeInterpreter => crate::interpreter::PORT,
        }
    }

    /// Where it listens in a gVisor sandbox (see `Exposure::Socket`).
    pub fn socket(self) -> &'static str {
        match self {
            Service::CodeInterpreter => crate::interpreter::SOCKET,
        }
    }

    /// What answers 200 once it is ready to serve.
    pub fn health_path(self) -> &'static str {
        match self {
            Service::CodeInterpreter => "/health",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Service::CodeInterpreter => "code-interpreter",
        }
    }

    /// What `ps` and `pkill` call its process inside the sandbox (at most 15 bytes).
    pub fn process_name(self) -> &'static CStr {
        match self {
            Service::CodeInterpreter => c"interpreter",
        }
    }
}

/// Names this process for `ps` (its command line stays the init's).
fn set_name(name: &CStr) {
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes.
    unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0) };
}

/// How the sandbox reaches a service: gVisor sandboxes serve it on a Unix socket (the
/// sandbox's door leads its port there; see `gvisor_init`), the built-in runtime on its port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    Port,
    Socket,
}

/// Starts a keeper for every service; returns at once in the init.
/// `memory_bytes` is the sandbox's memory, which services may plan with.
pub fn start(services: &[Service], exposure: Exposure, memory_bytes: u64) {
    for &service in services {
        // SAFETY: the init is single-threaded when it calls this; the child becomes the keeper
        // and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            keep(service, exposure, memory_bytes);
        }
        if pid < 0 {
            eprintln!(
                "init: starting the {} keeper: {}",
                service.name(),
                std::io::Error::last_os_error()
            );
        }
    }
}

/// A service that lived this long before dying is started again at once.
const HEALTHY_FOR: Duration = Duration::from_secs(60);

/// The keeper: runs the service, waits for it, starts it again. Never returns.
fn keep(service: Service, exposure: Exposure, memory_bytes: u64) -> ! {
    no_secrets_here();
    set_name(c"keeper");
    let mut deaths = 0u32;
    loop {
        let started = Instant::now();
        // SAFETY: the keeper is single-threaded; the child runs the service and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: plain prctl; the service ends with its keeper.
            unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
            set_name(service.process_name());
            let code = run(service, exposure, memory_bytes);
            // SAFETY: the service's process ends here.
            unsafe { libc::_exit(code) };
        }
        if pid < 0 {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {}
        deaths = if started.elapsed() > HEALTHY_FOR {
            1
        } else {
            deaths + 1
        };
        let pause = crate::interpreter::restart_delay(deaths);
        eprintln!(
            "init: {} ended (status {status}); starting it again in {} s",
            service.name(),
            pause.as_secs()
        );
        std::thread::sleep(pause);
    }
}

/// Neither the keeper nor the service may be read by the sandbox's root: both are copies of
/// the init, whose memory holds the node's boot secret.
fn no_secrets_here() {
    // SAFETY: plain prctl.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
}

fn run(service: Service, exposure: Exposure, memory_bytes: u64) -> i32 {
    match service {
        Service::CodeInterpreter => {
            use crate::interpreter::{self, Config, Listen, Options};
            let config = match Config::load(std::path::Path::new(interpreter::TEMPLATE_CONFIG)) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("code-interpreter: {e}");
                    return 1;
                }
            };
            let listen = match exposure {
                Exposure::Port => Listen::Tcp(format!("0.0.0.0:{}", interpreter::PORT)),
                Exposure::Socket => Listen::Unix(service.socket().into()),
            };
            let opts = Options {
                listen,
                config,
                runtime_dir: interpreter::RUNTIME_DIR.into(),
                envs_file: Some(interpreter::envs::SANDBOX_ENVS_FILE.into()),
                kernel_env: interpreter::sandbox_kernel_env(),
                memory_bytes: Some(memory_bytes),
            };
            match interpreter::run(opts) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("code-interpreter: {e}");
                    1
                }
            }
        }
    }
}
