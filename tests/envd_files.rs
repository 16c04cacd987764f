//! `/files` and the filesystem service over raw HTTP: gzip both ways, multipart with several
//! files, octet-stream, metadata, compose, the error statuses envd gives (400/401/404/406/507),
//! and, as root, that every operation runs with the selected user's permissions.

#[path = "envd_harness.rs"]
mod harness;

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;

use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn gzip(data: &[u8]) -> Vec<u8> {
    // A stored (uncompressed) deflate stream in a gzip wrapper: valid gzip without a compressor.
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    let mut chunks = data.chunks(65535).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0, 0xff, 0xff]);
    }
    while let Some(c) = chunks.next() {
        out.push(if chunks.peek().is_none() { 1 } else { 0 });
        let len = c.len() as u16;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&(!len).to_le_bytes());
        out.extend_from_slice(c);
    }
    out.extend_from_slice(&crc32(data).to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out
}

fn crc32(data: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in data {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xedb8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn multipart(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "envd-test-boundary-7f3a";
    let mut body = Vec::new();
    for (name, data) in parts {
        write!(body, "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").unwrap();
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    write!(body, "--{boundary}--\r\n").unwrap();
    (format!("multipart/form-data; boundary={boundary}"), body)
}

async fn upload(
    e: &Envd,
    query: &[(&str, &str)],
    ct: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    let mut r = e
        .req(reqwest::Method::POST, "/files")
        .query(query)
        .header("content-type", ct)
        .body(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let res = r.send().await.unwrap();
    let st = res.status();
    let text = res.text().await.unwrap();
    (
        st,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_and_downloads() {
    let e = Envd::start(&[]);
    let dir = e.agent.dir.path().join("f");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let d = dir.display().to_string();
    let root = [("username", "root")];

    // Multipart with two files named by their paths; parents are created.
    let (ct, body) = multipart(&[
        (&format!("{d}/one.txt"), b"1"),
        (&format!("{d}/sub/two.bin"), b"\x00two"),
    ]);
    let (st, v) = upload(&e, &root, &ct, body, &[]).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert_eq!(
        v[0],
        json!({"path": format!("{d}/one.txt"), "name": "one.txt", "type": "file"})
    );
    assert_eq!(std::fs::read(dir.join("sub/two.bin")).unwrap(), b"\x00two");
    // The same path twice in one request is refused.
    let (ct, body) = multipart(&[
        (&format!("{d}/dup.txt"), b"a"),
        (&format!("{d}/dup.txt"), b"b"),
    ]);
    assert_eq!(
        upload(&e, &root, &ct, body, &[]).await.0,
        StatusCode::BAD_REQUEST
    );
    // Gzip-encoded multipart and octet-stream bodies.
    let (ct, body) = multipart(&[(&format!("{d}/gz-multi.txt"), b"zipped form")]);
    let (st, _) = upload(&e, &root, &ct, gzip(&body), &[("content-encoding", "gzip")]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        std::fs::read_to_string(dir.join("gz-multi.txt")).unwrap(),
        "zipped form"
    );
    let big: Vec<u8> = (0..3 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let p = format!("{d}/gz.bin");
    let (st, _) = upload(
        &e,
        &[("path", &p), ("username", "root")],
        "application/octet-stream",
        gzip(&big),
        &[("content-encoding", "gzip")],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(std::fs::read(&p).unwrap(), big);
    // Octet-stream needs a path; unknown encodings and content types are refused.
    assert_eq!(
        upload(&e, &root, "application/octet-stream", b"x".to_vec(), &[])
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        upload(
            &e,
            &[("path", &p)],
            "application/octet-stream",
            b"x".to_vec(),
            &[("content-encoding", "br")]
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        upload(&e, &[("path", &p)], "application/json", b"{}".to_vec(), &[])
            .await
            .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        upload(
            &e,
            &[("path", &p), ("username", "root")],
            "application/octet-stream",
            b"not gzip".to_vec(),
            &[("content-encoding", "gzip")]
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    // A directory cannot be overwritten; an unknown user is 401.
    assert_eq!(
        upload(
            &e,
            &[("path", &d), ("username", "root")],
            "application/octet-stream",
            b"x".to_vec(),
            &[]
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        upload(
            &e,
            &[("path", &p), ("username", "ghost")],
            "application/octet-stream",
            b"x".to_vec(),
            &[]
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );

    // Metadata goes to xattrs and comes back in the answer and in EntryInfo.
    let mp = format!("{d}/meta.txt");
    let (st, v) = upload(
        &e,
        &[("path", &mp), ("username", "root")],
        "application/octet-stream",
        b"m".to_vec(),
        &[("x-metadata-Owner", "me"), ("X-Metadata-kind", "test")],
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    if v[0].get("metadata").is_some() {
        assert_eq!(v[0]["metadata"], json!({"owner": "me", "kind": "test"}));
        let (_, info) = e
            .unary_as(
                "filesystem.Filesystem/Stat",
                json!({"path": mp}),
                Some("root"),
            )
            .await;
        assert_eq!(
            info["entry"]["metadata"],
            json!({"owner": "me", "kind": "test"})
        );
    }
    assert_eq!(
        upload(
            &e,
            &[("path", &mp)],
            "application/octet-stream",
            b"m".to_vec(),
            &[("x-metadata-bad", "tab\there")]
        )
        .await
        .0,
        StatusCode::BAD_REQUEST
    );

    // Downloads: raw, gzip, and the refusals.
    let get = |q: Vec<(&'static str, String)>, ae: Option<&'static str>| {
        let mut r = e.req(reqwest::Method::GET, "/files").query(&q);
        if let Some(a) = ae {
            r = r.header("accept-encoding", a);
        }
        r.send()
    };
    let r = get(vec![("path", p.clone()), ("username", "root".into())], None)
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-length"],
        big.len().to_string().as_str()
    );
    assert_eq!(r.bytes().await.unwrap().to_vec(), big);
    let r = get(
        vec![("path", p.clone()), ("username", "root".into())],
        Some("gzip"),
    )
    .await
    .unwrap();
    assert_eq!(r.headers()["content-encoding"], "gzip");
    // reqwest here does not decompress: undo the gzip by hand through the agent's own stream.
    let zipped = r.bytes().await.unwrap().to_vec();
    assert!(zipped.len() < big.len(), "compressed");
    let mut z = gunzip_with_shell(&zipped);
    let mut back = Vec::new();
    z.read_to_end(&mut back).unwrap();
    assert_eq!(back, big);
    assert_eq!(
        get(
            vec![
                ("path", format!("{d}/missing")),
                ("username", "root".into())
            ],
            None
        )
        .await
        .unwrap()
        .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        get(vec![("path", d.clone()), ("username", "root".into())], None)
            .await
            .unwrap()
            .status(),
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        get(
            vec![("path", p.clone()), ("username", "ghost".into())],
            None
        )
        .await
        .unwrap()
        .status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        get(
            vec![("path", p.clone()), ("username", "root".into())],
            Some("br, identity;q=0")
        )
        .await
        .unwrap()
        .status(),
        StatusCode::NOT_ACCEPTABLE
    );
    assert_eq!(
        get(
            vec![("path", "~root/x".into()), ("username", "root".into())],
            None
        )
        .await
        .unwrap()
        .status(),
        StatusCode::BAD_REQUEST
    );

    // Compose concatenates and removes the parts.
    std::fs::write(dir.join("part1"), "ab").unwrap();
    std::fs::write(dir.join("part2"), "cd").unwrap();
    let r = e
        .req(reqwest::Method::POST, "/files/compose")
        .body(json!({"source_paths": [format!("{d}/part1"), format!("{d}/part2")], "destination": format!("{d}/whole"), "username": "root"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(std::fs::read_to_string(dir.join("whole")).unwrap(), "abcd");
    assert!(!dir.join("part1").exists());
    let r = e.req(reqwest::Method::POST, "/files/compose").body(json!({"source_paths": [format!("{d}/nope")], "destination": format!("{d}/w2"), "username": "root"}).to_string()).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// gzip -d from the system, so the test does not depend on the code under test.
fn gunzip_with_shell(data: &[u8]) -> std::io::Cursor<Vec<u8>> {
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("gzip");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    assert!(out.status.success());
    std::io::Cursor::new(out.stdout)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_507() {
    if !is_root() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    // Mounted before the agent starts: it lives in its own copy of the mount table.
    let outer = tempfile::tempdir().unwrap();
    let small = outer.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m"])
        .arg("tmpfs")
        .arg(&small)
        .status()
        .unwrap();
    if !ok.success() {
        eprintln!("skipped: cannot mount tmpfs here");
        return;
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(small.clone());
    let e = Envd::start(&[]);
    let p = small.join("big.bin").display().to_string();
    let (st, v) = upload(
        &e,
        &[("path", &p), ("username", "root")],
        "application/octet-stream",
        vec![7u8; 3 << 20],
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::INSUFFICIENT_STORAGE, "{v}");
    assert_eq!(v["code"], 507);
    let (ct, body) = multipart(&[(&small.join("m.bin").display().to_string(), &[1u8; 3 << 20])]);
    assert_eq!(
        upload(&e, &[("username", "root")], &ct, body, &[]).await.0,
        StatusCode::INSUFFICIENT_STORAGE
    );
    assert!(e.healthy().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_run_with_the_selected_users_permissions() {
    let e = Envd::start(&[]);
    if !e.agent.has_user {
        eprintln!("skipped: needs root (a sandbox-like /etc/passwd with a non-root user)");
        return;
    }
    let home = e.agent.home();
    let secret = e.agent.dir.path().join("root-only");
    std::fs::create_dir(&secret).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::write(secret.join("s.txt"), "secret").unwrap();
    let s = secret.display().to_string();

    // The default user (no username) is `user`: relative paths are in its home, files are its.
    let (st, v) = upload(
        &e,
        &[("path", "notes/n.txt")],
        "application/octet-stream",
        b"mine".to_vec(),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v[0]["path"], home.join("notes/n.txt").display().to_string());
    assert_eq!(
        std::fs::metadata(home.join("notes/n.txt")).unwrap().uid(),
        USER_UID
    );
    assert_eq!(
        std::fs::metadata(home.join("notes")).unwrap().uid(),
        USER_UID,
        "created parents are the user's too"
    );
    let (st, _) = upload(
        &e,
        &[("path", &format!("{s}/x"))],
        "application/octet-stream",
        b"no".to_vec(),
        &[],
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let r = e
        .req(reqwest::Method::GET, "/files")
        .query(&[("path", format!("{s}/s.txt"))])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = e
        .req(reqwest::Method::GET, "/files")
        .query(&[("path", format!("{s}/s.txt")), ("username", "root".into())])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/MakeDir",
            json!({"path": "made"}),
            Some("user"),
        )
        .await;
    assert_eq!(v["entry"]["owner"], "user", "{v}");
    assert_eq!(v["entry"]["path"], home.join("made").display().to_string());
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/MakeDir",
            json!({"path": "made"}),
            Some("user"),
        )
        .await;
    assert_eq!(v["code"], "already_exists");
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/MakeDir",
            json!({"path": format!("{s}/d")}),
            Some("user"),
        )
        .await;
    assert_eq!(v["code"], "permission_denied", "{v}");
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/ListDir",
            json!({"path": s}),
            Some("user"),
        )
        .await;
    assert_eq!(v["code"], "permission_denied", "{v}");
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/Remove",
            json!({"path": format!("{s}/s.txt")}),
            Some("user"),
        )
        .await;
    assert_eq!(v["code"], "permission_denied", "{v}");
    assert!(secret.join("s.txt").exists());
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/Move",
            json!({"source": "made", "destination": "moved/here"}),
            Some("user"),
        )
        .await;
    assert_eq!(
        v["entry"]["path"],
        home.join("moved/here").display().to_string(),
        "{v}"
    );
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/Stat",
            json!({"path": "~/moved/here"}),
            Some("user"),
        )
        .await;
    assert_eq!(v["entry"]["type"], "FILE_TYPE_DIRECTORY");
    assert_eq!(v["entry"]["permissions"], "drwxr-xr-x");
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/CreateWatcher",
            json!({"path": s}),
            Some("user"),
        )
        .await;
    assert_eq!(v["code"], "permission_denied", "{v}");

    // Commands run as the user with its groups and home, in their own session.
    let (msgs, _) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", "id -u; id -g; echo $HOME $USER $LOGNAME $SHELL; pwd; ps -o sid= -p $$ | tr -d ' '; echo $$; cat /proc/self/oom_score_adj"]}}),
            &[("authorization", "Basic dXNlcjo=")],
        )
        .await;
    let out = stdout_of(&msgs);
    let lines: Vec<&str> = out.lines().collect();
    let h = home.display().to_string();
    assert_eq!(
        lines[..4],
        [
            USER_UID.to_string().as_str(),
            USER_UID.to_string().as_str(),
            &format!("{h} user user /bin/bash"),
            h.as_str()
        ],
        "{out}"
    );
    assert_eq!(
        lines[4], lines[5],
        "the command leads its own session: {out}"
    );
    assert_eq!(lines[6], "500", "a raised oom_score_adj: {out}");
}
