//! PATCH (merge, JSON, strategic merge, server-side apply) and PUT on one sandbox: the
//! object is read live from its node, the patch applied to it (`patch`), the result checked
//! and planned (`update`), and the plan carried out through the dispatcher — the lease, then
//! the operating mode, then the stored labels, annotations and spec. An update that changes
//! nothing touches nothing. A server-side apply of a sandbox that does not exist creates it.

use actix_web::http::{StatusCode, header};
use actix_web::{HttpRequest, HttpResponse, web};
use chrono::Utc;
use serde_json::Value;

use super::auth::Attrs;
use super::patch::{self, PatchKind};
use super::sandboxes::{actionable, json_reply, param, refuse_dry_run};
use super::status::{KubeError, KubeResult};
use super::update::{self, Plan};
use super::{Facade, create, objects, openapi, stored};
use crate::model::SandboxRecord;

type Query = web::Query<Vec<(String, String)>>;

/// The API server's limit on a field manager's name.
const MAX_FIELD_MANAGER: usize = 128;

impl Facade {
    /// The newest sandbox under the name, if any, fit to be acted on.
    async fn existing(&self, ns: &str, name: &str) -> KubeResult<Option<SandboxRecord>> {
        let mut found = self.find(ns, name).await?;
        if found.is_empty() {
            return Ok(None);
        }
        actionable(found.swap_remove(0), ns, name).map(Some)
    }

    /// Carries out `plan` on `r`; answers the record as it ends up and warnings for the client.
    async fn carry_out(
        &self,
        ns: &str,
        mut r: SandboxRecord,
        plan: Plan,
    ) -> KubeResult<(SandboxRecord, Vec<String>)> {
        let mut warnings = Vec::new();
        // A paused sandbox has no running lease to renew: resume before renewing, pause after.
        if plan.pause == Some(false) {
            r = self.dispatcher.set_paused(Some(ns), &r.id, false).await?.0;
        }
        if let Some(renew) = &plan.renew {
            // The client named the end itself, so a shorter lease is what it asked for.
            let (deadline, _) = self
                .dispatcher
                .renew(Some(ns), &r.id, renew.ttl_seconds, true)
                .await?;
            r.deadline = deadline;
            if let Some(until) = renew.until
                && (until - deadline).num_seconds() >= 1
            {
                warnings.push(format!(
                    "spec.shutdownTime: the node's maximum lease ends the sandbox at {}, before the requested {}",
                    objects::timestamp(deadline),
                    objects::timestamp(until)
                ));
            }
        }
        if plan.pause == Some(true) {
            r = self.dispatcher.set_paused(Some(ns), &r.id, true).await?.0;
        }
        if !plan.set.is_empty() || !plan.remove.is_empty() {
            r = self
                .dispatcher
                .update_metadata(Some(ns), &r.id, plan.set, plan.remove)
                .await?
                .0;
        }
        tracing::debug!(namespace = ns, id = %r.id, "sandbox updated");
        Ok((r, warnings))
    }
}

fn object_value(r: &SandboxRecord, rv: u64) -> KubeResult<Value> {
    serde_json::to_value(objects::sandbox(r, rv)).map_err(KubeError::internal)
}

/// A written object with the request's warnings as `Warning: 299` headers.
pub(super) fn reply(status: StatusCode, object: &Value, warnings: &[String]) -> HttpResponse {
    let mut res = json_reply(status, object.to_string().into_bytes());
    for w in warnings {
        if let Ok(v) = header::HeaderValue::from_str(&format!("299 - \"{}\"", w.replace('"', "'")))
        {
            res.headers_mut().append(header::WARNING, v);
        }
    }
    res
}

/// Unknown fields the update adds, for `fieldValidation` Strict (refused) or Warn (warned).
/// Fields the object already had (stored from a create that ignored them) do not count.
fn field_warnings(
    current: &Value,
    updated: &Value,
    validation: Option<&str>,
) -> KubeResult<Vec<String>> {
    if !matches!(validation, Some("Strict") | Some("Warn")) {
        return Ok(Vec::new());
    }
    let before = openapi::unknown_fields(current, openapi::SANDBOX_SCHEMA);
    let found: Vec<String> = openapi::unknown_fields(updated, openapi::SANDBOX_SCHEMA)
        .into_iter()
        .filter(|f| !before.contains(f))
        .map(|f| format!("unknown field {f:?}"))
        .collect();
    if validation == Some("Strict") && !found.is_empty() {
        return Err(KubeError::bad_request(format!(
            "strict decoding error: {}",
            found.join(", ")
        )));
    }
    Ok(found)
}

/// Checks, plans and carries out the update of `r` (read as `current`) to `updated`.
async fn update_to(
    facade: &Facade,
    ns: &str,
    r: SandboxRecord,
    current: Value,
    updated: Value,
    owners: &[(&str, &stored::Owned)],
    validation: Option<&str>,
) -> KubeResult<HttpResponse> {
    let mut warnings = field_warnings(&current, &updated, validation)?;
    let plan = update::plan(&r, &current, &updated, owners, Utc::now())?;
    if plan.is_noop() {
        return Ok(reply(StatusCode::OK, &current, &warnings));
    }
    let (r, more) = facade.carry_out(ns, r, plan).await?;
    warnings.extend(more);
    let object = object_value(&r, facade.revision_of(&r.id))?;
    Ok(reply(StatusCode::OK, &object, &warnings))
}

fn field_manager(q: &[(String, String)], kind: PatchKind) -> KubeResult<Option<&str>> {
    let manager = param(q, "fieldManager").filter(|m| !m.is_empty());
    if let Some(m) = manager
        && (m.len() > MAX_FIELD_MANAGER || m.chars().any(char::is_control))
    {
        return Err(KubeError::bad_request(format!(
            "fieldManager must be at most {MAX_FIELD_MANAGER} printable characters"
        )));
    }
    if kind == PatchKind::Apply && manager.is_none() {
        return Err(KubeError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    Ok(manager)
}

/// The checks every write of a named sandbox makes first: the caller may `verb` it, and the
/// request is no dry run (refused before anything is touched).
pub(super) async fn authorize_write(
    facade: &Facade,
    req: &HttpRequest,
    verb: &'static str,
    ns: &str,
    name: &str,
    q: &[(String, String)],
) -> KubeResult<()> {
    facade
        .auth
        .authorize(req, &Attrs::resource(verb, Some(ns), Some(name)))
        .await?;
    refuse_dry_run(q, verb)
}

pub async fn patch(
    facade: web::Data<Facade>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    q: Query,
    body: web::Bytes,
) -> KubeResult<HttpResponse> {
    let (ns, name) = path.into_inner();
    authorize_write(&facade, &req, "patch", &ns, &name, &q).await?;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let kind = PatchKind::from_content_type(content_type)?;
    let manager = field_manager(&q, kind)?;
    let validation = param(&q, "fieldValidation");
    let applied = match kind {
        PatchKind::Apply => Some(patch::parse_applied(&body)?),
        _ => None,
    };
    if let Some(n) = applied
        .as_ref()
        .and_then(|a| a["metadata"]["name"].as_str())
        .filter(|n| *n != name)
    {
        return Err(KubeError::bad_request(format!(
            "the name of the object ({n}) does not match the name on the URL ({name})"
        )));
    }
    let Some(r) = facade.existing(&ns, &name).await? else {
        return match (applied, manager) {
            (Some(applied), Some(manager)) => {
                apply_create(&facade, &req, &ns, &name, applied, manager, validation).await
            }
            _ => Err(KubeError::not_found(&name)),
        };
    };
    let current = object_value(&r, facade.revision_of(&r.id))?;
    match (applied, manager) {
        (Some(applied), Some(manager)) => {
            let before = stored::owned(&r, manager);
            let others: Vec<(String, stored::Owned)> = stored::managers(&r)
                .into_iter()
                .filter(|(m, _)| m != manager)
                .collect();
            let clashes = patch::conflicts(&current, &applied, &others);
            // As the API server: another applier's fields are taken only with force=true,
            // which moves their ownership to this manager.
            let taken = match param(&q, "force") {
                Some("true") => patch::forced(&applied, &others),
                _ if clashes.is_empty() => Vec::new(),
                _ => return Err(KubeError::apply_conflicts(&name, &clashes)),
            };
            let (updated, owned) = patch::server_side_apply(&current, &applied, &before)?;
            let mut owners: Vec<(&str, &stored::Owned)> = vec![(manager, &owned)];
            owners.extend(taken.iter().map(|(m, o)| (m.as_str(), o)));
            update_to(&facade, &ns, r, current, updated, &owners, validation).await
        }
        _ => {
            let updated = patch::apply(kind, &current, &body)?;
            update_to(&facade, &ns, r, current, updated, &[], validation).await
        }
    }
}

/// A server-side apply of a sandbox that does not exist: a create (which must be allowed
/// too, as the API server requires), recording what the manager applied.
async fn apply_create(
    facade: &Facade,
    req: &HttpRequest,
    ns: &str,
    name: &str,
    mut applied: Value,
    manager: &str,
    validation: Option<&str>,
) -> KubeResult<HttpResponse> {
    facade
        .auth
        .authorize(req, &Attrs::resource("create", Some(ns), None))
        .await?;
    if let Some(m) = applied["metadata"].as_object_mut() {
        m.insert("name".into(), Value::from(name));
        m.remove("generateName");
    } else if let Some(o) = applied.as_object_mut() {
        o.insert("metadata".into(), serde_json::json!({"name": name}));
    }
    let owned = patch::owned_by(&applied);
    let body = serde_json::to_vec(&applied).map_err(KubeError::internal)?;
    let mut checked = create::check(&body, ns, validation)?;
    if owned != stored::Owned::default() {
        let (k, v) = stored::owned_entry(manager, &owned);
        checked.claim.metadata.insert(k, v);
        update::check_size(name, &checked.claim.metadata)?;
    }
    create_checked(facade, ns, checked).await
}

/// Claims a checked create and answers 201 with the object. A sandbox created `Suspended` is
/// paused before the answer; one that cannot be is released, so a failed create leaves
/// nothing behind.
pub(super) async fn create_checked(
    facade: &Facade,
    ns: &str,
    mut checked: create::Checked,
) -> KubeResult<HttpResponse> {
    // The image may name a template the namespace's team built through e2b.
    checked.claim.key.template = facade
        .dispatcher
        .template_for(ns, &checked.claim.key.template)
        .await?;
    let mut claimed = facade.dispatcher.claim(checked.claim).await?;
    if checked.suspended {
        let id = claimed.record.id.clone();
        match facade.dispatcher.set_paused(Some(ns), &id, true).await {
            Ok((paused, _)) => {
                let token = std::mem::take(&mut claimed.record.token);
                claimed.record = SandboxRecord { token, ..paused };
            }
            Err(e) => {
                if let Err(gone) = facade.dispatcher.release(Some(ns), &id).await {
                    tracing::warn!(id, error = %gone, "releasing a sandbox whose create failed");
                }
                return Err(e.into());
            }
        }
    }
    let rv = facade.revision_of(&claimed.record.id);
    let object = create::reply(checked.object, &claimed, ns, rv);
    Ok(reply(StatusCode::CREATED, &object, &checked.warnings))
}

pub async fn replace(
    facade: web::Data<Facade>,
    req: HttpRequest,
    path: web::Path<(String, String)>,
    q: Query,
    body: web::Bytes,
) -> KubeResult<HttpResponse> {
    let (ns, name) = path.into_inner();
    authorize_write(&facade, &req, "update", &ns, &name, &q).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(KubeError::bad_request(
            "the request body is empty: send the Sandbox object",
        ));
    }
    let updated: Value = serde_json::from_slice(&body).map_err(|e| {
        KubeError::bad_request(format!("the request body is not a JSON object: {e}"))
    })?;
    let r = facade
        .existing(&ns, &name)
        .await?
        .ok_or_else(|| KubeError::not_found(&name))?;
    let current = object_value(&r, facade.revision_of(&r.id))?;
    update_to(
        &facade,
        &ns,
        r,
        current,
        updated,
        &[],
        param(&q, "fieldValidation"),
    )
    .await
}
