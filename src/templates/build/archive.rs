//! Uploaded COPY archives: checked before they are stored.
//!
//! The SDKs upload the files of a COPY step as a tar archive, gzip-compressed by default
//! (contract `template-build.md` §3.3). GNU tar extracts it later inside a build sandbox; here,
//! on the host, an archive is refused before it is kept if it is not a well-formed tar (or
//! tar.gz) or if any member could land outside the destination directory, is a device or fifo,
//! or is something GNU tar might read differently from the `tar` crate. The sizes its headers
//! declare are counted and capped, and reading stops as soon as a cap is passed, so a small
//! gzip bomb costs no more than the cap.
//!
//! Where GNU tar and the `tar` crate could disagree about a member, the archive is refused
//! rather than trusted: every name either of them might use is checked (GNU tar prefers a PAX
//! `path` over a GNU long name, the crate the other way round), repeated PAX keys and PAX
//! sparse files are refused, and only regular files carry data.

use std::cell::{Cell, RefCell};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::rc::Rc;

use flate2::read::MultiGzDecoder;
use tar::EntryType;

use crate::model::Error;

/// Most bytes of headers one member may have: its 512-byte header plus any PAX extended
/// header or GNU long name/link before it. The crate reads those into memory whole, so this
/// also bounds the memory a crafted header can take. Real ones are a few KiB at most.
const MAX_MEMBER_HEADERS: u64 = 1 << 20;

/// Most bytes after the end-of-archive marker. tar writers pad an archive to a whole record
/// (10 KiB for GNU tar and Python's tarfile); anything much larger is not a padding.
const MAX_TRAILING_BYTES: u64 = 1 << 20;

const BLOCK: u64 = 512;

/// Why an uploaded archive is refused.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive unpacks to more than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("invalid archive: {0}")]
    Invalid(String),
    #[error("reading the archive: {0}")]
    Io(#[from] io::Error),
}

impl ArchiveError {
    /// The project's error: too large (413), invalid (400), or an I/O failure of the host
    /// (a full disk keeps its own kind).
    pub fn into_error(self) -> Error {
        match self {
            ArchiveError::TooLarge { .. } => Error::too_large(self.to_string()),
            ArchiveError::Invalid(_) => Error::invalid(self.to_string()),
            ArchiveError::Io(e) => Error::io("reading the uploaded archive", e),
        }
    }
}

/// What a checked archive holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Whether it was gzip-compressed (the extractor needs to know).
    pub gzip: bool,
    /// Members, directories and links included.
    pub entries: u64,
    /// The sum of the members' sizes: what it unpacks to.
    pub bytes: u64,
}

/// Checks the archive at `path`: tar or tar.gz (by its magic bytes, not its name), at most
/// `max_entries` members unpacking to at most `max_unpacked_bytes`, only safe members. An
/// archive with no members is valid.
pub fn check(
    path: &Path,
    max_unpacked_bytes: u64,
    max_entries: u64,
) -> Result<Summary, ArchiveError> {
    let mut file = File::open(path)?;
    let mut magic = [0u8; 2];
    let got = read_up_to(&mut file, &mut magic)?;
    // GNU tar refuses an empty file ("This does not look like a tar archive").
    if got == 0 {
        return Err(ArchiveError::Invalid(
            "not a tar archive: the file is empty".into(),
        ));
    }
    let gzip = got == 2 && magic == [0x1f, 0x8b];
    file.seek(SeekFrom::Start(0))?;
    let file = BufReader::new(file);
    // Multi-member, as gzip itself decompresses: what GNU tar sees is what is checked.
    let stream: Box<dyn Read> = if gzip {
        Box::new(MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    let meter = Rc::new(Meter {
        read: Cell::new(0),
        allowed: Cell::new(MAX_MEMBER_HEADERS),
        exhausted: Cell::new(false),
        os_error: RefCell::new(None),
    });
    let mut archive = tar::Archive::new(Metered {
        inner: stream,
        meter: Rc::clone(&meter),
    });

    let mut summary = Summary {
        gzip,
        entries: 0,
        bytes: 0,
    };
    let headers_too_large = || {
        ArchiveError::Invalid(format!(
            "a member's headers (PAX or GNU long names) are larger than {MAX_MEMBER_HEADERS} bytes"
        ))
    };
    let entries = archive
        .entries()
        .map_err(|e| read_failure(&meter, e, headers_too_large))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| read_failure(&meter, e, headers_too_large))?;
        summary.entries += 1;
        if summary.entries > max_entries {
            return Err(ArchiveError::Invalid(format!(
                "too many members (more than {max_entries})"
            )));
        }
        // Counted from the header, before any data is read: a bomb is stopped at its first
        // member past the cap.
        let size = entry.size();
        summary.bytes = summary.bytes.saturating_add(size);
        if summary.bytes > max_unpacked_bytes {
            return Err(ArchiveError::TooLarge {
                limit: max_unpacked_bytes,
            });
        }
        check_member(&mut entry)?;
        // From here the crate may read (and skip) this member's data, padded to whole
        // blocks, and then the next member's headers: nothing more.
        let padded = size.div_ceil(BLOCK).saturating_mul(BLOCK);
        meter.allowed.set(
            entry
                .raw_file_position()
                .saturating_add(padded)
                .saturating_add(MAX_MEMBER_HEADERS),
        );
    }

    // Read what follows the end marker too: a gzip stream is only known to be whole (length
    // and CRC) at its very end, and GNU tar fails on a truncated one.
    let mut rest = archive.into_inner();
    meter
        .allowed
        .set(meter.read.get().saturating_add(MAX_TRAILING_BYTES));
    io::copy(&mut rest, &mut io::sink()).map_err(|e| {
        read_failure(&meter, e, || {
            ArchiveError::Invalid(format!(
                "more than {MAX_TRAILING_BYTES} bytes follow the end of the archive"
            ))
        })
    })?;
    Ok(summary)
}

/// Reads into `buf` until it is full or the reader ends; returns how much was read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Shared between [`check`] and the reader the `tar` crate owns.
struct Meter {
    /// Bytes of the (decompressed) tar stream read so far.
    read: Cell<u64>,
    /// How far into the stream reading may go.
    allowed: Cell<u64>,
    /// Set when a read was refused because it would pass `allowed`.
    exhausted: Cell<bool>,
    /// The first error of the host's own I/O (it has an errno): not the archive's fault. The
    /// crate wraps errors in ones of its own, so it is kept aside to be told apart.
    os_error: RefCell<Option<io::Error>>,
}

/// The tar stream as the crate reads it, counted and capped by a [`Meter`].
struct Metered<R> {
    inner: R,
    meter: Rc<Meter>,
}

impl<R: Read> Metered<R> {
    fn pass(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| match e.raw_os_error() {
            Some(code) => {
                self.meter.os_error.borrow_mut().get_or_insert(e);
                io::Error::from_raw_os_error(code)
            }
            None => e,
        })
    }
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let left = self
            .meter
            .allowed
            .get()
            .saturating_sub(self.meter.read.get());
        if left == 0 {
            // At the cap: fine if the stream ends here anyway, refused if there is more.
            let mut probe = [0u8; 1];
            if self.pass(&mut probe)? == 0 {
                return Ok(0);
            }
            self.meter.exhausted.set(true);
            return Err(io::Error::other("read limit reached"));
        }
        let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
        let n = self.pass(&mut buf[..want])?;
        self.meter.read.set(self.meter.read.get() + n as u64);
        Ok(n)
    }
}

/// Turns a failed read of the stream into the reason: the host's I/O, the cap, or a broken
/// archive.
fn read_failure(
    meter: &Meter,
    err: io::Error,
    over_cap: impl FnOnce() -> ArchiveError,
) -> ArchiveError {
    if let Some(os) = meter.os_error.borrow_mut().take() {
        return ArchiveError::Io(os);
    }
    if meter.exhausted.get() {
        return over_cap();
    }
    ArchiveError::Invalid(format!("not a tar archive: {}", describe(&err)))
}

/// An error with its causes: the crate's own messages ("failed to iterate over archive")
/// say little without the one underneath.
fn describe(err: &io::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// A member name for a message: lossy UTF-8, control characters escaped, long ones cut.
fn show(name: &[u8]) -> String {
    if name.is_empty() {
        return "(empty name)".into();
    }
    let mut out = String::new();
    for (i, c) in String::from_utf8_lossy(name).chars().enumerate() {
        if i == 200 {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

fn kind_name(kind: EntryType) -> String {
    match kind {
        EntryType::Char => "a character device".into(),
        EntryType::Block => "a block device".into(),
        EntryType::Fifo => "a fifo".into(),
        EntryType::GNUSparse => "a sparse file".into(),
        EntryType::Continuous => "a contiguous file".into(),
        EntryType::XGlobalHeader => "a PAX global header".into(),
        EntryType::XHeader => "a PAX header of an unrecognised format".into(),
        EntryType::GNULongName | EntryType::GNULongLink => {
            "a GNU long name of an unrecognised format".into()
        }
        other => format!("an entry of type {:?}", other.as_byte() as char),
    }
}

/// Why a path (a member name or a hard link's target) could leave the destination, if it
/// could.
fn path_problem(path: &[u8]) -> Option<&'static str> {
    if path.is_empty() {
        Some("an empty name")
    } else if path.contains(&0) {
        Some("a NUL character in the name")
    } else if path.starts_with(b"/") {
        Some("an absolute path")
    } else if path.split(|&b| b == b'/').any(|c| c == b"..") {
        Some("a '..' component")
    } else {
        None
    }
}

/// A header field, cut at its first NUL as tar readers do.
fn field(bytes: &[u8]) -> &[u8] {
    bytes
        .iter()
        .position(|&b| b == 0)
        .map_or(bytes, |end| &bytes[..end])
}

fn check_member<R: Read>(entry: &mut tar::Entry<'_, R>) -> Result<(), ArchiveError> {
    let path = entry.path_bytes().into_owned();
    let member = show(&path);
    let bad = |why: String| ArchiveError::Invalid(format!("{member}: {why}"));

    let kind = entry.header().entry_type();
    if !matches!(
        kind,
        EntryType::Regular | EntryType::Directory | EntryType::Symlink | EntryType::Link
    ) {
        return Err(bad(format!(
            "{} is not allowed (only files, directories and links are)",
            kind_name(kind)
        )));
    }
    // GNU tar may not skip data behind a directory or link as the crate does, and then the
    // two would read the members after it differently.
    if kind != EntryType::Regular && entry.size() != 0 {
        return Err(bad("a directory or link with data is not allowed".into()));
    }

    // Every name a reader might take for this member: the crate's, and the ones GNU tar
    // could prefer.
    let mut names = vec![path.clone()];
    let mut links: Vec<Vec<u8>> = entry
        .link_name_bytes()
        .map(|l| l.into_owned())
        .into_iter()
        .collect();
    let raw = entry.header().as_bytes();
    // GNU tar takes any header with the magic "ustar\0" as POSIX and joins its prefix field,
    // whatever its version field says; the crate only does for version "00".
    if &raw[257..263] == b"ustar\0" {
        let prefix = field(&raw[345..500]);
        if !prefix.is_empty() {
            let mut joined = prefix.to_vec();
            joined.push(b'/');
            joined.extend_from_slice(field(&raw[..100]));
            names.push(joined);
        }
    }
    let pax = entry
        .pax_extensions()
        .map_err(|e| bad(format!("unreadable PAX header: {e}")))?;
    if let Some(pax) = pax {
        let mut seen: Vec<Vec<u8>> = Vec::new();
        for ext in pax {
            let ext = ext.map_err(|e| bad(format!("malformed PAX header: {e}")))?;
            let key = ext.key_bytes();
            if seen.iter().any(|k| k == key) {
                // The crate uses the first value, GNU tar the last.
                return Err(bad(format!("the PAX key '{}' is given twice", show(key))));
            }
            if key.starts_with(b"GNU.sparse.") {
                return Err(bad("a sparse file is not allowed".into()));
            }
            match key {
                b"path" => names.push(ext.value_bytes().to_vec()),
                b"linkpath" => links.push(ext.value_bytes().to_vec()),
                _ => {}
            }
            seen.push(key.to_vec());
        }
    }

    for name in &names {
        if let Some(why) = path_problem(name) {
            let shown = if *name == path {
                String::new()
            } else {
                format!(" (as {})", show(name))
            };
            return Err(bad(format!("{why} is not allowed{shown}")));
        }
        // GNU tar takes an old-style file whose name ends in '/' for a directory.
        if kind != EntryType::Directory && name.ends_with(b"/") {
            return Err(bad("only a directory's name may end in '/'".into()));
        }
    }

    match kind {
        EntryType::Link => {
            if links.is_empty() {
                return Err(bad("a hard link without a target".into()));
            }
            for target in &links {
                if let Some(why) = path_problem(target) {
                    return Err(bad(format!("a hard link to {} has {why}", show(target))));
                }
            }
        }
        // A symlink may point anywhere: it is only a link inside the sandbox. Its target
        // must still be a single C string.
        EntryType::Symlink => {
            if links.is_empty() {
                return Err(bad("a symlink without a target".into()));
            }
            for target in &links {
                if target.is_empty() || target.contains(&0) {
                    return Err(bad(format!(
                        "the symlink target {} is empty or has a NUL character",
                        show(target)
                    )));
                }
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;
    use std::time::{Duration, Instant};
    use tar::{Builder, Header};

    const MIB: u64 = 1 << 20;

    fn header(name: &[u8], kind: EntryType, size: u64) -> Header {
        let mut h = Header::new_gnu();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_entry_type(kind);
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        h
    }

    fn link_header(name: &[u8], kind: EntryType, target: &[u8]) -> Header {
        let mut h = header(name, kind, 0);
        h.as_old_mut().linkname[..target.len()].copy_from_slice(target);
        h.set_cksum();
        h
    }

    /// A PAX extended header ('x') carrying `records`.
    fn pax(b: &mut Builder<Vec<u8>>, records: &[(&str, &[u8])]) {
        let mut data = Vec::new();
        for (k, v) in records {
            let body_len = 1 + k.len() + 1 + v.len() + 1;
            let mut len = body_len + 1;
            while len != body_len + len.to_string().len() {
                len = body_len + len.to_string().len();
            }
            data.extend_from_slice(format!("{len} {k}=").as_bytes());
            data.extend_from_slice(v);
            data.push(b'\n');
        }
        let h = header(b"PaxHeader", EntryType::XHeader, data.len() as u64);
        b.append(&h, data.as_slice()).unwrap();
    }

    fn file(b: &mut Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(EntryType::Regular);
        b.append_data(&mut h, name, data).unwrap();
    }

    fn finish(b: Builder<Vec<u8>>) -> Vec<u8> {
        b.into_inner().unwrap()
    }

    fn gz(bytes: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn check_bytes(
        bytes: &[u8],
        max_bytes: u64,
        max_entries: u64,
    ) -> Result<Summary, ArchiveError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("upload");
        std::fs::write(&path, bytes).unwrap();
        check(&path, max_bytes, max_entries)
    }

    fn refused(bytes: &[u8], needle: &str) {
        match check_bytes(bytes, 100 * MIB, 1000) {
            Err(ArchiveError::Invalid(why)) => {
                assert!(why.contains(needle), "wanted {needle:?} in {why:?}")
            }
            other => panic!("wanted Invalid({needle:?}), got {other:?}"),
        }
    }

    /// What the SDKs send for `copy("files", …)`: directories, files, links.
    fn sdk_like() -> Vec<u8> {
        let mut b = Builder::new(Vec::new());
        b.append(&header(b"files/", EntryType::Directory, 0), io::empty())
            .unwrap();
        file(&mut b, "files/a.txt", b"hello");
        b.append(&header(b"files/sub/", EntryType::Directory, 0), io::empty())
            .unwrap();
        file(&mut b, "files/sub/b.txt", b"abc");
        b.append(
            &link_header(b"files/etc", EntryType::Symlink, b"/etc/passwd"),
            io::empty(),
        )
        .unwrap();
        b.append(
            &link_header(b"files/up", EntryType::Symlink, b"../../x"),
            io::empty(),
        )
        .unwrap();
        b.append(
            &link_header(b"files/hard", EntryType::Link, b"files/a.txt"),
            io::empty(),
        )
        .unwrap();
        let long = format!("files/{}/c.txt", "d".repeat(150));
        file(&mut b, &long, b"0123456789");
        finish(b)
    }

    #[test]
    fn plain_and_gzip_archives_are_accepted_with_counts() {
        let tar = sdk_like();
        let want = |gzip| Summary {
            gzip,
            entries: 8,
            bytes: 18,
        };
        assert_eq!(check_bytes(&tar, 18, 8).unwrap(), want(false));
        assert_eq!(check_bytes(&gz(&tar), 18, 8).unwrap(), want(true));
    }

    #[test]
    fn empty_archives_are_valid_but_an_empty_file_is_not() {
        let empty = finish(Builder::new(Vec::new()));
        let none = |gzip| Summary {
            gzip,
            entries: 0,
            bytes: 0,
        };
        assert_eq!(check_bytes(&empty, 0, 0).unwrap(), none(false));
        assert_eq!(check_bytes(&gz(&empty), 0, 0).unwrap(), none(true));
        // tar pads to a 10 KiB record; that is fine after the end marker.
        let mut padded = sdk_like();
        padded.resize(padded.len().next_multiple_of(10240), 0);
        assert!(check_bytes(&padded, MIB, 100).is_ok());
        refused(b"", "the file is empty");
    }

    #[test]
    fn pax_names_are_honoured() {
        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("path", b"files/long-pax-name.txt")]);
        b.append(&header(b"short", EntryType::Regular, 2), &b"hi"[..])
            .unwrap();
        let s = check_bytes(&finish(b), MIB, 10).unwrap();
        assert_eq!((s.entries, s.bytes), (1, 2));
    }

    #[test]
    fn escaping_names_are_refused() {
        for (name, why) in [
            (&b"../x"[..], "'..' component"),
            (b"/etc/x", "absolute path"),
            (b"a/../../x", "'..' component"),
            (b"a/..", "'..' component"),
            (b"..", "'..' component"),
        ] {
            let mut b = Builder::new(Vec::new());
            file(&mut b, "ok", b"1");
            b.append(&header(name, EntryType::Regular, 1), &b"x"[..])
                .unwrap();
            let tar = finish(b);
            refused(&tar, why);
            refused(&gz(&tar), why);
        }
    }

    #[test]
    fn devices_fifos_and_other_types_are_refused() {
        for (kind, why) in [
            (EntryType::Char, "character device"),
            (EntryType::Block, "block device"),
            (EntryType::Fifo, "fifo"),
            (EntryType::Continuous, "contiguous"),
            (EntryType::XGlobalHeader, "PAX global header"),
            (EntryType::new(b'Z'), "type 'Z'"),
        ] {
            let mut b = Builder::new(Vec::new());
            b.append(&header(b"dev/thing", kind, 0), io::empty())
                .unwrap();
            let tar = finish(b);
            refused(&tar, why);
            refused(&tar, "dev/thing: ");
        }
    }

    #[test]
    fn hard_links_must_stay_inside() {
        for (target, why) in [
            (&b"../x"[..], "'..' component"),
            (b"/etc/shadow", "absolute path"),
            (b"a/../../x", "'..' component"),
        ] {
            let mut b = Builder::new(Vec::new());
            b.append(&link_header(b"h", EntryType::Link, target), io::empty())
                .unwrap();
            refused(&finish(b), why);
        }
        let mut b = Builder::new(Vec::new());
        b.append(&header(b"h", EntryType::Link, 0), io::empty())
            .unwrap();
        refused(&finish(b), "without a target");
        // A PAX linkpath counts as well as the header's.
        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("linkpath", b"../../etc/shadow")]);
        b.append(&link_header(b"h", EntryType::Link, b"ok"), io::empty())
            .unwrap();
        refused(&finish(b), "'..' component");
    }

    #[test]
    fn nul_in_names_or_link_targets_is_refused() {
        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("path", b"a\0b")]);
        b.append(&header(b"a", EntryType::Regular, 0), io::empty())
            .unwrap();
        refused(&finish(b), "NUL");
        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("linkpath", b"/x\0/y")]);
        b.append(&link_header(b"l", EntryType::Symlink, b"x"), io::empty())
            .unwrap();
        refused(&finish(b), "NUL");
    }

    #[test]
    fn names_gnu_tar_would_read_differently_are_checked_too() {
        // A GNU long name the crate uses, with a PAX path GNU tar uses.
        let mut b = Builder::new(Vec::new());
        let long = b"fine/long/name\0";
        b.append(
            &header(b"././@LongLink", EntryType::GNULongName, long.len() as u64),
            &long[..],
        )
        .unwrap();
        pax(&mut b, &[("path", b"../evil")]);
        b.append(&header(b"x", EntryType::Regular, 0), io::empty())
            .unwrap();
        refused(&finish(b), "'..' component is not allowed (as ../evil)");

        // A POSIX magic with an odd version: GNU tar joins the prefix, the crate does not.
        let mut h = header(b"etc/x", EntryType::Regular, 0);
        let raw = h.as_mut_bytes();
        raw[257..263].copy_from_slice(b"ustar\0");
        raw[263..265].copy_from_slice(b"xx");
        raw[345..347].copy_from_slice(b"..");
        h.set_cksum();
        let mut b = Builder::new(Vec::new());
        b.append(&h, io::empty()).unwrap();
        refused(&finish(b), "'..' component");

        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("size", b"1"), ("size", b"0")]);
        b.append(&header(b"x", EntryType::Regular, 0), io::empty())
            .unwrap();
        refused(&finish(b), "given twice");

        let mut b = Builder::new(Vec::new());
        pax(&mut b, &[("GNU.sparse.name", b"../x")]);
        b.append(&header(b"x", EntryType::Regular, 0), io::empty())
            .unwrap();
        refused(&finish(b), "sparse");

        let mut b = Builder::new(Vec::new());
        b.append(&header(b"d/", EntryType::Directory, 512), &[0u8; 512][..])
            .unwrap();
        refused(&finish(b), "with data");

        let mut b = Builder::new(Vec::new());
        b.append(&header(b"d/", EntryType::new(0), 0), io::empty())
            .unwrap();
        refused(&finish(b), "may end in '/'");
    }

    #[test]
    fn size_and_member_limits() {
        let tar = sdk_like();
        match check_bytes(&tar, 17, 100) {
            Err(ArchiveError::TooLarge { limit: 17 }) => {}
            other => panic!("{other:?}"),
        }
        match check_bytes(&gz(&tar), 17, 100) {
            Err(ArchiveError::TooLarge { limit: 17 }) => {}
            other => panic!("{other:?}"),
        }
        match check_bytes(&tar, MIB, 7) {
            Err(ArchiveError::Invalid(why)) => assert!(why.contains("too many members"), "{why}"),
            other => panic!("{other:?}"),
        }
        let mut b = Builder::new(Vec::new());
        file(&mut b, "big", &vec![7u8; 2000]);
        assert!(matches!(
            check_bytes(&finish(b), 1999, 10),
            Err(ArchiveError::TooLarge { limit: 1999 })
        ));
    }

    #[test]
    fn garbage_and_truncated_archives_are_refused() {
        let mut noise = Vec::new();
        let mut x: u32 = 0x1234_5678;
        for _ in 0..4096 {
            // xorshift: fixed, non-zero, tar-unlike bytes.
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            noise.push(x as u8);
        }
        refused(&noise, "not a tar archive");
        refused(b"hello", "not a tar archive");
        let mut fake_gz = vec![0x1f, 0x8b];
        fake_gz.extend_from_slice(&noise);
        refused(&fake_gz, "not a tar archive");

        let tar = sdk_like();
        let gz_tar = gz(&tar);
        refused(&gz_tar[..gz_tar.len() / 2], "not a tar archive");
        // Only the gzip trailer (CRC and length) is cut: still refused.
        refused(&gz_tar[..gz_tar.len() - 4], "not a tar archive");
        let mut b = Builder::new(Vec::new());
        file(&mut b, "f", &[1u8; 4000]);
        let whole = finish(b);
        refused(&whole[..2000], "not a tar archive");
        // A header with a bad checksum.
        let mut bad = tar.clone();
        bad[0] ^= 1;
        refused(&bad, "not a tar archive");
        // Trailing data that is no padding.
        let mut trailing = tar.clone();
        trailing.extend(std::iter::repeat_n(1u8, 2 * MIB as usize));
        refused(&trailing, "follow the end of the archive");
    }

    /// Concatenated gzip members of 1 MiB of zeros each: decompresses like one stream (as
    /// gzip does), costs kilobytes, and can be made as big as needed quickly.
    fn zeros_gz(mib: usize) -> Vec<u8> {
        let one = gz(&vec![0u8; MIB as usize]);
        one.repeat(mib)
    }

    #[test]
    fn a_gzip_bomb_is_stopped_at_the_cap() {
        let start = Instant::now();
        // One member declaring 200 MiB of zeros.
        let mut bomb = gz(header(b"zeros", EntryType::Regular, 200 * MIB).as_bytes());
        bomb.extend(zeros_gz(200));
        assert!(bomb.len() < 2 * MIB as usize, "{}", bomb.len());
        assert!(matches!(
            check_bytes(&bomb, 10 * MIB, 1000),
            Err(ArchiveError::TooLarge { limit }) if limit == 10 * MIB
        ));

        // Many 1 MiB members: refused at the eleventh, before the garbage at the end, which
        // would make it Invalid if it were read.
        let mib_of_zeros = zeros_gz(1);
        let mut bomb = Vec::new();
        for i in 0..200 {
            let name = format!("z{i}");
            bomb.extend(gz(
                header(name.as_bytes(), EntryType::Regular, MIB).as_bytes()
            ));
            bomb.extend_from_slice(&mib_of_zeros);
        }
        bomb.extend_from_slice(b"garbage, not gzip");
        assert!(matches!(
            check_bytes(&bomb, 10 * MIB, 1000),
            Err(ArchiveError::TooLarge { .. })
        ));
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn oversized_headers_are_not_read_into_memory() {
        // A PAX header declaring 200 MiB: the crate would read it whole.
        let mut bomb = gz(header(b"PaxHeader", EntryType::XHeader, 200 * MIB).as_bytes());
        bomb.extend(zeros_gz(200));
        match check_bytes(&bomb, 10 * MIB, 1000) {
            Err(ArchiveError::Invalid(why)) => assert!(why.contains("headers"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_map_to_the_project_kinds() {
        use crate::model::ErrorKind;
        assert_eq!(
            ArchiveError::TooLarge { limit: 1 }.into_error().kind,
            ErrorKind::TooLarge
        );
        let e = ArchiveError::Invalid("x: y".into()).into_error();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::Invalid, "invalid archive: x: y")
        );
        let e = ArchiveError::Io(io::Error::from_raw_os_error(libc::ENOSPC)).into_error();
        assert_eq!(e.kind, ErrorKind::StorageFull);
        let missing = check(Path::new("/nonexistent/upload"), 1, 1);
        assert!(matches!(missing, Err(ArchiveError::Io(_))));
    }
}
