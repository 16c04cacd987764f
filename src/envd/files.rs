//! `/files`: downloads (raw bytes, gzip on request) and uploads (multipart with one or more
//! `file` parts named by their destination path, or a raw `application/octet-stream` body,
//! either optionally gzip-encoded), streamed to and from disk as the selected user, and
//! `/files/compose`, which concatenates uploaded parts into one file.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::time::Duration;

use async_compression::tokio::bufread::{GzipDecoder, GzipEncoder};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio_util::io::{ReaderStream, StreamReader};

use super::auth::{FileAuth, Operation, check_file_access};
use super::creds::{Identity, check_can_act_as, run_as};
use super::encoding::{Encoding, accept_encoding, content_type_for};
use super::entry::{metadata_from_headers, read_metadata, validate_metadata, write_metadata};
use super::errors::HttpError;
use super::fileio::{FileSink, READ_BLOCK, file_stream};
use super::http::header_token;
use super::paths::resolve;
use super::state::Envd;
use super::users::User;
use std::sync::Arc;

/// An upload that sends nothing for this long is abandoned (its file stays as far as written).
const UPLOAD_IDLE: Duration = Duration::from_secs(60);

type ByteStream = Pin<Box<dyn Stream<Item = std::io::Result<Bytes>> + Send>>;

fn query(req: &Request) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (k, v) in form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes()) {
        out.entry(k.into_owned()).or_insert_with(|| v.into_owned());
    }
    out
}

fn bad(msg: impl Into<String>) -> HttpError {
    HttpError::new(StatusCode::BAD_REQUEST, msg)
}

/// Signature or token, then the user: what both directions check first.
fn authorize(
    envd: &Envd,
    req: &Request,
    q: &BTreeMap<String, String>,
    op: Operation,
) -> Result<(User, String), HttpError> {
    let path = q.get("path").cloned().unwrap_or_default();
    let token = envd.access_token();
    let auth = FileAuth {
        header_token: header_token(req.headers()),
        signature: q.get("signature").map(String::as_str),
        expiration: q.get("signature_expiration").map(String::as_str),
        username: q.get("username").map(String::as_str),
        path: &path,
    };
    check_file_access(token.as_deref(), &auth, op, chrono::Utc::now().timestamp())
        .map_err(|m| HttpError::new(StatusCode::UNAUTHORIZED, m))?;
    let (user, _db) = envd
        .select_user(q.get("username").map(String::as_str))
        .map_err(|e| {
            HttpError::new(
                StatusCode::UNAUTHORIZED,
                format!("error looking up user '{}': unknown user {}", e.0, e.0),
            )
        })?;
    check_can_act_as(&user)?;
    Ok((user, path))
}

fn resolve_for(envd: &Envd, user: &User, path: &str) -> Result<PathBuf, HttpError> {
    resolve(path, &user.home, envd.settings().default_workdir.as_deref())
        .map_err(|e| bad(format!("error expanding and resolving path '{path}': {e}")))
}

/// `inline; filename=…` as Go's mime.FormatMediaType writes it: bare when it is a token,
/// quoted when it needs to be, RFC 2231-encoded when it is not ASCII.
fn content_disposition(name: &str) -> String {
    let tspecial = |c: char| "()<>@,;:\\\"/[]?=".contains(c);
    if !name.is_ascii() {
        let enc: String = name
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        return format!("inline; filename*=utf-8''{enc}");
    }
    if !name.is_empty() && name.chars().all(|c| c > ' ' && c < '\x7f' && !tspecial(c)) {
        return format!("inline; filename={name}");
    }
    let quoted: String = name
        .chars()
        .map(|c| {
            if c == '"' || c == '\\' {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect();
    format!("inline; filename=\"{quoted}\"")
}

pub async fn download(State(envd): State<Arc<Envd>>, req: Request) -> Result<Response, HttpError> {
    let q = query(&req);
    let (user, path) = authorize(&envd, &req, &q, Operation::Read)?;
    let resolved = resolve_for(&envd, &user, &path)?;
    let h = req.headers();
    let mut enc = accept_encoding(h.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()))
        .map_err(|m| HttpError::new(StatusCode::NOT_ACCEPTABLE, m))?;
    let ranged = [
        header::RANGE,
        header::IF_MODIFIED_SINCE,
        header::IF_NONE_MATCH,
        header::IF_RANGE,
    ]
    .iter()
    .any(|k| h.contains_key(k));
    if ranged && enc.encoding != Encoding::Identity {
        // Ranges and conditions are about the identity representation.
        if enc.identity_rejected {
            return Err(HttpError::new(
                StatusCode::NOT_ACCEPTABLE,
                "identity encoding is required for range requests",
            ));
        }
        enc.encoding = Encoding::Identity;
    }
    let shown = resolved.clone();
    let (file, len) = run_as(Identity::of(&user), move || {
        let meta = std::fs::metadata(&shown).map_err(|e| match e.kind() {
            ErrorKind::NotFound => HttpError::new(
                StatusCode::NOT_FOUND,
                format!("path '{}' does not exist", shown.display()),
            ),
            _ => HttpError::io(
                format!("error checking if path exists '{}'", shown.display()),
                &e,
            ),
        })?;
        if meta.is_dir() {
            return Err(bad(format!("path '{}' is a directory", shown.display())));
        }
        let f = std::fs::File::open(&shown)
            .map_err(|e| HttpError::io(format!("error opening file '{}'", shown.display()), &e))?;
        Ok((f, meta.len()))
    })
    .await??;
    let name = resolved
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let data = file_stream(file, READ_BLOCK);
    let mut res = Response::builder()
        .status(StatusCode::OK)
        .header(header::VARY, "Accept-Encoding")
        .header(header::CONTENT_TYPE, content_type_for(&name));
    if let Ok(v) = HeaderValue::from_str(&content_disposition(&name)) {
        res = res.header(header::CONTENT_DISPOSITION, v);
    }
    let body = match enc.encoding {
        Encoding::Gzip => {
            res = res.header(header::CONTENT_ENCODING, "gzip");
            let gz = GzipEncoder::new(StreamReader::new(data));
            Body::from_stream(ReaderStream::with_capacity(gz, 64 * 1024))
        }
        Encoding::Identity => {
            res = res.header(header::CONTENT_LENGTH, len);
            Body::from_stream(data)
        }
    };
    res.body(body)
        .map_err(|e| HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// One written file in the upload's answer.
#[derive(Debug, Serialize)]
pub struct Written {
    path: String,
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<BTreeMap<String, String>>,
}

/// The request body, decoded when it says `Content-Encoding: gzip`, and with an idle limit.
fn body_stream(headers: &HeaderMap, body: Body) -> Result<ByteStream, HttpError> {
    let raw = body.into_data_stream().map_err(std::io::Error::other);
    let idle = futures::stream::unfold(Box::pin(raw), |mut s| async move {
        match tokio::time::timeout(UPLOAD_IDLE, s.next()).await {
            Ok(Some(item)) => Some((item, s)),
            Ok(None) => None,
            Err(_) => Some((
                Err(std::io::Error::new(ErrorKind::TimedOut, "upload stalled")),
                s,
            )),
        }
    });
    let ce = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    match ce.as_str() {
        "" | "identity" => Ok(Box::pin(idle)),
        "gzip" => {
            let dec = GzipDecoder::new(StreamReader::new(idle));
            Ok(Box::pin(ReaderStream::with_capacity(dec, 64 * 1024)))
        }
        other => Err(bad(format!(
            "unsupported Content-Encoding: {other}, supported: [gzip]"
        ))),
    }
}

fn read_error(e: std::io::Error) -> HttpError {
    match e.kind() {
        ErrorKind::TimedOut => HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("error reading the upload: {e}"),
        ),
        _ => bad(format!("error reading the upload: {e}")),
    }
}

fn write_error(e: &std::io::Error) -> HttpError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => HttpError::new(
            StatusCode::INSUFFICIENT_STORAGE,
            format!("not enough disk space available: {e}"),
        ),
        _ => HttpError::io("error writing file", e),
    }
}

/// Creates the missing parents of `path` (as the calling thread's identity) and opens it for
/// writing, truncated.
fn open_for_upload(path: &Path, owner: Option<(u32, u32)>) -> Result<std::fs::File, HttpError> {
    if let Some(parent) = path.parent() {
        match std::fs::metadata(parent) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return Err(bad(format!("path is a file: {}", parent.display()))),
            Err(_) => std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc::ENOTDIR) | Some(libc::EEXIST) => {
                        bad(format!("error ensuring directories: {e}"))
                    }
                    _ => write_error(&e),
                })?,
        }
    }
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Err(bad(format!("path is a directory: {}", path.display())));
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o666)
        .open(path)
        .map_err(|e| write_error(&e))?;
    // The file is the writer's already; e2b's envd gives it its owner after opening it all the
    // same, and watchers see that as a CHMOD event between the CREATE and the WRITEs.
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
            .map_err(|e| HttpError::io("error changing file ownership", &e))?;
    }
    Ok(file)
}

/// Streams one file to disk as `id`, then stores its metadata.
async fn write_one<S, E>(
    id: &Identity,
    path: PathBuf,
    mut data: S,
    metadata: &BTreeMap<String, String>,
) -> Result<Written, HttpError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: Into<HttpError>,
{
    // The first chunk before the file is touched: a body that fails at once (bad gzip) must
    // not truncate what is there.
    let first = match data.next().await {
        Some(c) => Some(c.map_err(Into::into)?),
        None => None,
    };
    let target = path.clone();
    let existed = std::fs::symlink_metadata(&path).is_ok();
    let owner = Some((id.uid, id.gid));
    let file = run_as(id.clone(), move || open_for_upload(&target, owner)).await??;
    let mut sink = FileSink::new(file);
    let streamed = async {
        if let Some(chunk) = first {
            sink.write(chunk).await.map_err(|e| write_error(&e))?;
            // Only a stream that has not ended is polled again: the idle-limited body is an
            // `unfold`, which panics when polled after its end (an empty upload did that).
            while let Some(chunk) = data.next().await {
                let chunk = chunk.map_err(Into::into)?;
                sink.write(chunk).await.map_err(|e| write_error(&e))?;
            }
        }
        Ok::<_, HttpError>(())
    }
    .await;
    // The writer finishes what it was given either way, so that a failed upload's file is not
    // removed under it.
    let finished = sink.finish().await.map_err(|e| write_error(&e));
    let std_file = match streamed.and(finished) {
        Ok(f) => f,
        Err(e) => {
            // A file this upload created and could not finish is not left half-written.
            if !existed {
                let _ = std::fs::remove_file(&path);
            }
            return Err(e);
        }
    };
    let md = metadata.clone();
    run_as(id.clone(), move || write_metadata(&std_file, &md))
        .await?
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => HttpError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                format!("not enough space for file metadata: {e}"),
            ),
            _ => HttpError::io("error writing file metadata", &e),
        })?;
    let stored = read_metadata(&path);
    Ok(Written {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        path: path.to_string_lossy().into_owned(),
        kind: "file",
        metadata: (!stored.is_empty()).then_some(stored),
    })
}

impl From<std::io::Error> for HttpError {
    fn from(e: std::io::Error) -> HttpError {
        read_error(e)
    }
}

impl From<multer::Error> for HttpError {
    fn from(e: multer::Error) -> HttpError {
        match e {
            multer::Error::StreamReadFailed(inner) => match inner.downcast::<std::io::Error>() {
                Ok(io) => read_error(*io),
                Err(other) => bad(format!("error reading form: {other}")),
            },
            other => bad(format!("error reading form: {other}")),
        }
    }
}

pub async fn upload(State(envd): State<Arc<Envd>>, req: Request) -> Result<Response, HttpError> {
    let q = query(&req);
    let (user, path) = authorize(&envd, &req, &q, Operation::Write)?;
    let metadata = metadata_from_headers(req.headers());
    validate_metadata(&metadata).map_err(|m| bad(format!("invalid metadata: {m}")))?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let id = Identity::of(&user);
    let (parts, body) = req.into_parts();
    let stream = body_stream(&parts.headers, body)?;
    let mut written = Vec::new();
    if media == "application/octet-stream" {
        if !q.contains_key("path") {
            return Err(bad("path query parameter is required for raw body upload"));
        }
        let target = resolve_for(&envd, &user, &path)?;
        written.push(write_one(&id, target, stream, &metadata).await?);
    } else if media.starts_with("multipart/") {
        let boundary = multer::parse_boundary(&content_type)
            .map_err(|e| bad(format!("error parsing multipart form: {e}")))?;
        let mut form = multer::Multipart::new(stream, boundary);
        while let Some(field) = form.next_field().await? {
            if field.name() != Some("file") {
                continue;
            }
            // The `path` parameter names the destination; else the part's file name does.
            let dest = match q.get("path") {
                Some(p) => p.clone(),
                None => field.file_name().unwrap_or("").to_string(),
            };
            let target = resolve_for(&envd, &user, &dest)?;
            let target_s = target.to_string_lossy().into_owned();
            if written.iter().any(|w: &Written| w.path == target_s) {
                return Err(bad(format!(
                    "you cannot upload multiple files to the same path '{target_s}' in one upload request, only the first specified file was uploaded"
                )));
            }
            written.push(write_one(&id, target, field, &metadata).await?);
        }
    } else {
        return Err(bad(format!(
            "unsupported content type: {content_type}, expected multipart/form-data or application/octet-stream"
        )));
    }
    Ok(axum::Json(written).into_response())
}

#[derive(Debug, Deserialize)]
pub struct ComposeBody {
    source_paths: Vec<String>,
    destination: String,
    username: Option<String>,
}

pub async fn compose(State(envd): State<Arc<Envd>>, body: Bytes) -> Result<Response, HttpError> {
    let b: ComposeBody =
        serde_json::from_slice(&body).map_err(|e| bad(format!("invalid request body: {e}")))?;
    if b.source_paths.is_empty() {
        return Err(bad("source_paths must not be empty"));
    }
    if b.destination.is_empty() {
        return Err(bad("destination is required"));
    }
    let (user, _db) = envd.select_user(b.username.as_deref()).map_err(|e| {
        HttpError::new(
            StatusCode::UNAUTHORIZED,
            format!("error looking up user '{}': unknown user {}", e.0, e.0),
        )
    })?;
    check_can_act_as(&user)?;
    let dest = resolve_for(&envd, &user, &b.destination)?;
    let mut sources = Vec::new();
    for s in &b.source_paths {
        let r = resolve_for(&envd, &user, s)?;
        if r == dest {
            return Err(bad(format!(
                "source path {s:?} cannot be the same as destination"
            )));
        }
        sources.push((s.clone(), r));
    }
    let out = dest.clone();
    run_as(Identity::of(&user), move || -> Result<(), HttpError> {
        for (shown, s) in &sources {
            match std::fs::metadata(s) {
                Err(_) => {
                    return Err(HttpError::new(
                        StatusCode::NOT_FOUND,
                        format!("source file not found: {shown}"),
                    ));
                }
                Ok(m) if !m.is_file() => {
                    return Err(bad(format!("source path is not a regular file: {shown}")));
                }
                Ok(_) => {}
            }
        }
        // Assembled beside the destination and renamed into place, so a failure midway leaves
        // any earlier file intact.
        let tmp = PathBuf::from(format!(
            "{}.e2b-compose.{:016x}.tmp",
            out.display(),
            rand::random::<u64>()
        ));
        let mut f = open_for_upload(&tmp, None)?;
        let copied = (|| -> Result<(), HttpError> {
            for (_, s) in &sources {
                let mut src = std::fs::File::open(s)
                    .map_err(|e| HttpError::io("error opening source file", &e))?;
                std::io::copy(&mut src, &mut f).map_err(|e| write_error(&e))?;
            }
            std::fs::rename(&tmp, &out).map_err(|e| HttpError::io("error finalizing compose", &e))
        })();
        if copied.is_err() {
            let _ = std::fs::remove_file(&tmp);
            return copied;
        }
        for (_, s) in &sources {
            let _ = std::fs::remove_file(s);
        }
        Ok(())
    })
    .await??;
    let name = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Ok(axum::Json(
        serde_json::json!({"path": dest.to_string_lossy(), "name": name, "type": "file"}),
    )
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispositions_as_go_formats_them() {
        assert_eq!(content_disposition("test.txt"), "inline; filename=test.txt");
        assert_eq!(
            content_disposition("my document.pdf"),
            "inline; filename=\"my document.pdf\""
        );
        assert_eq!(
            content_disposition("file\"name.txt"),
            "inline; filename=\"file\\\"name.txt\""
        );
        assert_eq!(
            content_disposition("文档.pdf"),
            "inline; filename*=utf-8''%E6%96%87%E6%A1%A3.pdf"
        );
        assert_eq!(content_disposition(".env"), "inline; filename=.env");
    }
}
