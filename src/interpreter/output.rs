//! The lines of an `/execute` stream: one JSON object per line, each with a `type`, as e2b's
//! SDKs parse them. Results carry a kernel's MIME bundle moved onto fixed fields (`text`,
//! `html`, `png`, `chart`, …) with everything else under `extra`.

use serde::Serialize;
use serde_json::{Map, Value};

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    NumberOfExecutions {
        execution_count: i64,
    },
    Stdout {
        text: String,
        timestamp: String,
    },
    Stderr {
        text: String,
        timestamp: String,
    },
    Result(ResultLine),
    Error {
        name: String,
        value: String,
        traceback: String,
    },
    Keepalive,
    EndOfExecution,
}

impl Line {
    pub fn error(name: &str, value: impl Into<String>) -> Line {
        Line::Error {
            name: name.to_string(),
            value: value.into(),
            traceback: String::new(),
        }
    }

    /// The line as the wire carries it: compact JSON and a newline. Never fails: every
    /// value in a line is already JSON.
    pub fn to_bytes(&self) -> bytes::Bytes {
        let mut out = serde_json::to_vec(self).unwrap_or_else(|_| {
            br#"{"type":"error","name":"ServerError","value":"unencodable line","traceback":""}"#
                .to_vec()
        });
        out.push(b'\n');
        out.into()
    }
}

/// A `result` line: the mapped MIME fields, `extra` (always present) and `is_main_result`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ResultLine {
    #[serde(flatten)]
    pub fields: Map<String, Value>,
    pub extra: Map<String, Value>,
    pub is_main_result: bool,
}

/// Jupyter MIME types and the result fields they become.
const FIELDS: &[(&str, &str)] = &[
    ("text/plain", "text"),
    ("text/html", "html"),
    ("text/markdown", "markdown"),
    ("image/svg+xml", "svg"),
    ("image/png", "png"),
    ("image/jpeg", "jpeg"),
    ("application/pdf", "pdf"),
    ("text/latex", "latex"),
    ("application/json", "json"),
    ("application/javascript", "javascript"),
    ("e2b/data", "data"),
    ("e2b/chart", "chart"),
];

/// Maps a kernel's MIME bundle onto a result line. Null values are left out; a string that
/// both starts and ends with the same quote loses that one pair in `text` (so a string
/// result reads `hello`, not `'hello'`); non-finite numbers never reach the wire (the JSON
/// parsers of the SDKs would refuse them; serde_json has no NaN, so nothing to do there).
pub fn result(bundle: Map<String, Value>, is_main_result: bool) -> ResultLine {
    let mut fields = Map::new();
    let mut extra = Map::new();
    for (mime, value) in bundle {
        if value.is_null() {
            continue;
        }
        match FIELDS.iter().find(|(m, _)| *m == mime) {
            Some((_, "text")) => {
                let text = match value {
                    Value::String(s) => strip_quotes(&s).to_string(),
                    other => other.to_string(),
                };
                fields.insert("text".into(), Value::String(text));
            }
            Some((_, field)) => {
                fields.insert((*field).to_string(), value);
            }
            None => {
                extra.insert(mime, value);
            }
        }
    }
    ResultLine {
        fields,
        extra,
        is_main_result,
    }
}

/// One pair of matching quotes around the whole text is removed.
fn strip_quotes(s: &str) -> &str {
    for q in ['\'', '"'] {
        if s.len() >= 2
            && s.starts_with(q)
            && s.ends_with(q)
            && let Some(inner) = s.get(1..s.len() - 1)
        {
            return inner;
        }
    }
    s
}

/// A Jupyter traceback (a list of frames) as one string: upstream joins the frames with no
/// separator, and the SDKs show it as is.
pub fn traceback(frames: &[String]) -> String {
    frames.concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bundle(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn lines_are_compact_json_with_a_type_and_a_newline() {
        let l = Line::NumberOfExecutions { execution_count: 3 };
        assert_eq!(
            &l.to_bytes()[..],
            b"{\"type\":\"number_of_executions\",\"execution_count\":3}\n"
        );
        assert_eq!(
            &Line::Keepalive.to_bytes()[..],
            b"{\"type\":\"keepalive\"}\n"
        );
        assert_eq!(
            &Line::EndOfExecution.to_bytes()[..],
            b"{\"type\":\"end_of_execution\"}\n"
        );
        let e = Line::error("ExecutionAborted", "Execution was aborted");
        let v: Value = serde_json::from_slice(&e.to_bytes()).unwrap();
        assert_eq!(
            v,
            json!({"type": "error", "name": "ExecutionAborted", "value": "Execution was aborted", "traceback": ""})
        );
        let s = Line::Stdout {
            text: "hi\n".into(),
            timestamp: "2026-12-04T05:33:07.044754+00:00".into(),
        };
        let v: Value = serde_json::from_slice(&s.to_bytes()).unwrap();
        assert_eq!(v["type"], "stdout");
        assert_eq!(v["text"], "hi\n");
    }

    #[test]
    fn a_bundle_moves_onto_fields_and_the_rest_into_extra() {
        let r = result(
            bundle(json!({
                "text/plain": "{'a': 1}",
                "application/json": {"a": 1},
                "image/png": "iVBOR",
                "e2b/chart": {"type": "line", "elements": []},
                "e2b/data": {"a": [1, null]},
                "application/vnd.custom+json": {"k": true},
                "text/html": null,
            })),
            true,
        );
        let v = serde_json::to_value(Line::Result(r)).unwrap();
        assert_eq!(
            v,
            json!({
                "type": "result",
                "text": "{'a': 1}",
                "json": {"a": 1},
                "png": "iVBOR",
                "chart": {"type": "line", "elements": []},
                "data": {"a": [1, null]},
                "extra": {"application/vnd.custom+json": {"k": true}},
                "is_main_result": true,
            })
        );
    }

    #[test]
    fn extra_is_always_present_and_empty_bundles_still_say_whether_main() {
        let v = serde_json::to_value(Line::Result(result(Map::new(), false))).unwrap();
        assert_eq!(
            v,
            json!({"type": "result", "extra": {}, "is_main_result": false})
        );
    }

    #[test]
    fn one_pair_of_matching_quotes_is_stripped_from_text() {
        let text = |s: &str| {
            result(bundle(json!({"text/plain": s})), true).fields["text"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(text("'hello'"), "hello");
        assert_eq!(text("\"Hello World!\""), "Hello World!");
        assert_eq!(text("'/home/user'"), "/home/user");
        assert_eq!(text("\"'x'\""), "'x'");
        assert_eq!(text("'a\""), "'a\"");
        assert_eq!(text("'"), "'");
        assert_eq!(text("''"), "");
        assert_eq!(text("2"), "2");
        assert_eq!(text("'é'"), "é");
    }

    #[test]
    fn tracebacks_join_without_separator() {
        assert_eq!(traceback(&["a\n".into(), "b".into()]), "a\nb");
        assert_eq!(traceback(&[]), "");
    }
}
