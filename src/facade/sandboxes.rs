//! The sandboxes resource: list, get, create, delete, and the lifecycle subresources.
//! Get, the verbs and name-pinned lists ask the owning node at once; unpinned lists come from
//! the dispatcher's read view.

use std::sync::Arc;

use actix_web::http::header;
use actix_web::{HttpRequest, HttpResponse, web};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;

use super::auth::Attrs;
use super::create;
use super::list_body::{self, Chunks, Shape};
use super::objects;
use super::selectors::{FieldSelector, LabelSelector};
use super::status::{KubeError, KubeResult};
use super::types::{
    API_VERSION, ForkChild, SandboxForkOptions, SandboxForkResult, SandboxPauseOptions,
    SandboxResumeOptions, SandboxSnapshotOptions, SandboxSnapshotResult,
};
use super::{Facade, ListSnapshot, watch};
use crate::dispatch::read_view::Entry;
use crate::model::{self, PauseChange, SandboxRecord};

type Query = web::Query<Vec<(String, String)>>;

pub fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

pub fn wants_table(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=Table"))
}

pub(super) fn json_reply(status: actix_web::http::StatusCode, body: Vec<u8>) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("application/json")
        .body(body)
}

/// Server-side dry run is refused: nodes have no dry-run transaction, and a create that
/// pretended would spend nothing but promise a claim it cannot make.
pub(super) fn refuse_dry_run(q: &[(String, String)], what: &str) -> KubeResult<()> {
    if q.iter().any(|(k, v)| k == "dryRun" && !v.is_empty()) {
        return Err(KubeError::bad_request(format!(
            "dry-run is not supported for sandbox mutations ({what})"
        )));
    }
    Ok(())
}

/// Labels (user and system) of a record, for selectors.
pub fn selectable(r: &SandboxRecord, labels: &LabelSelector, fields: &FieldSelector) -> bool {
    (fields.is_empty() || fields.matches(&objects::name(r), r.namespace(), &r.node))
        && (labels.is_empty() || labels.matches(&objects::labels(r)))
}

impl Facade {
    /// The revision to show for a record read live: when it last changed in the view, or the
    /// view's current revision if the view has not seen it yet.
    pub fn revision_of(&self, id: &str) -> u64 {
        let view = self.dispatcher.view();
        view.entry(id)
            .map_or_else(|| view.revision(), |e| e.revision)
    }

    /// Live lookup by name: the newest claim under `<namespace>/<name>`. A fork child is
    /// named by its claim id, in either spelling.
    pub async fn find(&self, namespace: &str, name: &str) -> KubeResult<Vec<SandboxRecord>> {
        let found = self.dispatcher.find_by_name(namespace, name).await?;
        if !found.is_empty() {
            return Ok(found);
        }
        if let Some(id) = crate::model::ids::canonical_claim_id(name) {
            match self.dispatcher.get(Some(namespace), &id).await {
                Ok(r) if objects::name(&r) == name || r.name() == name => return Ok(vec![r]),
                Ok(_) => {}
                Err(e) if e.kind == crate::model::ErrorKind::NotFound => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(Vec::new())
    }

    async fn find_one(&self, namespace: &str, name: &str) -> KubeResult<SandboxRecord> {
        let mut found = self.find(namespace, name).await?;
        if found.is_empty() {
            return Err(KubeError::not_found(name));
        }
        Ok(found.swap_remove(0))
    }

    /// A record a verb may act on (see `actionable`).
    async fn target(&self, namespace: &str, name: &str) -> KubeResult<SandboxRecord> {
        actionable(self.find_one(namespace, name).await?, namespace, name)
    }
}

/// `r` if it names its node and its claim id, so that nothing is ever done by name alone.
pub(super) fn actionable(
    r: SandboxRecord,
    namespace: &str,
    name: &str,
) -> KubeResult<SandboxRecord> {
    if r.node.is_empty() {
        return Err(KubeError::internal(format!(
            "sandbox {namespace}/{name} has no owning node; refusing to act by name"
        )));
    }
    if r.id.is_empty() {
        return Err(KubeError::internal(format!(
            "sandbox {namespace}/{name} has no claim id; refusing to act by name"
        )));
    }
    Ok(r)
}

pub async fn list_all(
    facade: web::Data<Facade>,
    req: HttpRequest,
    q: Query,
) -> KubeResult<HttpResponse> {
    list_or_watch(facade, req, None, q).await
}

pub async fn list_namespaced(
    facade: web::Data<Facade>,
    req: HttpRequest,
    ns: web::Path<String>,
    q: Query,
) -> KubeResult<HttpResponse> {
    list_or_watch(facade, req, Some(ns.into_inner()), q).await
}

async fn list_or_watch(
    facade: web::Data<Facade>,
    req: HttpRequest,
    namespace: Option<String>,
    q: Query,
) -> KubeResult<HttpResponse> {
    let watching = matches!(param(&q, "watch"), Some("true") | Some("1"));
    let verb = if watching { "watch" } else { "list" };
    let attrs = Attrs::resource(verb, namespace.as_deref(), None);
    facade.auth.authorize(&req, &attrs).await?;
    let labels = LabelSelector::parse(param(&q, "labelSelector").unwrap_or(""))?;
    let fields = FieldSelector::parse(param(&q, "fieldSelector").unwrap_or(""))?;
    let table = wants_table(&req);
    if watching {
        return watch::serve(
            facade.into_inner(),
            namespace,
            labels,
            fields,
            table,
            q.into_inner(),
        );
    }
    let limit = match param(&q, "limit") {
        None | Some("") => 0,
        Some(l) => l.parse::<usize>().map_err(|_| {
            KubeError::bad_request(format!("limit must be a non-negative integer, got {l:?}"))
        })?,
    };
    let (snapshot, offset) = match param(&q, "continue").filter(|c| !c.is_empty()) {
        Some(token) => facade.continued(token)?,
        None => (
            Arc::new(
                facade
                    .snapshot(namespace.as_deref(), &labels, &fields)
                    .await?,
            ),
            0,
        ),
    };
    let total = snapshot.entries.len();
    let end = if limit == 0 {
        total
    } else {
        // A client may ask for any limit; `offset + usize::MAX` must not overflow.
        offset.saturating_add(limit).min(total)
    };
    let next = (end < total).then(|| facade.remember(snapshot.clone(), end));
    let remaining = next.as_ref().map(|_| (total - end) as i64);
    let shape = if table {
        Shape::Table {
            now: chrono::Utc::now(),
        }
    } else {
        Shape::Objects
    };
    Ok(list_body::reply(Chunks::new(
        snapshot,
        offset..end,
        shape,
        next,
        remaining,
    )))
}

impl Facade {
    /// What a list shows: live for a name-pinned list in a namespace, else the read view.
    pub async fn snapshot(
        &self,
        namespace: Option<&str>,
        labels: &LabelSelector,
        fields: &FieldSelector,
    ) -> KubeResult<ListSnapshot> {
        if let (Some(ns), Some(name)) = (namespace, fields.pinned_name()) {
            let records = self.find(ns, name).await?;
            let entries: Vec<Entry> = records
                .into_iter()
                .filter(|r| selectable(r, labels, fields))
                .map(|r| {
                    let revision = self.revision_of(&r.id);
                    Entry::new(Arc::new(r), revision)
                })
                .collect();
            return Ok(ListSnapshot {
                entries: entries.into(),
                revision: self.dispatcher.view().revision(),
            });
        }
        let view = self.dispatcher.settled_view().await;
        if namespace.is_none() && labels.is_empty() && fields.is_empty() {
            let (entries, revision) = view.all_entries();
            return Ok(ListSnapshot { entries, revision });
        }
        let (entries, revision) = view.entries(|r| {
            namespace.is_none_or(|ns| r.namespace() == ns) && selectable(r, labels, fields)
        });
        Ok(ListSnapshot {
            entries: entries.into(),
            revision,
        })
    }

    fn remember(&self, snapshot: Arc<ListSnapshot>, offset: usize) -> String {
        let id = model::ids::random_hex(12);
        self.continues.insert(id.clone(), snapshot);
        URL_SAFE_NO_PAD.encode(format!("{id}:{offset}"))
    }

    /// The snapshot a continue token points into: pages of one list all come from the same
    /// moment. An unknown or expired token is 410 Expired, and the client lists again.
    fn continued(&self, token: &str) -> KubeResult<(Arc<ListSnapshot>, usize)> {
        let expired = || {
            KubeError::expired(
                "the provided continue parameter is too old or invalid; list again without it",
            )
        };
        let raw = URL_SAFE_NO_PAD.decode(token).map_err(|_| expired())?;
        let raw = String::from_utf8(raw).map_err(|_| expired())?;
        let (id, offset) = raw.split_once(':').ok_or_else(expired)?;
        let offset: usize = offset.parse().map_err(|_| expired())?;
        let snapshot = self.continues.get(id).ok_or_else(expired)?;
        if offset > snapshot.entries.len() {
            return Err(expired());
        }
        Ok((snapshot, offset))
    }
}

pub async fn get(
    facade: web::Data<Facade>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
) -> KubeResult<HttpResponse> {
    let (ns, name) = path.into_inner();
    let attrs = Attrs::resource("get", Some(&ns), Some(&name));
    facade.auth.authorize(&req, &attrs).await?;
    let r = facade.find_one(&ns, &name).await?;
    let rv = facade.revision_of(&r.id);
    let body = if wants_table(&req) {
        let entry = Entry::new(Arc::new(r), rv);
        super::table::table(std::slice::from_ref(&entry), rv, None, None)
    } else {
        serde_json::to_vec(&objects::sandbox(&r, rv)).unwrap_or_default()
    };
    Ok(json_reply(actix_web::http::StatusCode::OK, body))
}

pub async fn create(
    facade: web::Data<Facade>,
    req: HttpRequest,
    ns: web::Path<String>,
    q: Query,
    body: web::Bytes,
) -> KubeResult<HttpResponse> {
    let ns = ns.into_inner();
    let attrs = Attrs::resource("create", Some(&ns), None);
    facade.auth.authorize(&req, &attrs).await?;
    refuse_dry_run(&q, "create")?;
    if !crate::e2b::auth::valid_namespace(&ns) {
        return Err(KubeError::bad_request(format!(
            "namespace {ns:?} is not a valid DNS label"
        )));
    }
    let checked = create::check(&body, &ns, param(&q, "fieldValidation"))?;
    super::writes::create_checked(&facade, &ns, checked).await
}

pub async fn delete(
    facade: web::Data<Facade>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    q: Query,
    body: web::Bytes,
) -> KubeResult<HttpResponse> {
    let (ns, name) = path.into_inner();
    super::writes::authorize_write(&facade, &req, "delete", &ns, &name, &q).await?;
    let options: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Null
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| KubeError::bad_request(format!("DeleteOptions is not valid JSON: {e}")))?
    };
    if options["dryRun"].as_array().is_some_and(|a| !a.is_empty()) {
        return Err(KubeError::bad_request(
            "dry-run is not supported for sandbox mutations (delete)",
        ));
    }
    let r = facade.target(&ns, &name).await?;
    if let Some(uid) = options["preconditions"]["uid"].as_str()
        && uid != objects::uid(&r.id)
    {
        return Err(KubeError::new(
            409,
            "Conflict",
            format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                objects::uid(&r.id)
            ),
        ));
    }
    let rv = facade.revision_of(&r.id);
    facade.dispatcher.release(Some(&ns), &r.id).await?;
    Ok(json_reply(
        actix_web::http::StatusCode::OK,
        serde_json::to_vec(&objects::sandbox(&r, rv)).unwrap_or_default(),
    ))
}

fn options<T: serde::de::DeserializeOwned + Default>(body: &[u8], kind: &str) -> KubeResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| KubeError::bad_request(format!("{kind} is not valid JSON: {e}")))?;
    match v.get("kind").and_then(Value::as_str) {
        None | Some("") => {}
        Some(k) if k == kind => {}
        Some(k) => {
            return Err(KubeError::bad_request(format!(
                "expected kind {kind}, got {k}"
            )));
        }
    }
    serde_json::from_value(v).map_err(|e| KubeError::bad_request(format!("{kind}: {e}")))
}

fn created<T: serde::Serialize>(value: &T) -> HttpResponse {
    json_reply(
        actix_web::http::StatusCode::CREATED,
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

pub async fn verb(
    facade: web::Data<Facade>,
    req: HttpRequest,
    path: web::Path<(String, String, String)>,
    q: Query,
    body: web::Bytes,
) -> KubeResult<HttpResponse> {
    let (ns, name, sub) = path.into_inner();
    if !super::types::SUBRESOURCES.iter().any(|(s, _)| *s == sub) {
        return Err(KubeError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        ));
    }
    let attrs = Attrs {
        subresource: Some(&sub),
        ..Attrs::resource("create", Some(&ns), Some(&name))
    };
    facade.auth.authorize(&req, &attrs).await?;
    refuse_dry_run(&q, &format!("sandboxes/{sub}"))?;
    let reply = match sub.as_str() {
        "pause" => {
            let o: SandboxPauseOptions = options(&body, "SandboxPauseOptions")?;
            let r = facade.target(&ns, &name).await?;
            let mode = o.pause_mode().map_err(KubeError::bad_request)?;
            facade
                .dispatcher
                .change_pause(Some(&ns), &r.id, PauseChange::Pause(mode))
                .await?;
            created(&SandboxPauseOptions {
                api_version: Some(API_VERSION.into()),
                kind: Some("SandboxPauseOptions".into()),
                mode: o.mode,
            })
        }
        "resume" => {
            let _: SandboxResumeOptions = options(&body, "SandboxResumeOptions")?;
            let r = facade.target(&ns, &name).await?;
            facade
                .dispatcher
                .set_paused(Some(&ns), &r.id, false)
                .await?;
            created(&SandboxResumeOptions {
                api_version: Some(API_VERSION.into()),
                kind: Some("SandboxResumeOptions".into()),
            })
        }
        "fork" => {
            let o: SandboxForkOptions = options(&body, "SandboxForkOptions")?;
            if o.count < 0 {
                return Err(KubeError::bad_request(format!(
                    "count must not be negative, got {}",
                    o.count
                )));
            }
            if o.ttl_seconds < 0 {
                return Err(KubeError::bad_request(format!(
                    "ttlSeconds must not be negative, got {}",
                    o.ttl_seconds
                )));
            }
            let count = u32::try_from(o.count.max(1))
                .map_err(|_| KubeError::bad_request(format!("count {} is too large", o.count)))?;
            let r = facade.target(&ns, &name).await?;
            let children = facade
                .dispatcher
                .fork(Some(&ns), &r.id, count, o.ttl_seconds as u64)
                .await?;
            created(&SandboxForkResult {
                api_version: API_VERSION.into(),
                kind: "SandboxForkResult".into(),
                children: children
                    .into_iter()
                    .map(|c| ForkChild {
                        sandbox_id: c.id,
                        node_name: c.node,
                        address: c.address,
                        token: c.token,
                    })
                    .collect(),
            })
        }
        _ => {
            let o: SandboxSnapshotOptions = options(&body, "SandboxSnapshotOptions")?;
            let stamped = model::stamped_name(&ns, &o.name);
            if stamped.len() > model::MAX_CHECKPOINT_NAME {
                let room = model::MAX_CHECKPOINT_NAME.saturating_sub(ns.len() + 1);
                return Err(KubeError::bad_request(format!(
                    "snapshot name {:?}: at most {room} characters in namespace {ns:?}",
                    o.name
                )));
            }
            let r = facade.target(&ns, &name).await?;
            let ck = facade
                .dispatcher
                .create_checkpoint(Some(&ns), &r.id, &stamped, false)
                .await?;
            created(&SandboxSnapshotResult {
                api_version: API_VERSION.into(),
                kind: "SandboxSnapshotResult".into(),
                snapshot_id: ck.id,
                name: o.name,
                node_name: ck.node,
                creation_timestamp: super::types::time(ck.created_at),
            })
        }
    };
    Ok(reply)
}

pub async fn method_not_allowed() -> KubeResult<HttpResponse> {
    Err(KubeError::method_not_allowed())
}

pub async fn not_found() -> KubeResult<HttpResponse> {
    Err(KubeError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::DispatcherConfig;

    fn rec(i: usize) -> SandboxRecord {
        SandboxRecord::fixture(&format!("sb_{i:016x}"), &format!("ns-{}/box-{i:03}", i % 3))
    }

    fn names(body: &[u8]) -> (Vec<String>, Option<String>) {
        let v: Value = serde_json::from_slice(body).expect("a list");
        let names = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect();
        let next = v["metadata"]["continue"].as_str().map(str::to_string);
        (names, next)
    }

    #[tokio::test]
    async fn continue_tokens_page_through_one_snapshot() {
        let d = crate::dispatch::Dispatcher::new(DispatcherConfig::default(), "t");
        d.view()
            .replace("n1", (0..10).map(rec).collect(), chrono::Utc::now());
        let keys =
            web::Data::new(crate::e2b::auth::ApiKeys::new(None, true).expect("anonymous keys"));
        let f = Facade::new(d.clone(), super::super::auth::Auth::local(keys));
        let (labels, fields) = (LabelSelector::default(), FieldSelector::default());
        let whole = Arc::new(f.snapshot(None, &labels, &fields).await.expect("a list"));
        let (all, _) = names(&list_body::collect(Chunks::new(
            whole.clone(),
            0..10,
            Shape::Objects,
            None,
            None,
        )));
        assert_eq!(all.len(), 10);
        assert_eq!(all[0], "box-000", "ns-0 first, by claim ref");

        // Pages of 4 from a token, while the view changes under them.
        let token = f.remember(whole.clone(), 4);
        d.view()
            .replace("n1", (0..3).map(rec).collect(), chrono::Utc::now());
        let mut seen = all[..4].to_vec();
        let mut next = Some(token);
        while let Some(t) = next.take() {
            let (snap, offset) = f.continued(&t).expect("a live token");
            assert!(Arc::ptr_eq(&snap, &whole), "the first page's snapshot");
            let end = (offset + 4).min(snap.entries.len());
            let more = (end < snap.entries.len()).then(|| f.remember(snap.clone(), end));
            let (page, token) = names(&list_body::collect(Chunks::new(
                snap,
                offset..end,
                Shape::Objects,
                more,
                None,
            )));
            seen.extend(page);
            next = token;
        }
        assert_eq!(seen, all, "every item once, in order");
        for bad in ["", "bm9wZTox", "!!", "YWJjOjk5OQ"] {
            let e = f.continued(bad).err().expect("expired");
            assert_eq!(e.code, 410, "{bad:?}");
        }
        d.shutdown().await;
    }
}
