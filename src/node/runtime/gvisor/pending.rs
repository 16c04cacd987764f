//! Checkpoint images still being written, which a fork's children start from ahead: while
//! the source's checkpoint runs, each child makes its container and holds its restore (as a
//! standby does, see `standby`), and lets the restore read the image once it is complete.
//! That takes runsc's process start-up (about 0.1 s here) off a fork. Only runsc builds that
//! checkpoint a sandbox running on (`Runsc::resumes_after_checkpoint`) do this: they are the
//! ones that restore into a container made before.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::model::{Error, Result};

/// The images being written now, by path.
#[derive(Default)]
pub(super) struct PendingImages(Mutex<HashMap<PathBuf, Pending>>);

/// An image being written, as a boot from it sees it.
#[derive(Clone)]
pub(super) struct Pending {
    /// The token of the sandbox it captures, which its copies keep (as `ImageMeta` says of a
    /// complete image).
    pub init_token: String,
    /// None while it is written; then whether it was completed.
    done: watch::Receiver<Option<bool>>,
}

/// The writer's side of a pending image: `finish` says how it ended; dropped unfinished, it
/// failed. Either way the image is no longer pending.
pub(super) struct Writing<'a> {
    images: &'a PendingImages,
    path: PathBuf,
    done: watch::Sender<Option<bool>>,
}

impl PendingImages {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, Pending>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Says `image` is being written, of a sandbox whose init has `init_token`.
    pub fn announce(&self, image: &Path, init_token: &str) -> Writing<'_> {
        let (done, seen) = watch::channel(None);
        self.map().insert(
            image.to_path_buf(),
            Pending {
                init_token: init_token.to_string(),
                done: seen,
            },
        );
        Writing {
            images: self,
            path: image.to_path_buf(),
            done,
        }
    }

    /// `image`, if it is being written now.
    pub fn get(&self, image: &Path) -> Option<Pending> {
        self.map().get(image).cloned()
    }
}

impl Writing<'_> {
    /// Says the image is complete (`ok`), with what a restore needs beside it, or failed.
    pub fn finish(self, ok: bool) {
        self.done.send_replace(Some(ok));
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.images.map().remove(&self.path);
        if self.done.borrow().is_none() {
            self.done.send_replace(Some(false));
        }
    }
}

impl Pending {
    /// Waits until the image is complete; an error if it failed.
    pub async fn complete(mut self) -> Result<()> {
        match self.done.wait_for(Option::is_some).await.map(|v| *v) {
            Ok(Some(true)) => Ok(()),
            _ => Err(Error::unavailable(
                "the checkpoint this sandbox was to start from failed",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_boot_waits_for_the_image_and_learns_how_it_ended() {
        let images = PendingImages::default();
        let path = Path::new("/scratch/a");
        assert!(images.get(path).is_none());
        let writing = images.announce(path, "tok");
        let pending = images.get(path).expect("pending while written");
        assert_eq!(pending.init_token, "tok");
        let waiter = tokio::spawn(pending.clone().complete());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "waits while it is written");
        writing.finish(true);
        assert!(waiter.await.expect("joined").is_ok());
        // Finished: no longer pending, and a boot that had it sees it complete.
        assert!(images.get(path).is_none());
        assert!(pending.complete().await.is_ok());
    }

    #[tokio::test]
    async fn a_failed_or_abandoned_image_fails_its_boots() {
        let images = PendingImages::default();
        let failed = images.announce(Path::new("/scratch/f"), "t");
        let of_failed = images.get(Path::new("/scratch/f")).expect("pending");
        failed.finish(false);
        assert!(of_failed.complete().await.is_err());

        let abandoned = images.announce(Path::new("/scratch/g"), "t");
        let of_abandoned = images.get(Path::new("/scratch/g")).expect("pending");
        drop(abandoned);
        assert!(of_abandoned.complete().await.is_err());
        assert!(images.get(Path::new("/scratch/g")).is_none());
    }
}
