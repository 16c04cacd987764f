//! e2b template names: `[namespace/]alias[:tag]`, tags and build resources.
//!
//! The rules follow e2b's INFRA (`shared/pkg/id/id.go`, `team/limits.go`) so that names and
//! requests the upstream API accepts are accepted here and the ones it refuses are refused
//! with the same 400 and a message starting "Invalid name: " / "Invalid tag: " (contract
//! `template-build.md` §3.1, §9.1, §9.3).

use rand::Rng;

use crate::model::{Error, Result};

/// The tag a name without `:tag` means; it cannot be deleted.
pub const DEFAULT_TAG: &str = "default";

/// Build resources when the request leaves them out (INFRA `constants/templates.go`).
pub const DEFAULT_CPU_COUNT: u32 = 2;
pub const DEFAULT_MEMORY_MB: u64 = 1024;
pub const MAX_CPU_COUNT: u32 = 32;
pub const MIN_MEMORY_MB: u64 = 128;
pub const MAX_MEMORY_MB: u64 = 65536;

/// Length of a generated template ID (INFRA `id.Generate`).
pub const TEMPLATE_ID_LEN: usize = 20;

/// A parsed `[namespace/]alias[:tag]`, lowercased. `tag` is `None` for no tag and for
/// `default`, which mean the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateName {
    pub namespace: Option<String>,
    pub alias: String,
    pub tag: Option<String>,
}

/// `^[a-z0-9-_]+$`: aliases and namespaces.
fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// `^[a-z0-9-_.]+$`: tags (a dot is allowed so that versions like `v1.2` work).
fn is_tag_text(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_' || b == b'.'
        })
}

/// Parses a template name as e2b clients send it (`POST /v3/templates` `name`, and the
/// `GET /templates/aliases/{name}` path). The input is trimmed and lowercased first.
pub fn parse(input: &str) -> Result<TemplateName> {
    let name = input.trim().to_lowercase();
    if name.is_empty() {
        return Err(Error::invalid("Invalid name: the name is empty"));
    }
    let (base, tag) = match name.split_once(':') {
        None => (name.as_str(), None),
        Some((_, rest)) if rest.contains(':') => {
            return Err(Error::invalid(format!(
                "Invalid name: '{name}' has more than one ':'"
            )));
        }
        Some((base, tag)) => (base, Some(tag)),
    };
    let (namespace, alias) = match base.split_once('/') {
        None => (None, base),
        Some((_, rest)) if rest.contains('/') => {
            return Err(Error::invalid(format!(
                "Invalid name: '{name}' has more than one '/'"
            )));
        }
        Some((namespace, alias)) => {
            if !is_identifier(namespace) {
                return Err(Error::invalid(format!(
                    "Invalid name: the namespace '{namespace}' must be lowercase letters, digits, '-' and '_'"
                )));
            }
            (Some(namespace.to_string()), alias)
        }
    };
    if alias.is_empty() {
        return Err(Error::invalid(format!(
            "Invalid name: '{name}' has an empty name"
        )));
    }
    if !is_identifier(alias) {
        return Err(Error::invalid(format!(
            "Invalid name: '{alias}' must be lowercase letters, digits, '-' and '_'"
        )));
    }
    let tag = match tag {
        None => None,
        Some(tag) => {
            let tag = parse_tag(tag)?;
            // `name:default` is the same template as `name`: one spelling is kept.
            (tag != DEFAULT_TAG).then_some(tag)
        }
    };
    Ok(TemplateName {
        namespace,
        alias: alias.to_string(),
        tag,
    })
}

/// Validates one tag (from a name or from a `tags[]` list), returning it lowercased.
/// `default` is a valid tag here and is returned as is.
pub fn parse_tag(tag: &str) -> Result<String> {
    let tag = tag.trim().to_lowercase();
    if tag.is_empty() {
        return Err(Error::invalid("Invalid tag: the tag is empty"));
    }
    if !is_tag_text(&tag) {
        return Err(Error::invalid(format!(
            "Invalid tag: '{tag}' must be lowercase letters, digits, '-', '_' and '.'"
        )));
    }
    // Builds are addressed by UUID too, so a tag that looks like one would be ambiguous.
    if uuid::Uuid::parse_str(&tag).is_ok() {
        return Err(Error::invalid(format!(
            "Invalid tag: '{tag}' looks like a build ID (a UUID)"
        )));
    }
    Ok(tag)
}

/// The tags a new build is registered under: the tag from its name plus the request's
/// `tags[]`, deduplicated and sorted; `["default"]` when there are none.
pub fn build_tags(from_name: Option<&str>, extra: &[String]) -> Result<Vec<String>> {
    let mut tags = Vec::with_capacity(extra.len() + 1);
    for tag in from_name
        .into_iter()
        .chain(extra.iter().map(String::as_str))
    {
        tags.push(parse_tag(tag)?);
    }
    tags.sort();
    tags.dedup();
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.to_string());
    }
    Ok(tags)
}

/// A name may spell out its namespace, but only its own team's: templates are looked up and
/// created in the caller's namespace, so another one is refused rather than ignored.
pub fn check_namespace(name: &TemplateName, team_namespace: &str) -> Result<()> {
    match &name.namespace {
        // Names are lowercased, so the team's namespace is compared without case.
        Some(ns) if !ns.eq_ignore_ascii_case(team_namespace) => Err(Error::invalid(format!(
            "Invalid name: namespace '{ns}' is not your team's ('{team_namespace}')"
        ))),
        _ => Ok(()),
    }
}

/// `cpuCount` and `memoryMB` of a build request, with defaults, checked like INFRA does.
pub fn validate_resources(cpu_count: Option<i64>, memory_mb: Option<i64>) -> Result<(u32, u64)> {
    let cpu = cpu_count.unwrap_or(i64::from(DEFAULT_CPU_COUNT));
    if cpu < 1 {
        return Err(Error::invalid(format!(
            "cpuCount must be at least 1 (got {cpu})"
        )));
    }
    if cpu > i64::from(MAX_CPU_COUNT) {
        return Err(Error::invalid(format!(
            "cpuCount {cpu} exceeds the maximum of {MAX_CPU_COUNT}"
        )));
    }
    if cpu != 1 && cpu % 2 != 0 {
        return Err(Error::invalid(format!(
            "cpuCount must be 1 or an even number (got {cpu})"
        )));
    }
    let memory = memory_mb.unwrap_or(DEFAULT_MEMORY_MB as i64);
    if memory < MIN_MEMORY_MB as i64 {
        return Err(Error::invalid(format!(
            "memoryMB must be at least {MIN_MEMORY_MB} (got {memory})"
        )));
    }
    if memory > MAX_MEMORY_MB as i64 {
        return Err(Error::invalid(format!(
            "memoryMB {memory} exceeds the maximum of {MAX_MEMORY_MB} ({} GiB)",
            MAX_MEMORY_MB / 1024
        )));
    }
    if memory % 2 != 0 {
        return Err(Error::invalid(format!(
            "memoryMB must be an even number (got {memory})"
        )));
    }
    // Both are in range now, so the conversions cannot fail.
    let (Ok(cpu), Ok(memory)) = (u32::try_from(cpu), u64::try_from(memory)) else {
        return Err(Error::internal(
            "resource values out of range after checking",
        ));
    };
    Ok((cpu, memory))
}

/// A new template ID: 20 random characters of `[a-z0-9]`, like upstream's, so that it is a
/// valid alias-like identifier and DNS-safe.
pub fn new_template_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..TEMPLATE_ID_LEN)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ErrorKind;

    fn name(ns: Option<&str>, alias: &str, tag: Option<&str>) -> TemplateName {
        TemplateName {
            namespace: ns.map(str::to_string),
            alias: alias.to_string(),
            tag: tag.map(str::to_string),
        }
    }

    fn invalid(input: &str, prefix: &str) {
        let e = parse(input).expect_err(input);
        assert_eq!(e.kind, ErrorKind::Invalid, "{input}: {e}");
        assert!(e.message.starts_with(prefix), "{input}: {e}");
    }

    #[test]
    fn plain_tagged_and_namespaced_names_parse() {
        assert_eq!(parse("my-tpl").unwrap(), name(None, "my-tpl", None));
        assert_eq!(parse("my_tpl2").unwrap(), name(None, "my_tpl2", None));
        assert_eq!(
            parse("my-tpl:v1").unwrap(),
            name(None, "my-tpl", Some("v1"))
        );
        assert_eq!(
            parse("my-tpl:v1.2_rc-3").unwrap(),
            name(None, "my-tpl", Some("v1.2_rc-3"))
        );
        assert_eq!(
            parse("ns/alias:tag").unwrap(),
            name(Some("ns"), "alias", Some("tag"))
        );
        assert_eq!(parse("ns/alias").unwrap(), name(Some("ns"), "alias", None));
    }

    #[test]
    fn names_are_trimmed_and_lowercased() {
        assert_eq!(
            parse("  Team/My-Tpl:V1 \n").unwrap(),
            name(Some("team"), "my-tpl", Some("v1"))
        );
        assert_eq!(parse("\tBASE ").unwrap(), name(None, "base", None));
    }

    #[test]
    fn default_tag_is_no_tag() {
        assert_eq!(parse("base:default").unwrap(), name(None, "base", None));
        assert_eq!(parse("base:DEFAULT").unwrap(), name(None, "base", None));
        assert_eq!(parse("base:default").unwrap(), parse("base").unwrap());
    }

    #[test]
    fn bad_names_are_refused_with_the_upstream_prefixes() {
        invalid("", "Invalid name: ");
        invalid("   ", "Invalid name: ");
        invalid(":x", "Invalid name: ");
        invalid("ns/:x", "Invalid name: ");
        invalid("/alias", "Invalid name: ");
        invalid("ns/", "Invalid name: ");
        invalid("a/b/c", "Invalid name: ");
        invalid("a:b:c", "Invalid name: ");
        invalid("my tpl", "Invalid name: ");
        invalid("my.tpl", "Invalid name: ");
        invalid("tpl!", "Invalid name: ");
        invalid("n s/alias", "Invalid name: ");
        invalid("ünïcode", "Invalid name: ");
        invalid("name:", "Invalid tag: ");
        invalid("name:v 1", "Invalid tag: ");
        invalid("name:v/1", "Invalid tag: ");
        invalid("name:v1!", "Invalid tag: ");
    }

    #[test]
    fn uuid_tags_are_refused() {
        invalid("name:6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b", "Invalid tag: ");
        invalid("name:6F1C2A3B-4D5E-4F60-8A7B-9C0D1E2F3A4B", "Invalid tag: ");
        // The simple (undashed) form parses as a UUID too, as it does upstream.
        invalid("name:6f1c2a3b4d5e4f608a7b9c0d1e2f3a4b", "Invalid tag: ");
        assert!(parse_tag("6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4").is_ok());
    }

    #[test]
    fn parse_tag_validates_and_keeps_default() {
        assert_eq!(parse_tag("default").unwrap(), "default");
        assert_eq!(parse_tag(" Stable ").unwrap(), "stable");
        assert_eq!(parse_tag("v1.2").unwrap(), "v1.2");
        for bad in ["", " ", "a b", "a:b", "a/b", "a+b"] {
            let e = parse_tag(bad).expect_err(bad);
            assert_eq!(e.kind, ErrorKind::Invalid);
            assert!(e.message.starts_with("Invalid tag: "), "{bad}: {e}");
        }
    }

    #[test]
    fn build_tags_merge_dedupe_sort_and_default() {
        let s = |v: &[&str]| v.iter().map(|t| t.to_string()).collect::<Vec<_>>();
        assert_eq!(build_tags(None, &[]).unwrap(), s(&["default"]));
        assert_eq!(build_tags(Some("v1"), &[]).unwrap(), s(&["v1"]));
        assert_eq!(
            build_tags(Some("v1"), &s(&["stable", "V1", "alpha"])).unwrap(),
            s(&["alpha", "stable", "v1"])
        );
        assert_eq!(
            build_tags(None, &s(&["default", "x"])).unwrap(),
            s(&["default", "x"])
        );
        let e = build_tags(Some("v1"), &s(&["ok", "not ok"])).unwrap_err();
        assert!(e.message.starts_with("Invalid tag: "), "{e}");
        assert!(build_tags(Some("6f1c2a3b-4d5e-4f60-8a7b-9c0d1e2f3a4b"), &[]).is_err());
    }

    #[test]
    fn only_the_teams_namespace_is_accepted() {
        assert!(check_namespace(&parse("alias").unwrap(), "default").is_ok());
        assert!(check_namespace(&parse("default/alias").unwrap(), "default").is_ok());
        assert!(check_namespace(&parse("Team-A/alias").unwrap(), "team-a").is_ok());
        let e = check_namespace(&parse("other/alias:v1").unwrap(), "default").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(
            e.message.starts_with("Invalid name: namespace 'other'"),
            "{e}"
        );
        assert!(e.message.contains("is not your team's"), "{e}");
    }

    #[test]
    fn resources_default_and_follow_the_upstream_rules() {
        assert_eq!(validate_resources(None, None).unwrap(), (2, 1024));
        assert_eq!(validate_resources(Some(1), Some(128)).unwrap(), (1, 128));
        assert_eq!(
            validate_resources(Some(32), Some(65536)).unwrap(),
            (32, 65536)
        );
        assert_eq!(validate_resources(Some(8), None).unwrap(), (8, 1024));
        assert_eq!(validate_resources(None, Some(4096)).unwrap(), (2, 4096));
        for (cpu, mem, needle) in [
            (Some(0), None, "at least 1"),
            (Some(-2), None, "at least 1"),
            (Some(3), None, "1 or an even"),
            (Some(33), None, "maximum of 32"),
            (Some(34), None, "maximum of 32"),
            (Some(i64::MAX), None, "maximum of 32"),
            (None, Some(127), "at least 128"),
            (None, Some(0), "at least 128"),
            (None, Some(-1024), "at least 128"),
            (None, Some(1025), "even"),
            (None, Some(65538), "maximum of 65536"),
            (None, Some(i64::MAX), "maximum of 65536"),
        ] {
            let e = validate_resources(cpu, mem).expect_err(needle);
            assert_eq!(e.kind, ErrorKind::Invalid);
            assert!(e.message.contains(needle), "{cpu:?} {mem:?}: {e}");
        }
    }

    #[test]
    fn template_ids_are_twenty_lowercase_alphanumerics() {
        let a = new_template_id();
        assert_eq!(a.len(), TEMPLATE_ID_LEN);
        assert!(
            a.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
            "{a}"
        );
        assert_ne!(a, new_template_id());
        // A generated ID is itself a valid alias.
        assert_eq!(parse(&a).unwrap().alias, a);
    }
}
