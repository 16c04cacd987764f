//! The agent's envd server over raw HTTP: the access token on every route, signed `/files`
//! URLs, `/init`, the Connect protocol with the JSON and the binary codec, bad input answered
//! cleanly, uploads and downloads with their edge cases, users and permissions, and staying
//! up under a fork bomb. The real SDKs are in tests/envd_sdk.rs.

#[path = "envd_harness.rs"]
mod harness;

use harness::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

const TOKEN: &str = "raw-test-token";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_token_guards_every_route_but_health() {
    let e = Envd::start(&["--access-token", TOKEN]);
    let http = client();
    let get = |p: &str| http.get(e.url(p)).send();
    assert_eq!(
        get("/health").await.unwrap().status(),
        StatusCode::NO_CONTENT
    );
    for path in ["/metrics", "/envs", "/files?path=/etc/hostname"] {
        let r = get(path).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["code"], 401, "{path}: JSON error body");
    }
    let wrong = http
        .get(e.url("/metrics"))
        .header("X-Access-Token", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    for (path, body) in [
        ("/filesystem.Filesystem/ListDir", r#"{"path":"/"}"#),
        ("/process.Process/List", "{}"),
        ("/files/compose", "{}"),
    ] {
        let r = http
            .post(e.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let up = http
        .post(e.url("/files?path=/tmp/x"))
        .header("content-type", "application/octet-stream")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), StatusCode::UNAUTHORIZED);

    let m: Value = e
        .req(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for k in [
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    ] {
        assert!(m[k].is_number(), "metrics field {k}: {m}");
    }
    assert!(m["mem_total"].as_u64().unwrap() >= m["mem_used"].as_u64().unwrap());
    let (st, v) = e
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": "/", "depth": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "tmp")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_urls_grant_one_path_operation_and_time() {
    let e = Envd::start(&["--access-token", TOKEN]);
    let http = client();
    let dir = e.agent.dir.path().display().to_string();
    let path = format!("{dir}/signed.txt");
    let put = e
        .req(
            reqwest::Method::POST,
            &format!("/files?path={path}&username=root"),
        )
        .header("content-type", "application/octet-stream")
        .body("secret bytes")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::OK);
    // Query values go percent-encoded, as the SDKs send them (a signature may hold `+`).
    let get = |q: Vec<(&'static str, String)>| http.get(e.url("/files")).query(&q).send();
    let p = || ("path", path.clone());
    let ok = get(vec![
        p(),
        ("signature", sign(&path, "read", "", TOKEN, None)),
    ])
    .await
    .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(ok.text().await.unwrap(), "secret bytes");
    let exp = now() + 60;
    let timed = get(vec![
        p(),
        ("signature", sign(&path, "read", "", TOKEN, Some(exp))),
        ("signature_expiration", exp.to_string()),
    ])
    .await
    .unwrap();
    assert_eq!(timed.status(), StatusCode::OK);
    let as_root = get(vec![
        p(),
        ("username", "root".into()),
        ("signature", sign(&path, "read", "root", TOKEN, None)),
    ])
    .await
    .unwrap();
    assert_eq!(as_root.status(), StatusCode::OK);
    let past = now() - 5;
    for (q, why) in [
        (
            vec![
                p(),
                ("signature", sign(&path, "read", "", TOKEN, Some(past))),
                ("signature_expiration", past.to_string()),
            ],
            "expired",
        ),
        (
            vec![
                p(),
                ("signature", sign(&path, "read", "", TOKEN, Some(exp))),
                ("signature_expiration", (exp + 100).to_string()),
            ],
            "expiration changed",
        ),
        (
            vec![p(), ("signature", sign(&path, "write", "", TOKEN, None))],
            "write signature used to read",
        ),
        (
            vec![
                p(),
                ("signature", sign(&path, "read", "", "other-token", None)),
            ],
            "wrong token",
        ),
        (
            vec![
                ("path", format!("{dir}/other.txt")),
                ("signature", sign(&path, "read", "", TOKEN, None)),
            ],
            "other path",
        ),
        (
            vec![
                p(),
                ("username", "root".into()),
                ("signature", sign(&path, "read", "", TOKEN, None)),
            ],
            "other user",
        ),
        (vec![p(), ("signature", "v1_%%%".into())], "garbage"),
        (vec![p()], "no signature"),
    ] {
        assert_eq!(
            get(q).await.unwrap().status(),
            StatusCode::UNAUTHORIZED,
            "{why}"
        );
    }
    let wpath = format!("{dir}/via-signature.txt");
    let up = http
        .post(e.url("/files"))
        .query(&[
            ("path", wpath.clone()),
            ("username", "root".into()),
            ("signature", sign(&wpath, "write", "root", TOKEN, None)),
        ])
        .header("content-type", "application/octet-stream")
        .body("written")
        .send()
        .await
        .unwrap();
    assert_eq!(up.status(), StatusCode::OK);
    assert_eq!(std::fs::read_to_string(&wpath).unwrap(), "written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_sets_token_env_and_defaults_and_can_be_repeated() {
    let e = Envd::start(&["--init-token", "boot-secret"]);
    let http = client();
    let init = |tok: Option<&str>, body: Value| {
        let mut r = http
            .post(e.url("/init"))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(t) = tok {
            r = r.header("X-Access-Token", t);
        }
        r.send()
    };
    assert_eq!(
        init(None, json!({})).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        init(Some("wrong"), json!({})).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    // Before any token, the routes are open.
    assert_eq!(
        http.get(e.url("/envs")).send().await.unwrap().status(),
        StatusCode::OK
    );
    let r = init(
        Some("boot-secret"),
        json!({"envVars": {"FOO": "bar"}, "accessToken": "tok-1", "defaultUser": "root", "defaultWorkdir": "/tmp", "timestamp": "2026-01-01T00:00:00Z", "volumeMounts": [], "hostname": "sbx-test"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(
        http.get(e.url("/envs")).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let envs: Value = http
        .get(e.url("/envs"))
        .header("X-Access-Token", "tok-1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envs, json!({"FOO": "bar"}));
    let e1 = Envd {
        agent: e.agent,
        http: client(),
        token: Some("tok-1".into()),
    };
    let (msgs, _) = e1
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo $FOO; pwd; id -un"]}}),
            &[],
        )
        .await;
    assert_eq!(
        stdout_of(&msgs),
        "bar\n/tmp\nroot\n",
        "env, default workdir and user from /init"
    );
    // Again (a fork): the current token also authorizes /init, and the env is replaced.
    let again = http
        .post(e1.url("/init"))
        .header("X-Access-Token", "tok-1")
        .body(json!({"envVars": {"BAZ": "1"}, "accessToken": "tok-2"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NO_CONTENT);
    let envs: Value = http
        .get(e1.url("/envs"))
        .header("X-Access-Token", "tok-2")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(envs, json!({"BAZ": "1"}));
    let bad = http
        .post(e1.url("/init"))
        .header("X-Access-Token", "boot-secret")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_json_streams_a_command_start_data_keepalive_end() {
    let e = Envd::start(&[]);
    let (msgs, end) = e.run("echo hi; echo err >&2; exit 7").await;
    assert_eq!(end, json!({}), "a clean end of stream");
    assert!(
        msgs[0]["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "start first: {}",
        msgs[0]
    );
    assert_eq!(stdout_of(&msgs), "hi\n");
    let last = &msgs.last().unwrap()["event"]["end"];
    assert_eq!(last["exitCode"], 7);
    assert_eq!(last["exited"], true);
    assert_eq!(last["status"], "exit status 7");
    assert_eq!(last["error"], "exit status 7");
    let (msgs, _) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 2.5; echo late"]}}),
            &[("keepalive-ping-interval", "1")],
        )
        .await;
    let keepalives = msgs
        .iter()
        .filter(|m| m["event"].get("keepalive").is_some())
        .count();
    assert!(
        keepalives >= 2,
        "keepalives every second while quiet: {msgs:?}"
    );
    let (msgs, _) = e.run("kill -9 $$").await;
    let end = &msgs.last().unwrap()["event"]["end"];
    assert_eq!(
        (
            end["exitCode"].as_i64(),
            end["exited"].as_bool(),
            end["status"].as_str()
        ),
        (Some(-1), None, Some("signal: killed"))
    );
    // A missing program is an invalid argument, before any stream message.
    let (_, end) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/no/such/program"}}),
            &[],
        )
        .await;
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
    let (_, end) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/true", "cwd": "/no/such/dir"}}),
            &[],
        )
        .await;
    assert_eq!(end["error"]["code"], "invalid_argument", "{end}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_codec_works_too() {
    use buffa::Message;
    use sandbox_gateway::envd::proto::process::{
        ListRequest, ListResponse, ProcessConfig, StartRequest, StartResponse,
    };
    let e = Envd::start(&[]);
    let req = StartRequest {
        process: ProcessConfig {
            cmd: "/bin/echo".into(),
            args: vec!["binary".into()],
            ..Default::default()
        }
        .into(),
        stdin: Some(false),
        ..Default::default()
    };
    let res = e
        .req(reqwest::Method::POST, "/process.Process/Start")
        .header("content-type", "application/connect+proto")
        .body(envelope(0, &req.encode_to_vec()))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let bytes = res.bytes().await.unwrap();
    let mut out = Vec::new();
    let mut ended = false;
    for (flags, payload) in frames(&bytes) {
        if flags & 2 != 0 {
            continue;
        }
        let m = StartResponse::decode_from_slice(&payload).unwrap();
        use sandbox_gateway::envd::proto::process::__buffa::oneof::process_event::{
            Event, data_event::Output,
        };
        match m.event.as_option().and_then(|e| e.event.clone()) {
            Some(Event::Data(d)) => {
                if let Some(Output::Stdout(b)) = &d.output {
                    out.extend_from_slice(b);
                }
            }
            Some(Event::End(end)) => {
                assert_eq!(end.exit_code, 0);
                ended = true;
            }
            _ => {}
        }
    }
    assert_eq!(out, b"binary\n");
    assert!(ended);
    let res = e
        .req(reqwest::Method::POST, "/process.Process/List")
        .header("content-type", "application/proto")
        .body(ListRequest::default().encode_to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    ListResponse::decode_from_slice(&res.bytes().await.unwrap()).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_answered_cleanly_and_the_server_stays_up() {
    let e = Envd::start(&[]);
    let raw = |ct: &'static str, body: Vec<u8>, path: &'static str| {
        e.req(reqwest::Method::POST, path)
            .header("content-type", ct)
            .body(body)
            .send()
    };
    // Malformed envelopes: a length beyond the body, a truncated header, garbage JSON inside.
    let mut lying = vec![0u8, 0, 0, 0, 100];
    lying.extend_from_slice(b"{}");
    for body in [
        lying,
        vec![0u8, 0],
        envelope(0, b"{not json"),
        envelope(0, b"[1,2,3]"),
    ] {
        let r = raw("application/connect+json", body, "/process.Process/Start")
            .await
            .unwrap();
        let text = r.text().await.unwrap();
        assert!(text.contains("\"code\""), "a Connect error: {text}");
    }
    // Unary: not JSON, the wrong shape, wrong types.
    for body in [&b"{{{"[..], b"\"str\"", br#"{"path": 5}"#] {
        let r = raw(
            "application/json",
            body.to_vec(),
            "/filesystem.Filesystem/Stat",
        )
        .await
        .unwrap();
        assert!(r.status().is_client_error(), "{}", r.status());
    }
    // Oversize messages are refused before decoding.
    let huge = json!({"path": "x".repeat(9 << 20)})
        .to_string()
        .into_bytes();
    let r = raw(
        "application/json",
        huge.clone(),
        "/filesystem.Filesystem/Stat",
    )
    .await
    .unwrap();
    assert!(r.text().await.unwrap().contains("resource_exhausted"));
    let r = raw(
        "application/connect+json",
        envelope(0, &huge),
        "/process.Process/Start",
    )
    .await
    .unwrap();
    assert!(r.text().await.unwrap().contains("resource_exhausted"));
    // Unknown pids, tags, watchers; paths with NUL; an absurd depth; bad Basic auth.
    let (st, v) = e
        .unary(
            "process.Process/SendSignal",
            json!({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}),
        )
        .await;
    assert_eq!(
        (st, v["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found"))
    );
    let (_, v) = e
        .unary(
            "process.Process/SendInput",
            json!({"process": {"tag": "nope"}, "input": {"stdin": "aGk="}}),
        )
        .await;
    assert_eq!(v["code"], "not_found");
    let (_, v) = e.unary("process.Process/CloseStdin", json!({})).await;
    assert_eq!(v["code"], "invalid_argument");
    let (_, v) = e
        .unary(
            "filesystem.Filesystem/GetWatcherEvents",
            json!({"watcherId": "w-nope"}),
        )
        .await;
    assert_eq!(v["code"], "not_found");
    let (_, v) = e
        .unary(
            "filesystem.Filesystem/RemoveWatcher",
            json!({"watcherId": "w-nope"}),
        )
        .await;
    assert_eq!(v["code"], "not_found");
    let (_, v) = e
        .unary(
            "filesystem.Filesystem/Stat",
            json!({"path": "/tmp/a\u{0}b"}),
        )
        .await;
    assert_eq!(v["code"], "invalid_argument");
    let (_, v) = e
        .unary(
            "process.Process/SendInput",
            json!({"process": {"pid": 1}, "input": {"stdin": "!!!not base64"}}),
        )
        .await;
    assert!(v["code"].is_string(), "{v}");
    let dir = e.agent.dir.path().display().to_string();
    std::fs::create_dir_all(format!("{dir}/a/b/c")).unwrap();
    let (st, v) = e
        .unary(
            "filesystem.Filesystem/ListDir",
            json!({"path": dir, "depth": u32::MAX}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["name"] == "c")
    );
    let r = e
        .req(reqwest::Method::POST, "/filesystem.Filesystem/Stat")
        .header("content-type", "application/json")
        .header("authorization", "Basic %%%")
        .body(json!({"path": "/"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "malformed Basic credentials mean the default user"
    );
    let (_, v) = e
        .unary_as(
            "filesystem.Filesystem/Stat",
            json!({"path": "/"}),
            Some("no-such-user"),
        )
        .await;
    assert_eq!(v["code"], "unauthenticated");
    let (_, end) = e
        .stream(
            "process.Process/Start",
            json!({"process": {"cmd": "/bin/echo", "args": ["a\u{0}b"]}}),
            &[],
        )
        .await;
    assert_eq!(end["error"]["code"], "invalid_argument");
    let r = e
        .req(reqwest::Method::GET, "/files?path=%00")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = e
        .req(reqwest::Method::POST, "/files/compose")
        .body("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(e.healthy().await, "still serving after all that");
    assert!(e.agent.dir.path().exists());
}
