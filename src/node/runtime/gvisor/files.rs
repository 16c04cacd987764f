//! A filesystem-only pause on gVisor: the sandbox's writes live in runsc's in-memory overlay,
//! so its init streams them out through the door (`crate::sandbox::savefiles`, `SAVE`) into
//! one file under the pause's directory, and a fresh sandbox of the template takes them in
//! (`LOAD`) before it is handed out. The stream is the sandbox's own and is checked only as a
//! tar that ends with its path list; the host never unpacks it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::model::{Error, Result};

/// The saved files, in a pause's directory.
pub const FILES: &str = "files.tar";
/// How long a save or a load may take: a sandbox stalling its stream must not hold its verb
/// lock for ever (a sandbox's memory, its whole overlay, moves in far less).
const MOVE_FOR: Duration = Duration::from_secs(600);

/// Whether `seed` (a directory a sandbox boots from) holds saved files rather than a
/// checkpoint.
pub fn is_files(seed: &Path) -> bool {
    seed.join(FILES).is_file()
}

fn unavailable(what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::unavailable(format!("{what}: {e}"))
}

/// Connects to the door at `door`, sends `request` and reads its "OK".
async fn open(door: &Path, request: &str) -> Result<BufReader<UnixStream>> {
    let mut s = UnixStream::connect(door)
        .await
        .map_err(unavailable("the sandbox's door"))?;
    s.write_all(format!("{request}\n").as_bytes())
        .await
        .map_err(unavailable("asking the sandbox"))?;
    let mut s = BufReader::new(s);
    let mut answer = String::new();
    s.read_line(&mut answer)
        .await
        .map_err(unavailable("asking the sandbox"))?;
    if answer.trim() != "OK" {
        return Err(Error::unavailable(format!(
            "the sandbox refused {:?}: {:?}",
            request.split(' ').next().unwrap_or_default(),
            answer.trim()
        )));
    }
    Ok(s)
}

/// Saves the files of the sandbox behind `door` changed after `since_ns` into `dest` (a new
/// directory); answers the bytes saved. Its other processes are stopped first and stay so:
/// the caller ends the sandbox, or `resume_processes` on failure.
pub async fn save(door: &Path, since_ns: i64, dest: &Path) -> Result<u64> {
    let mut stream = open(door, &format!("SAVE {since_ns}")).await?;
    tokio::fs::create_dir_all(dest)
        .await
        .map_err(|e| Error::io("making the pause's directory", e))?;
    let path = dest.join(FILES);
    let mut file = tokio::fs::File::create(&path)
        .await
        .map_err(|e| Error::io("saving the sandbox's files", e))?;
    let bytes = tokio::time::timeout(MOVE_FOR, tokio::io::copy(&mut stream, &mut file))
        .await
        .map_err(|_| Error::unavailable("the sandbox's files took too long to save"))?
        .map_err(|e| Error::io("saving the sandbox's files", e))?;
    file.sync_all()
        .await
        .map_err(|e| Error::io("saving the sandbox's files", e))?;
    drop(file);
    // A stream cut short (the sandbox died, or failed to read its files) must not pass for
    // the sandbox's files: one that lacks its closing list would load as an empty tree.
    let check = path.clone();
    tokio::task::spawn_blocking(move || complete(&check))
        .await
        .map_err(|e| Error::internal(format!("checking the saved files: {e}")))??;
    Ok(bytes)
}

/// Ok when the saved stream at `path` is a whole tar whose last entry is the path list.
fn complete(path: &PathBuf) -> Result<()> {
    let incomplete = |why: String| {
        Error::unavailable(format!("the sandbox's files were not saved whole: {why}"))
    };
    let file = std::fs::File::open(path).map_err(|e| incomplete(e.to_string()))?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(file));
    let mut last = None;
    for entry in archive.entries().map_err(|e| incomplete(e.to_string()))? {
        let entry = entry.map_err(|e| incomplete(e.to_string()))?;
        last = Some(
            entry
                .path()
                .map_err(|e| incomplete(e.to_string()))?
                .into_owned(),
        );
    }
    match last {
        Some(p) if p == Path::new(crate::sandbox::savefiles::PATHS) => Ok(()),
        _ => Err(incomplete("its path list is missing".into())),
    }
}

/// Lets the processes a failed `save` stopped run on.
pub async fn resume_processes(door: &Path) {
    if let Err(e) = open(door, "CONT").await {
        tracing::error!(error = %e, "the sandbox's processes could not be resumed after a failed save");
    }
}

/// Loads the files saved in `seed` into the fresh sandbox behind `door`.
pub async fn load(door: &Path, seed: &Path) -> Result<()> {
    let mut stream = open(door, "LOAD").await?;
    let mut file = tokio::fs::File::open(seed.join(FILES))
        .await
        .map_err(|e| Error::io("reading the saved files", e))?;
    let mut answer = String::new();
    let moved = async {
        tokio::io::copy(&mut file, stream.get_mut()).await?;
        stream.read_line(&mut answer).await
    };
    tokio::time::timeout(MOVE_FOR, moved)
        .await
        .map_err(|_| Error::unavailable("the sandbox took too long to take its files"))?
        .map_err(unavailable("loading the saved files"))?;
    if answer.trim() == "DONE" {
        return Ok(());
    }
    Err(Error::internal(format!(
        "the sandbox could not take its saved files: {}",
        answer.trim()
    )))
}
