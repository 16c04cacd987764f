//! The HTTP API on port 49999, as e2b's Code Interpreter SDKs call it: `GET /health`,
//! `POST /execute` (a stream of JSON lines), `POST`/`GET /contexts`,
//! `POST /contexts/{id}/restart`, `DELETE /contexts/{id}`. Errors are plain text with the
//! status the SDKs map (400, 404, 500, …); a request body that does not fit is a 422 with a
//! FastAPI-shaped `detail` list, as upstream answers.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::{Value, json};
use tokio_stream::StreamExt;

use super::execute::{self, LINE_BUFFER};
use super::languages;
use super::server::{Refusal, Server};

/// Largest request body (code is text; anything near this is a mistake or an attack).
pub const MAX_BODY: usize = 32 << 20;

pub fn router(server: Arc<Server>) -> axum::Router {
    axum::Router::new()
        .route("/health", get(health))
        .route("/execute", post(execute))
        .route("/contexts", post(create_context).get(list_contexts))
        .route("/contexts/{id}/restart", post(restart_context))
        .route("/contexts/{id}", delete(remove_context))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(cors))
        .with_state(server)
}

fn text(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = match &self {
            Refusal::BadRequest(_) => StatusCode::BAD_REQUEST,
            Refusal::NotFound(_) => StatusCode::NOT_FOUND,
            Refusal::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            Refusal::Unavailable(_) => StatusCode::NOT_IMPLEMENTED,
            Refusal::Failed(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        text(status, self.to_string())
    }
}

/// Any origin may call, as upstream allows (the gateway decides who reaches the port).
async fn cors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let preflight = req.method() == Method::OPTIONS;
    let mut res = if preflight {
        StatusCode::OK.into_response()
    } else {
        next.run(req).await
    };
    let h = res.headers_mut();
    h.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    if preflight {
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("*"),
        );
    }
    res
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "Not Found")
}

#[utoipa::path(get, path = "/health", tag = "interpreter", responses(
    (status = 200, description = "the default contexts are up", body = String, example = json!("OK")),
    (status = 503, description = "starting", content_type = "text/plain")))]
pub async fn health(State(server): State<Arc<Server>>) -> Response {
    if server.started() {
        axum::Json("OK").into_response()
    } else {
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the default contexts' kernels are not up yet (or did not start: see the server's log)",
        )
    }
}

/// A FastAPI-shaped validation failure (422 with a `detail` list).
struct Invalid(Value);

fn invalid(kind: &str, loc: &[&str], msg: &str, input: &Value) -> Invalid {
    Invalid(json!({"detail": [{"type": kind, "loc": loc, "msg": msg, "input": input}]}))
}

impl IntoResponse for Invalid {
    fn into_response(self) -> Response {
        (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(self.0)).into_response()
    }
}

/// The JSON object a body must be.
fn object(body: &Bytes) -> Result<serde_json::Map<String, Value>, Invalid> {
    if body.is_empty() {
        return Err(invalid(
            "missing",
            &["body"],
            "Field required",
            &Value::Null,
        ));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(invalid(
            "model_attributes_type",
            &["body"],
            "Input should be a valid dictionary or object to extract fields from",
            &other,
        )),
        Err(e) => Err(invalid(
            "json_invalid",
            &["body"],
            &format!("JSON decode error: {e}"),
            &Value::Null,
        )),
    }
}

/// An optional string field: absent, null and "" are all none.
fn optional_string(
    m: &serde_json::Map<String, Value>,
    key: &str,
) -> Result<Option<String>, Invalid> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(
            "string_type",
            &["body", key],
            "Input should be a valid string",
            other,
        )),
    }
}

/// What `/execute` asks for.
struct ExecuteBody {
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: BTreeMap<String, String>,
}

fn execute_body(body: &Bytes) -> Result<ExecuteBody, Invalid> {
    let m = object(body)?;
    let code = match m.get("code") {
        Some(Value::String(c)) => c.clone(),
        None => {
            return Err(invalid(
                "missing",
                &["body", "code"],
                "Field required",
                &Value::Object(m),
            ));
        }
        Some(other) => {
            return Err(invalid(
                "string_type",
                &["body", "code"],
                "Input should be a valid string",
                other,
            ));
        }
    };
    let mut env_vars = BTreeMap::new();
    match m.get("env_vars") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            for (k, v) in o {
                let Value::String(v) = v else {
                    return Err(invalid(
                        "string_type",
                        &["body", "env_vars", k],
                        "Input should be a valid string",
                        v,
                    ));
                };
                env_vars.insert(k.clone(), v.clone());
            }
        }
        Some(other) => {
            return Err(invalid(
                "dict_type",
                &["body", "env_vars"],
                "Input should be a valid dictionary",
                other,
            ));
        }
    }
    Ok(ExecuteBody {
        code,
        context_id: optional_string(&m, "context_id")?,
        language: optional_string(&m, "language")?,
        env_vars,
    })
}

#[utoipa::path(post, path = "/execute", tag = "interpreter", request_body = super::openapi::ExecuteRequest, responses(
    (status = 200, description = "the run's lines, streamed as they come", content_type = "application/x-ndjson", body = String),
    (status = 400, description = "context_id and language both, an unknown language, a bad variable name", content_type = "text/plain", body = String),
    (status = 404, description = "no such context", content_type = "text/plain", body = String),
    (status = 422, description = "a body that does not fit"),
    (status = 429, description = "the language's default context had to be made and no more fit", content_type = "text/plain", body = String)))]
pub async fn execute(State(server): State<Arc<Server>>, body: Bytes) -> Response {
    let req = match execute_body(&body) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Some(k) = req.env_vars.keys().find(|k| !languages::valid_env_name(k)) {
        return text(
            StatusCode::BAD_REQUEST,
            format!("{k:?} cannot be an environment variable name"),
        );
    }
    // No environment can hold a NUL byte; the statements that set it would fail in the kernel.
    if let Some(k) = req
        .env_vars
        .iter()
        .find(|(_, v)| v.contains('\0'))
        .map(|(k, _)| k)
    {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "the value of {k:?} contains a NUL byte, which no environment variable can hold"
            ),
        );
    }
    let ctx = match server
        .context_for(req.context_id.as_deref(), req.language.as_deref())
        .await
    {
        Ok(c) => c,
        Err(r) => return r.into_response(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(LINE_BUFFER);
    tokio::spawn(execute::run(
        server,
        ctx,
        execute::Request {
            code: req.code,
            env_vars: req.env_vars,
        },
        tx,
    ));
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, std::io::Error>);
    // No Content-Type, as upstream: the SDKs read lines whatever it says.
    Response::builder()
        .status(StatusCode::OK)
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "building the response"))
}

fn context_json(c: &super::contexts::Context) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd.to_string_lossy()})
}

#[utoipa::path(post, path = "/contexts", tag = "contexts", request_body = super::openapi::CreateContext, responses(
    (status = 200, body = super::openapi::Context),
    (status = 400, description = "an unknown language, a cwd that is not a directory", content_type = "text/plain", body = String),
    (status = 422, description = "a body that does not fit"),
    (status = 429, description = "no more contexts fit", content_type = "text/plain", body = String)))]
pub async fn create_context(State(server): State<Arc<Server>>, body: Bytes) -> Response {
    let parsed = object(&body).and_then(|m| {
        Ok((
            optional_string(&m, "language")?,
            optional_string(&m, "cwd")?,
        ))
    });
    let (language, cwd) = match parsed {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    match server
        .create(language.as_deref(), cwd.as_deref(), false)
        .await
    {
        Ok(c) => axum::Json(context_json(&c)).into_response(),
        Err(r) => r.into_response(),
    }
}

#[utoipa::path(get, path = "/contexts", tag = "contexts", responses(
    (status = 200, description = "in the order they were made", body = [super::openapi::Context])))]
pub async fn list_contexts(State(server): State<Arc<Server>>) -> Response {
    let list: Vec<Value> = server
        .contexts
        .list()
        .iter()
        .map(|c| context_json(c))
        .collect();
    axum::Json(list).into_response()
}

#[utoipa::path(post, path = "/contexts/{id}/restart", tag = "contexts", params(("id" = String, Path)), responses(
    (status = 200, description = "a new kernel, same id, language and cwd; JSON null"),
    (status = 404, description = "no such context", content_type = "text/plain", body = String)))]
pub async fn restart_context(
    State(server): State<Arc<Server>>,
    Path(id): Path<String>,
) -> Response {
    let Some(ctx) = server.contexts.get(&id) else {
        return text(StatusCode::NOT_FOUND, format!("Context {id} not found"));
    };
    match ctx.restart().await {
        Ok(()) => axum::Json(Value::Null).into_response(),
        Err(why) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Failed to restart context {id}: {why}"),
        ),
    }
}

#[utoipa::path(delete, path = "/contexts/{id}", tag = "contexts", params(("id" = String, Path)), responses(
    (status = 200, description = "its kernel ended; JSON null"),
    (status = 404, description = "no such context", content_type = "text/plain", body = String)))]
pub async fn remove_context(State(server): State<Arc<Server>>, Path(id): Path<String>) -> Response {
    let Some(ctx) = server.contexts.remove(&id) else {
        return text(StatusCode::NOT_FOUND, format!("Context {id} not found"));
    };
    ctx.close().await;
    axum::Json(Value::Null).into_response()
}
