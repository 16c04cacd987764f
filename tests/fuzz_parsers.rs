//! Hostile input, automated: property tests for every parser that takes request input (issue 13).
//! Each target feeds arbitrary text or bytes (must never panic, and must answer a client error
//! where it answers at all) and generated well-formed input (must round-trip or agree with a
//! small model of the grammar). `FUZZ_CASES` sets the cases per property (default 256, a few
//! seconds in all); each target prints one `fuzz-figure` line that `tests/reliability.sh fuzz`
//! collects into RELIABILITY.md.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tower::ServiceExt;

use sandbox_gateway::e2b::auth::{ApiKeys, hashed};
use sandbox_gateway::e2b::listing::{Cursor, parse_metadata, query_unescape};
use sandbox_gateway::e2b::logs::{v1_query, v2_query};
use sandbox_gateway::e2b::proxy::target;
use sandbox_gateway::envd::{self, EnvdConfig};
use sandbox_gateway::facade::selectors::{FieldSelector, LabelSelector};
use sandbox_gateway::facade::{create, kubeconfig, patch};
use sandbox_gateway::model::checkpoint::validate_checkpoint_name;
use sandbox_gateway::model::ids::{canonical_claim_id, dns_safe, is_claim_id};

/// Cases per property: `FUZZ_CASES`, else a CI-sized default.
fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(256)
}

/// Runs `strategy` through `check` `cases()` times and prints the target's figure line. The
/// failure (already shrunk by proptest) fails the test with the minimal input.
fn fuzz<S: Strategy>(
    target: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let ran = AtomicUsize::new(0);
    let started = Instant::now();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        // Shrunk failures are reported in the test output; no files are written into tests/.
        failure_persistence: None,
        ..Config::default()
    });
    let outcome = runner.run(&strategy, |v| {
        ran.fetch_add(1, Ordering::Relaxed);
        check(v)
    });
    println!(
        "fuzz-figure target={target} cases={} secs={:.2}",
        ran.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = outcome {
        panic!("{target}: {e}");
    }
}

/// Text that is mostly the grammar's own punctuation, so that arbitrary input reaches deep
/// into the parser rather than failing on the first byte, mixed with any Unicode at all.
fn hostile_text(alphabet: &'static str) -> BoxedStrategy<String> {
    prop_oneof![
        any::<String>(),
        proptest::string::string_regex(&format!("[{alphabet}]{{0,48}}")).unwrap(),
    ]
    .boxed()
}

// ---------------------------------------------------------------------------------------------
// Label and field selectors (facade lists and watches)

#[derive(Debug, Clone)]
enum Req {
    Eq(String, String, bool),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

fn label_key() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9./_-]{0,5}"
}

fn label_value() -> impl Strategy<Value = String> {
    "[a-z0-9]{0,3}"
}

fn requirement() -> impl Strategy<Value = Req> {
    let set = prop::collection::vec("[a-z0-9]{1,3}", 1..4);
    prop_oneof![
        (label_key(), label_value(), any::<bool>()).prop_map(|(k, v, d)| Req::Eq(k, v, d)),
        (label_key(), label_value()).prop_map(|(k, v)| Req::NotEq(k, v)),
        (label_key(), set.clone()).prop_map(|(k, s)| Req::In(k, s)),
        (label_key(), set).prop_map(|(k, s)| Req::NotIn(k, s)),
        label_key().prop_map(Req::Exists),
        label_key().prop_map(Req::NotExists),
    ]
}

fn render(r: &Req) -> String {
    match r {
        Req::Eq(k, v, true) => format!("{k}=={v}"),
        Req::Eq(k, v, false) => format!("{k} = {v}"),
        Req::NotEq(k, v) => format!("{k}!={v}"),
        Req::In(k, s) => format!("{k} in ({})", s.join(", ")),
        Req::NotIn(k, s) => format!("{k} notin ({})", s.join(",")),
        Req::Exists(k) => k.clone(),
        Req::NotExists(k) => format!("!{k}"),
    }
}

fn holds(r: &Req, labels: &BTreeMap<String, String>) -> bool {
    match r {
        Req::Eq(k, v, _) => labels.get(k) == Some(v),
        Req::NotEq(k, v) => labels.get(k) != Some(v),
        Req::In(k, s) => labels.get(k).is_some_and(|x| s.contains(x)),
        Req::NotIn(k, s) => labels.get(k).is_none_or(|x| !s.contains(x)),
        Req::Exists(k) => labels.contains_key(k),
        Req::NotExists(k) => !labels.contains_key(k),
    }
}

#[test]
fn label_selectors() {
    fuzz(
        "label-selector/arbitrary",
        hostile_text(r"a-z0-9=!,() .\-/_"),
        |s| {
            if let Err(e) = LabelSelector::parse(&s) {
                prop_assert_eq!(e.code, 400, "{:?}", s);
            }
            Ok(())
        },
    );
    let labels = prop::collection::btree_map(label_key(), label_value(), 0..6);
    fuzz(
        "label-selector/model",
        (prop::collection::vec(requirement(), 0..5), labels),
        |(reqs, labels)| {
            let text: Vec<String> = reqs.iter().map(render).collect();
            let text = text.join(",");
            let parsed = LabelSelector::parse(&text)
                .map_err(|e| TestCaseError::fail(format!("{text:?}: {}", e.message)))?;
            let want = reqs.iter().all(|r| holds(r, &labels));
            prop_assert_eq!(parsed.matches(&labels), want, "{:?} on {:?}", text, labels);
            Ok(())
        },
    );
}

#[test]
fn field_selectors() {
    fuzz(
        "field-selector/arbitrary",
        hostile_text(r"a-zN.=!, "),
        |s| {
            if let Err(e) = FieldSelector::parse(&s) {
                prop_assert_eq!(e.code, 400, "{:?}", s);
            }
            Ok(())
        },
    );
    let field = prop::sample::select(vec![
        "metadata.name",
        "metadata.namespace",
        "status.nodeName",
    ]);
    let op = prop::sample::select(vec!["=", "==", "!="]);
    let term = (field, op, "[a-z0-9.-]{0,6}");
    fuzz(
        "field-selector/model",
        (
            prop::collection::vec(term, 0..4),
            "[a-z0-9.-]{0,6}",
            "[a-z0-9.-]{0,6}",
            "[a-z0-9.-]{0,6}",
        ),
        |(terms, name, ns, node)| {
            let text: Vec<String> = terms.iter().map(|(f, o, v)| format!("{f}{o}{v}")).collect();
            let text = text.join(",");
            let parsed = FieldSelector::parse(&text)
                .map_err(|e| TestCaseError::fail(format!("{text:?}: {}", e.message)))?;
            let want = terms.iter().all(|(f, o, v)| {
                let actual = match *f {
                    "metadata.name" => &name,
                    "metadata.namespace" => &ns,
                    _ => &node,
                };
                (actual == v) == (*o != "!=")
            });
            prop_assert_eq!(parsed.matches(&name, &ns, &node), want, "{:?}", text);
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// e2b listing: the metadata filter, next tokens, log queries

/// Percent-encodes every byte outside the unreserved set, as the SDKs' URL encoders do.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn metadata_filters() {
    fuzz(
        "metadata-filter/arbitrary",
        hostile_text(r"a-z0-9%=&+A-F"),
        |s| {
            let _ = query_unescape(&s);
            if let Err(e) = parse_metadata(&s) {
                prop_assert_eq!(e.status.as_u16(), 400);
            }
            Ok(())
        },
    );
    fuzz(
        "metadata-filter/round-trip",
        prop::collection::btree_map(".{1,8}", ".{0,8}", 0..5),
        |m| {
            // The SDK encodes each key and value, joins the pairs, and encodes the whole; the
            // framework has decoded the query parameter once before the parser sees it.
            let inner: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}={}", escape(k), escape(v)))
                .collect();
            let raw = escape(&inner.join("&"));
            let parsed = parse_metadata(&raw)
                .map_err(|e| TestCaseError::fail(format!("{raw:?}: {}", e.message)))?;
            prop_assert_eq!(parsed, m);
            Ok(())
        },
    );
}

#[test]
fn next_tokens() {
    fuzz(
        "next-token/arbitrary",
        prop_oneof![
            hostile_text(r"A-Za-z0-9_\-=|"),
            (any::<i64>(), any::<String>(), ".{0,4}")
                .prop_map(|(n, id, junk)| URL_SAFE_NO_PAD.encode(format!("{n}{junk}|{id}"))),
            prop::collection::vec(any::<u8>(), 0..40).prop_map(|b| URL_SAFE_NO_PAD.encode(b)),
        ],
        |s| {
            if let Err(e) = Cursor::decode(&s) {
                prop_assert_eq!(e.status.as_u16(), 400);
            }
            Ok(())
        },
    );
    fuzz(
        "next-token/round-trip",
        (any::<i64>(), any::<String>()),
        |(at_ms, id)| {
            let c = Cursor { at_ms, id };
            let back =
                Cursor::decode(&c.encode()).map_err(|e| TestCaseError::fail(e.message.clone()))?;
            prop_assert_eq!(back, c);
            Ok(())
        },
    );
}

#[test]
fn log_queries() {
    let key = prop::sample::select(vec![
        "start",
        "cursor",
        "limit",
        "direction",
        "level",
        "search",
        "other",
    ]);
    let value = prop_oneof![
        any::<String>(),
        any::<i64>().prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "forward", "backward", "info", "warn", "error", "debug"
        ])
        .prop_map(str::to_string),
    ];
    fuzz(
        "log-query/arbitrary",
        prop::collection::vec((key.prop_map(str::to_string), value), 0..6),
        |q| {
            for r in [v1_query(&q).err(), v2_query(&q).err()]
                .into_iter()
                .flatten()
            {
                prop_assert_eq!(r.status.as_u16(), 400, "{:?}", q);
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Ids, checkpoint names, data-plane host names

fn claim_hex() -> impl Strategy<Value = String> {
    "[0-9a-f]{16}"
}

#[test]
fn ids_and_names() {
    fuzz("ids/arbitrary", hostile_text("sbSB_\\-0-9a-gA-G"), |s| {
        if let Some(id) = canonical_claim_id(&s) {
            prop_assert!(is_claim_id(&id), "{:?} -> {:?}", s, id);
            prop_assert_eq!(canonical_claim_id(&dns_safe(&id)), Some(id));
        }
        Ok(())
    });
    fuzz(
        "ids/both-spellings",
        (claim_hex(), any::<bool>(), any::<bool>()),
        |(hex, dash, upper)| {
            let id = format!("sb_{hex}");
            let mut spelled = if dash { dns_safe(&id) } else { id.clone() };
            if upper {
                spelled = spelled.to_ascii_uppercase();
            }
            prop_assert_eq!(canonical_claim_id(&spelled), Some(id));
            Ok(())
        },
    );
    // The node's pattern `^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`, written out as a model.
    let model = |n: &str| {
        let b = n.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b[0].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || b"._:/-".contains(c))
    };
    fuzz(
        "checkpoint-name/model",
        prop_oneof![
            any::<String>(),
            "[a-zA-Z0-9._:/ -]{0,70}",
            "[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}",
        ],
        |n| {
            prop_assert_eq!(validate_checkpoint_name(&n).is_ok(), model(&n), "{:?}", n);
            Ok(())
        },
    );
    fuzz(
        "proxy-host/arbitrary",
        (
            hostile_text("0-9a-z.:_\\-"),
            proptest::option::of(any::<String>()),
            proptest::option::of(any::<String>()),
        ),
        |(host, id, port)| {
            let _ = target(Some(&host), None, None, Some("e2b.local"));
            let _ = target(
                Some(&host),
                id.as_deref(),
                port.as_deref(),
                Some("e2b.local"),
            );
            Ok(())
        },
    );
    fuzz(
        "proxy-host/round-trip",
        (claim_hex(), 1u16.., proptest::option::of(1u16..)),
        |(hex, port, listen)| {
            let id = format!("sb_{hex}");
            let host = match listen {
                Some(l) => format!("{port}-{}.E2B.local:{l}", dns_safe(&id)),
                None => format!("{port}-{}.e2b.local", dns_safe(&id)),
            };
            let t = target(Some(&host), None, None, Some("e2b.local."));
            prop_assert!(
                matches!(&t, Some(Ok(t)) if t.sandbox == id && t.port == port),
                "{:?}",
                t
            );
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Kubernetes create bodies and patches

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,8}".prop_map(Value::from),
        prop::sample::select(vec![
            "500m",
            "1",
            "2Gi",
            "1e308",
            "-1",
            "base",
            "",
            "2026-01-01T00:00:00Z"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A Sandbox whose fields are in the right places with hostile values in them.
fn sandbox_body() -> impl Strategy<Value = Value> {
    let text = prop_oneof![".{0,12}", "[a-z0-9-]{1,12}"];
    (
        text.clone(),
        json_value(),
        json_value(),
        json_value(),
        json_value(),
        json_value(),
        prop::collection::btree_map(".{0,10}", json_value(), 0..3),
    )
        .prop_map(
            |(name, image, resources, env, shutdown, spec_extra, annotations)| {
                let mut spec = json!({
                    "podTemplate": {"spec": {"containers": [
                        {"name": "c", "image": image, "resources": resources, "env": env}
                    ]}},
                    "shutdownTime": shutdown,
                });
                if let (Some(o), Value::Object(extra)) = (spec.as_object_mut(), spec_extra) {
                    o.extend(extra);
                }
                json!({
                    "apiVersion": "agents.x-k8s.io/v1beta1",
                    "kind": "Sandbox",
                    "metadata": {"name": name, "annotations": annotations},
                    "spec": spec,
                })
            },
        )
}

#[test]
fn create_bodies() {
    fuzz(
        "sandbox-create/bytes",
        prop::collection::vec(any::<u8>(), 0..64),
        |b| {
            if let Err(e) = create::check(&b, "team-a", None) {
                prop_assert!((400..500).contains(&e.code), "{} {}", e.code, e.message);
            }
            Ok(())
        },
    );
    fuzz(
        "sandbox-create/structured",
        (
            sandbox_body(),
            proptest::option::of(prop::sample::select(vec!["Strict", "Warn", "Ignore"])),
        ),
        |(body, validation)| {
            let bytes = serde_json::to_vec(&body).unwrap_or_default();
            if let Err(e) = create::check(&bytes, "team-a", validation) {
                prop_assert!(
                    (400..500).contains(&e.code),
                    "{} {} for {}",
                    e.code,
                    e.message,
                    body
                );
            }
            Ok(())
        },
    );
}

#[test]
fn patches() {
    let kind = prop::sample::select(vec![
        patch::PatchKind::Json,
        patch::PatchKind::Merge,
        patch::PatchKind::Strategic,
    ]);
    let op = (
        prop::sample::select(vec![
            "add", "remove", "replace", "move", "copy", "test", "bogus",
        ]),
        prop::sample::select(vec![
            "",
            "/",
            "/spec",
            "/metadata/labels/a",
            "/spec/x/0",
            "/~2",
            "/-",
        ]),
        json_value(),
    )
        .prop_map(
            |(op, path, value)| json!({"op": op, "path": path, "from": path, "value": value}),
        );
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        prop::collection::vec(op, 0..4).prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
    ];
    fuzz(
        "patch/apply",
        (kind, json_value(), body),
        |(kind, current, body)| {
            if let Err(e) = patch::apply(kind, &current, &body) {
                prop_assert!((400..500).contains(&e.code), "{} {}", e.code, e.message);
            }
            Ok(())
        },
    );
    let yaml = prop_oneof![
        hostile_text(r"a-z:&*\[\]{}\-# \n'!|>"),
        json_value().prop_map(|v| v.to_string()),
    ];
    fuzz("patch/server-side-apply-yaml", yaml, |text| {
        if let Err(e) = patch::parse_applied(text.as_bytes()) {
            prop_assert!((400..500).contains(&e.code), "{} {}", e.code, e.message);
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Key files and kubeconfigs

#[test]
fn api_key_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("keys");
    fuzz(
        "api-key-file/arbitrary",
        hostile_text(r"a-z0-9_:# *\n\t-"),
        |text| {
            std::fs::write(&file, &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let _ = ApiKeys::new(Some(file.clone()), false);
            Ok(())
        },
    );
    let line = (
        "e2b_[0-9a-f]{8}",
        prop::sample::select(vec!["team-a", "b0", "*", "x-y-z"]),
        any::<bool>(),
    );
    fuzz(
        "api-key-file/round-trip",
        prop::collection::btree_map("[0-9]{2}", line, 1..5),
        |lines| {
            let mut text = String::from("# keys\n\n");
            for (key, ns, stored_hashed) in lines.values() {
                let stored = if *stored_hashed {
                    hashed(key)
                } else {
                    key.clone()
                };
                text.push_str(&format!("  {stored}\t{ns}  \n"));
            }
            std::fs::write(&file, &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let keys = ApiKeys::new(Some(file.clone()), false)
                .map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
            for (key, ns, _) in lines.values() {
                // A key listed twice takes its first line's tenant.
                let first = lines
                    .values()
                    .find(|(k, _, _)| k == key)
                    .map(|(_, n, _)| *n);
                let t = keys
                    .authenticate(Some(key))
                    .map_err(|e| TestCaseError::fail(e.message.clone()))?;
                let want = first.unwrap_or(ns);
                prop_assert_eq!(t.admin, want == "*");
                if want != "*" {
                    prop_assert_eq!(t.namespace.as_str(), want);
                }
            }
            prop_assert!(keys.authenticate(Some("e2b_not-listed")).is_err());
            Ok(())
        },
    );
}

#[test]
fn kubeconfigs() {
    let field = prop_oneof![any::<String>(), hostile_text(r"a-z0-9:#'{}\[\]&*!|> \n-")];
    fuzz(
        "kubeconfig/round-trip",
        (
            "https://127\\.0\\.0\\.1:[0-9]{1,5}",
            // An empty CA is no CA to kube (the gateway always has one).
            field.clone().prop_filter("a CA", |c| !c.is_empty()),
            field,
            proptest::option::of("[a-z0-9-]{1,12}"),
        ),
        |(server, ca, token, ns)| {
            let text = kubeconfig::render(&server, &ca, &token, ns.as_deref());
            let kc = kube::config::Kubeconfig::from_yaml(&text)
                .map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
            let cluster = kc.clusters.first().and_then(|c| c.cluster.as_ref());
            prop_assert_eq!(
                cluster.and_then(|c| c.server.as_deref()),
                Some(server.as_str())
            );
            let ca_back = cluster
                .and_then(|c| c.certificate_authority_data.as_deref())
                .and_then(|d| STANDARD.decode(d).ok());
            prop_assert_eq!(ca_back, Some(ca.into_bytes()));
            // kube keeps the token as a secret; its serialized form is what it would send.
            let as_json =
                serde_json::to_value(&kc).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let sent = as_json["users"][0]["user"]["token"]
                .as_str()
                .map(str::to_string);
            prop_assert_eq!(sent, Some(token));
            let ctx = kc.contexts.first().and_then(|c| c.context.as_ref());
            prop_assert_eq!(ctx.and_then(|c| c.namespace.clone()), ns);
            Ok(())
        },
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("kubeconfig");
    let rt = runtime();
    fuzz(
        "kubeconfig/arbitrary-file",
        hostile_text(r"a-z:\- \n'{}\[\]&*"),
        |text| {
            std::fs::write(&file, &text).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let _ = rt.block_on(sandbox_gateway::cluster::client(Some(&file), "--fuzz"));
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// envd: Connect envelopes and JSON, multipart uploads, gzip bodies (the router, in process)

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

const TOKEN: &str = "fuzz-access-token";

struct Envd {
    app: axum::Router,
    dir: tempfile::TempDir,
    rt: tokio::runtime::Runtime,
}

impl Envd {
    fn new() -> Envd {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = envd::users::UserDb::load();
        let cfg = EnvdConfig {
            access_token: Some(TOKEN.into()),
            default_user: Some(envd::users::current_user(&db).name),
            default_workdir: Some(dir.path().to_path_buf()),
            ..Default::default()
        };
        let app = envd::http::router(Arc::new(envd::state::Envd::new(cfg)));
        Envd {
            app,
            dir,
            rt: runtime(),
        }
    }

    /// One request through the router: the status and the whole body (bounded in time, since
    /// a streaming reply that never ends is a finding too).
    fn send(&self, req: Request<Body>) -> Result<(StatusCode, Vec<u8>), TestCaseError> {
        self.rt.block_on(async {
            let res = tokio::time::timeout(Duration::from_secs(10), async {
                let res = self
                    .app
                    .clone()
                    .oneshot(req)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = res.status();
                let body = res.into_body().collect().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((status, body.to_bytes().to_vec()))
            })
            .await;
            match res {
                Ok(Ok(r)) => Ok(r),
                Ok(Err(e)) => Err(TestCaseError::fail(e)),
                Err(_) => Err(TestCaseError::fail("no complete reply within 10 s")),
            }
        })
    }

    fn post(&self, path: &str, content_type: &str, body: Vec<u8>) -> Request<Body> {
        Request::post(path)
            .header("content-type", content_type)
            .header("x-access-token", TOKEN)
            .body(Body::from(body))
            .unwrap_or_default()
    }
}

/// Connect's end-of-stream error, if the stream ended with one: (code, message).
fn end_stream_error(body: &[u8]) -> Option<(String, String)> {
    let mut rest = body;
    let mut last = None;
    while rest.len() >= 5 {
        let flags = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        let payload = rest.get(5..5 + len)?;
        if flags & 0x02 != 0 {
            let v: Value = serde_json::from_slice(payload).ok()?;
            let e = &v["error"];
            last = e["code"].as_str().map(|c| {
                let m = e["message"].as_str().unwrap_or_default();
                (c.to_string(), m.to_string())
            });
        }
        rest = &rest[5 + len..];
    }
    last
}

/// A Connect envelope: flags, a length that may lie, and the payload.
fn envelope() -> impl Strategy<Value = Vec<u8>> {
    let payload = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..32),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        (0u32..4_000_000).prop_map(|pid| format!(r#"{{"process":{{"pid":{pid}}}}}"#).into_bytes()),
    ];
    (
        any::<u8>(),
        payload,
        prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        0..3usize,
    )
        .prop_map(|(flags, payload, lie, copies)| {
            let mut out = Vec::new();
            for _ in 0..copies.max(1) {
                let len = lie.unwrap_or(payload.len() as u32);
                out.push(flags & 0x03);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&payload);
            }
            out
        })
}

#[test]
fn connect_rpc() {
    let envd = Envd::new();
    let tmp = envd.dir.path().display().to_string();
    let path = prop_oneof![
        ".{0,12}".prop_map(move |p| format!("{tmp}/{p}")),
        any::<String>(),
        Just(String::new()),
    ];
    let unary_body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..48),
        json_value().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        (path, json_value()).prop_map(|(p, d)| {
            serde_json::to_vec(&json!({"path": p, "depth": d})).unwrap_or_default()
        }),
    ];
    let method = prop::sample::select(vec![
        "/filesystem.Filesystem/Stat",
        "/filesystem.Filesystem/ListDir",
        "/process.Process/List",
    ]);
    let ctype = prop::sample::select(vec!["application/json", "application/proto", "text/plain"]);
    fuzz(
        "connect/unary",
        (method, ctype, unary_body),
        |(method, ctype, body)| {
            let (status, reply) = envd.send(envd.post(method, ctype, body))?;
            prop_assert!(
                !status.is_server_error(),
                "{} {}: {}",
                method,
                status,
                String::from_utf8_lossy(&reply)
            );
            Ok(())
        },
    );
    let stream_method =
        prop::sample::select(vec!["/process.Process/Connect", "/process.Process/Start"]);
    let stream_type = prop::sample::select(vec![
        "application/connect+json",
        "application/connect+proto",
    ]);
    fuzz(
        "connect/envelopes",
        (stream_method, stream_type, envelope()),
        |(method, ctype, body)| {
            let (status, reply) = envd.send(envd.post(method, ctype, body))?;
            prop_assert!(!status.is_server_error(), "{} {}", method, status);
            let error = end_stream_error(&reply);
            // One exception, as the Connect spec and connect-go have it: a message flagged as
            // compressed on a stream that negotiated no compression is a protocol error with
            // code `internal`.
            let protocol_error = error
                .as_ref()
                .is_some_and(|(c, m)| c == "internal" && m.contains("compressed message without"));
            prop_assert!(
                protocol_error
                    || !matches!(
                        error.as_ref().map(|(c, _)| c.as_str()),
                        Some("internal" | "unknown" | "data_loss")
                    ),
                "{} ended with {:?}",
                method,
                error
            );
            Ok(())
        },
    );
}

/// A multipart body: well-formed parts, hostile headers, or a body cut short.
fn multipart() -> impl Strategy<Value = (String, Vec<u8>)> {
    let part = (
        prop::sample::select(vec!["file", "other", ""]),
        proptest::option::of(".{0,10}"),
        prop::collection::vec(any::<u8>(), 0..32),
        proptest::option::of(".{0,20}"),
    );
    (
        "[a-zA-Z0-9'()+_,./:=? -]{0,20}",
        prop::collection::vec(part, 0..3),
        any::<bool>(),
        0usize..200,
    )
        .prop_map(|(boundary, parts, closed, cut)| {
            let mut body = Vec::new();
            for (name, filename, data, header) in &parts {
                body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
                let mut disposition = format!("Content-Disposition: form-data; name=\"{name}\"");
                if let Some(f) = filename {
                    disposition.push_str(&format!("; filename=\"{f}\""));
                }
                body.extend_from_slice(disposition.as_bytes());
                body.extend_from_slice(b"\r\n");
                if let Some(h) = header {
                    body.extend_from_slice(h.as_bytes());
                    body.extend_from_slice(b"\r\n");
                }
                body.extend_from_slice(b"\r\n");
                body.extend_from_slice(data);
                body.extend_from_slice(b"\r\n");
            }
            if closed {
                body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
            } else {
                let keep = body.len().saturating_sub(cut);
                body.truncate(keep);
            }
            (format!("multipart/form-data; boundary={boundary}"), body)
        })
}

#[test]
fn file_uploads() {
    let envd = Envd::new();
    let tmp = envd.dir.path().display().to_string();
    let n = AtomicUsize::new(0);
    let query = prop_oneof![
        Just(String::new()),
        ".{0,8}".prop_map(move |p| format!("path={}", escape(&format!("{tmp}/up/{p}")))),
    ];
    let body = prop_oneof![
        multipart(),
        (
            prop::sample::select(vec![
                "multipart/form-data",
                "multipart/mixed; boundary=",
                "application/octet-stream"
            ]),
            prop::collection::vec(any::<u8>(), 0..64),
        )
            .prop_map(|(t, b)| (t.to_string(), b)),
    ];
    let encoding = prop::sample::select(vec![None, Some("gzip"), Some("br"), Some("identity")]);
    fuzz(
        "multipart-upload",
        (query, body, encoding),
        |(query, (ctype, body), encoding)| {
            // Each case writes below its own directory, so that earlier files do not decide
            // whether a later path is a file or a directory.
            let case = n.fetch_add(1, Ordering::Relaxed);
            let query = query.replace("/up/", &format!("/up{case}/"));
            let mut req = Request::post(format!("/files?{query}"))
                .header("content-type", ctype)
                .header("x-access-token", TOKEN);
            if let Some(e) = encoding {
                req = req.header("content-encoding", e);
            }
            let req = req.body(Body::from(body)).unwrap_or_default();
            let (status, reply) = envd.send(req)?;
            prop_assert!(
                !status.is_server_error(),
                "{} for {:?}: {}",
                status,
                query,
                String::from_utf8_lossy(&reply)
            );
            Ok(())
        },
    );
}

/// Found by `multipart-upload`: an empty raw upload polled the finished body stream again,
/// and the handler panicked (the connection dropped) instead of writing an empty file.
#[test]
fn an_empty_raw_upload_writes_an_empty_file() {
    let envd = Envd::new();
    for encoding in [None, Some("identity")] {
        let target = envd
            .dir
            .path()
            .join(format!("empty-{}", encoding.unwrap_or("none")));
        std::fs::write(&target, b"old content").expect("seed file");
        let mut req = Request::post(format!(
            "/files?path={}",
            escape(&target.display().to_string())
        ))
        .header("content-type", "application/octet-stream")
        .header("x-access-token", TOKEN);
        if let Some(e) = encoding {
            req = req.header("content-encoding", e);
        }
        let req = req.body(Body::empty()).expect("request");
        let (status, reply) = envd.send(req).expect("a reply");
        assert_eq!(
            status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&reply)
        );
        assert_eq!(std::fs::read(&target).expect("written").len(), 0);
    }
}
