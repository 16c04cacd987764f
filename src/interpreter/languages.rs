//! Languages: how a request's `language` is normalised, and the statements that set and
//! remove environment variables in each kernel family (run as silent executions, so that the
//! user's code and its tracebacks stay as written).

use std::collections::BTreeMap;

/// The language a request names, normalised as upstream does: missing or empty is python,
/// otherwise lower-cased and trimmed, with `js` and `ts` as aliases.
pub fn normalise(language: Option<&str>) -> String {
    let l = language.map(str::trim).unwrap_or_default().to_lowercase();
    match l.as_str() {
        "" => "python".into(),
        "js" => "javascript".into(),
        "ts" => "typescript".into(),
        _ => l,
    }
}

/// What a kernel's code looks like, from its kernelspec's `language`: the statements below
/// differ by family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Python,
    /// JavaScript and TypeScript kernels (Node.js or Deno): both have `process.env`.
    JavaScript,
    R,
    Bash,
    /// Java has no settable environment: upstream uses system properties, and so do we.
    Java,
    Other,
}

impl Family {
    pub fn of(kernelspec_language: &str) -> Family {
        match kernelspec_language.trim().to_lowercase().as_str() {
            "python" | "python3" => Family::Python,
            "javascript" | "typescript" | "js" | "ts" => Family::JavaScript,
            "r" => Family::R,
            "bash" | "sh" => Family::Bash,
            "java" => Family::Java,
            _ => Family::Other,
        }
    }
}

/// A string literal every family understands: a JSON string is a valid literal in Python,
/// JavaScript, R and Java (serde_json escapes quotes, backslashes and control characters and
/// leaves the rest as UTF-8).
fn literal(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A single-quoted shell word.
fn shell_word(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether `name` can be an environment variable: not empty, no `=` and no NUL. The shell is
/// stricter (an identifier); `bash_identifier` says which names it can take.
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

fn bash_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Code that gives the kernel these variables: `Some(value)` sets, `None` removes. Empty when
/// there is nothing to do or the family has no way to do it.
pub fn env_code(family: Family, changes: &BTreeMap<String, Option<String>>) -> String {
    let mut out = String::new();
    for (k, v) in changes {
        let line = match (family, v) {
            (Family::Python, Some(v)) => {
                format!("__import__('os').environ[{}] = {}", literal(k), literal(v))
            }
            (Family::Python, None) => {
                format!("__import__('os').environ.pop({}, None)", literal(k))
            }
            (Family::JavaScript, Some(v)) => {
                format!("process.env[{}] = {};", literal(k), literal(v))
            }
            (Family::JavaScript, None) => format!("delete process.env[{}];", literal(k)),
            (Family::R, Some(v)) => format!(
                "do.call(Sys.setenv, stats::setNames(list({}), {}))",
                literal(v),
                literal(k)
            ),
            (Family::R, None) => format!("invisible(Sys.unsetenv({}))", literal(k)),
            (Family::Bash, _) if !bash_identifier(k) => continue,
            (Family::Bash, Some(v)) => format!("export {k}={}", shell_word(v)),
            (Family::Bash, None) => format!("unset {k}"),
            (Family::Java, Some(v)) => {
                format!("System.setProperty({}, {});", literal(k), literal(v))
            }
            (Family::Java, None) => format!("System.clearProperty({});", literal(k)),
            (Family::Other, _) => continue,
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_normalise_as_upstream() {
        assert_eq!(normalise(None), "python");
        assert_eq!(normalise(Some("")), "python");
        assert_eq!(normalise(Some("  Python ")), "python");
        assert_eq!(normalise(Some("JS")), "javascript");
        assert_eq!(normalise(Some("ts")), "typescript");
        assert_eq!(normalise(Some("R")), "r");
        assert_eq!(normalise(Some("cobol")), "cobol");
    }

    #[test]
    fn families_come_from_the_kernelspec_language() {
        assert_eq!(Family::of("python"), Family::Python);
        assert_eq!(Family::of("TypeScript"), Family::JavaScript);
        assert_eq!(Family::of("javascript"), Family::JavaScript);
        assert_eq!(Family::of("R"), Family::R);
        assert_eq!(Family::of("bash"), Family::Bash);
        assert_eq!(Family::of("java"), Family::Java);
        assert_eq!(Family::of("scala"), Family::Other);
    }

    fn changes(pairs: &[(&str, Option<&str>)]) -> BTreeMap<String, Option<String>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect()
    }

    #[test]
    fn statements_quote_what_they_are_given() {
        let hostile = changes(&[("A", Some("x\"'\\\n$(id)`é")), ("GONE", None)]);
        assert_eq!(
            env_code(Family::Python, &hostile),
            "__import__('os').environ[\"A\"] = \"x\\\"'\\\\\\n$(id)`é\"\n__import__('os').environ.pop(\"GONE\", None)\n"
        );
        assert_eq!(
            env_code(Family::JavaScript, &hostile),
            "process.env[\"A\"] = \"x\\\"'\\\\\\n$(id)`é\";\ndelete process.env[\"GONE\"];\n"
        );
        assert_eq!(
            env_code(Family::Bash, &hostile),
            "export A='x\"'\\''\\\n$(id)`é'\nunset GONE\n"
        );
        assert_eq!(
            env_code(Family::R, &changes(&[("A-B", Some("v"))])),
            "do.call(Sys.setenv, stats::setNames(list(\"v\"), \"A-B\"))\n"
        );
        assert_eq!(
            env_code(Family::Java, &changes(&[("k", Some("v")), ("j", None)])),
            "System.clearProperty(\"j\");\nSystem.setProperty(\"k\", \"v\");\n"
        );
        assert_eq!(env_code(Family::Other, &hostile), "");
    }

    #[test]
    fn the_shell_takes_identifiers_only() {
        assert_eq!(
            env_code(
                Family::Bash,
                &changes(&[("A-B", Some("v")), ("_ok1", Some("v"))])
            ),
            "export _ok1='v'\n"
        );
        assert!(valid_env_name("A-B"));
        assert!(!valid_env_name(""));
        assert!(!valid_env_name("A=B"));
        assert!(!valid_env_name("A\0"));
    }
}
