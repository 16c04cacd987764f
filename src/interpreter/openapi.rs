//! The code interpreter's OpenAPI document (port 49999 of a `code-interpreter` sandbox),
//! generated from the handlers. The checked-in copy is `openapi/interpreter.json`;
//! `sandbox-gateway openapi --interpreter` prints the current one. The handlers read their
//! bodies by hand (to answer FastAPI-shaped 422s); these types only describe them.

use std::collections::BTreeMap;

use serde::Serialize;
use utoipa::{OpenApi, ToSchema};

/// `POST /execute`'s body. Empty strings count as absent.
#[allow(dead_code)]
#[derive(Serialize, ToSchema)]
pub struct ExecuteRequest {
    /// The code to run.
    pub code: String,
    /// A context to run in (from `POST /contexts`); not together with `language`.
    pub context_id: Option<String>,
    /// Runs in this language's default context (`python` when neither is given).
    pub language: Option<String>,
    /// Environment variables for this run only.
    pub env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`' body.
#[allow(dead_code)]
#[derive(Serialize, ToSchema)]
pub struct CreateContext {
    /// `python` when absent; `js` and `ts` name `javascript` and `typescript`.
    pub language: Option<String>,
    /// An absolute directory of the sandbox (default `/home/user`).
    pub cwd: Option<String>,
}

/// A context: a kernel with its language and working directory.
#[allow(dead_code)]
#[derive(Serialize, ToSchema)]
pub struct Context {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandbox-gateway code interpreter",
        description = "e2b's Code Interpreter API, served on port 49999 of every sandbox of the code-interpreter template (reach it through the gateway with `E2b-Sandbox-Id` and `E2b-Sandbox-Port: 49999`, or at `49999-{sandboxID}.{domain}`). `POST /execute` answers 200 at once and streams one JSON object per line: `number_of_executions` {execution_count}, `stdout`/`stderr` {text, timestamp}, `result` {text, html, markdown, svg, png, jpeg, pdf, latex, json, javascript, data, chart, extra, is_main_result}, `error` {name, value, traceback}, `keepalive` (after 5 s without a line) and, last, `end_of_execution`. Errors are plain text; a body that does not fit is a 422 with a `detail` list."
    ),
    paths(
        super::http::health,
        super::http::execute,
        super::http::create_context,
        super::http::list_contexts,
        super::http::restart_context,
        super::http::remove_context,
    ),
    components(schemas(ExecuteRequest, CreateContext, Context))
)]
pub struct ApiDoc;

/// The document as pretty-printed JSON with a trailing newline.
pub fn document_json() -> String {
    let mut s = serde_json::to_string_pretty(&ApiDoc::openapi()).unwrap_or_else(|e| {
        format!("{{\"error\": \"the OpenAPI document could not be rendered: {e}\"}}")
    });
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_checked_in_document_is_current() {
        assert_eq!(
            super::document_json(),
            include_str!("../../openapi/interpreter.json"),
            "openapi/interpreter.json is stale: run `cargo run -- openapi --interpreter > openapi/interpreter.json`"
        );
    }
}
