//! The host's transparent huge pages for shared memory, which a gVisor sandbox's memory is.
//! The Sentry keeps the sandbox's memory in one shared-memory file and asks for huge pages on
//! it only when the host's `shmem_enabled` allows madvise (runsc reads the setting at start;
//! with `never` it logs "Disabling application huge pages"). A restore faults the whole image
//! back in, one 4 KiB page at a time without them, and under a hypervisor each fault is dear:
//! here a resume of 256–512 MiB took about half the time with `advise` (PERFORMANCE.md, side
//! by side). So a gVisor node moves the host from `never` to `advise`, which gives huge pages
//! only to mappings that ask for them, as kubelet sets the kernel tunables it needs unless
//! told to protect the defaults; any other choice (`deny`, `force`, `always`, `within_size`)
//! is the operator's and is kept.

use std::path::Path;

/// Where the host says what shared memory gets huge pages.
pub const SHMEM_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/shmem_enabled";

/// The value the node sets in place of `never`.
const WANTED: &str = "advise";

/// The selected value of a sysfs choice list ("always [never] advise" → "never").
pub fn selected(listing: &str) -> Option<&str> {
    let start = listing.find('[')? + 1;
    let end = start + listing[start..].find(']')?;
    Some(&listing[start..end])
}

/// Moves `never` to `advise` in the choice file at `path` unless `protect` says to leave the
/// host's settings alone; answers a line for the node's start-up log saying what it found and
/// did. Nothing here fails the node: without huge pages gVisor only restores more slowly.
pub fn tune(path: &Path, protect: bool) -> String {
    let listing = match std::fs::read_to_string(path) {
        Ok(l) => l,
        Err(e) => {
            return format!(
                "host shared-memory huge pages: {} unreadable ({e}); gVisor restores use 4 KiB pages",
                path.display()
            );
        }
    };
    let Some(current) = selected(&listing) else {
        return format!(
            "host shared-memory huge pages: {} says {:?}, which is not a choice list; left alone",
            path.display(),
            listing.trim()
        );
    };
    if current != "never" {
        return format!("host shared-memory huge pages: {current} (kept)");
    }
    if protect {
        return format!(
            "host shared-memory huge pages: never (kept: --protect-kernel-defaults); gVisor restores fault memory in 4 KiB pages; `echo {WANTED} > {}` speeds them up",
            path.display()
        );
    }
    match std::fs::write(path, WANTED) {
        Ok(()) => format!(
            "host shared-memory huge pages: never → {WANTED} (only for memory that asks, as gVisor's does; --protect-kernel-defaults leaves the host alone)"
        ),
        Err(e) => format!(
            "host shared-memory huge pages: never, and {} could not be set to {WANTED} ({e}); gVisor restores fault memory in 4 KiB pages",
            path.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "always within_size advise [never] deny force\n";

    #[test]
    fn the_selected_choice_is_the_bracketed_one() {
        assert_eq!(selected(HOST), Some("never"));
        assert_eq!(selected("[always] madvise never"), Some("always"));
        assert_eq!(
            selected("always within_size [advise] never"),
            Some("advise")
        );
        assert_eq!(selected("advise"), None);
        assert_eq!(selected("always [never"), None);
    }

    fn file(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("shmem_enabled");
        std::fs::write(&path, text).expect("writing the fixture");
        (dir, path)
    }

    #[test]
    fn never_becomes_advise() {
        let (_d, path) = file(HOST);
        let said = tune(&path, false);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "advise");
        assert!(said.contains("never → advise"), "{said}");
    }

    #[test]
    fn protected_or_chosen_settings_are_kept() {
        let (_d, path) = file(HOST);
        let said = tune(&path, true);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), HOST);
        assert!(said.contains("kept: --protect-kernel-defaults"), "{said}");
        for choice in [
            "always within_size advise never [deny] force",
            "[always] within_size advise never deny force",
            "always within_size advise never deny [force]",
            "always within_size [advise] never deny force",
        ] {
            let (_d, path) = file(choice);
            let said = tune(&path, false);
            assert_eq!(std::fs::read_to_string(&path).expect("read"), choice);
            assert!(said.ends_with("(kept)"), "{said}");
        }
    }

    #[test]
    fn an_unreadable_or_odd_file_is_left_alone() {
        let dir = tempfile::tempdir().expect("temp dir");
        let said = tune(&dir.path().join("missing"), false);
        assert!(said.contains("unreadable"), "{said}");
        let (_d, path) = file("advise\n");
        let said = tune(&path, false);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), "advise\n");
        assert!(said.contains("not a choice list"), "{said}");
    }
}
