//! What each phase of a build runs inside its sandbox, as shell text, and the chain of keys
//! that names a phase's layer in a team's cache. e2b's semantics: the default user phase,
//! `RUN`/`COPY`/`ENV`/`WORKDIR`/`USER` (and `ADD`/`ARG`), and finalize's configuration.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::model::builds::Step;
use crate::model::{Error, Result};

/// What flows from phase to phase: who commands run as, where, with what environment.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Context {
    pub user: String,
    pub workdir: Option<String>,
    pub env: BTreeMap<String, String>,
}

/// One phase of a build, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// A shell command as `user`; the context stays as it was.
    Run {
        cmd: String,
        user: Option<String>,
    },
    /// An uploaded archive's files to `dest`.
    Copy {
        src: String,
        dest: String,
        owner: Option<String>,
        mode: Option<String>,
        hash: String,
    },
    /// Environment for later phases (nothing is written).
    Env(Vec<(String, String)>),
    Workdir(String),
    /// The context's user from here on; `admin` also gives it passwordless sudo.
    User {
        name: String,
        admin: bool,
    },
}

/// The longest a single command of a build may run, as upstream.
pub const STEP_TIMEOUT_SECS: u64 = 3600;

/// Turns a step as the SDK sent it into a phase, or says what is wrong with it.
pub fn phase_of(step: &Step) -> Result<Phase> {
    let args = &step.args;
    let bad = |why: &str| Err(Error::invalid(format!("{} step: {why}", step.kind)));
    match step.kind.to_ascii_uppercase().as_str() {
        "RUN" => match args.as_slice() {
            [cmd] => Ok(Phase::Run {
                cmd: cmd.clone(),
                user: None,
            }),
            [cmd, user] => Ok(Phase::Run {
                cmd: cmd.clone(),
                user: (!user.is_empty()).then(|| user.clone()),
            }),
            _ => bad("expects a command and an optional user"),
        },
        "COPY" | "ADD" => {
            let Some(hash) = step.files_hash.clone() else {
                return bad("COPY requires files hash to be set");
            };
            let opt = |i: usize| args.get(i).filter(|s| !s.is_empty()).cloned();
            match args.len() {
                2..=4 => Ok(Phase::Copy {
                    src: args[0].clone(),
                    dest: args[1].clone(),
                    owner: opt(2),
                    mode: opt(3),
                    hash,
                }),
                _ => bad("expects a source, a destination, an optional owner and mode"),
            }
        }
        "ENV" | "ARG" => {
            if args.is_empty() || !args.len().is_multiple_of(2) {
                return bad("expects pairs of name and value");
            }
            let pairs = args
                .chunks(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect::<Vec<_>>();
            if let Some((k, _)) = pairs.iter().find(|(k, _)| !valid_env_name(k)) {
                return bad(&format!("{k:?} is not a variable name"));
            }
            Ok(Phase::Env(pairs))
        }
        "WORKDIR" => match args.as_slice() {
            [path] if !path.is_empty() => Ok(Phase::Workdir(path.clone())),
            _ => bad("expects a path"),
        },
        "USER" => match args.as_slice() {
            [name] => Ok(Phase::User {
                name: name.clone(),
                admin: false,
            }),
            [name, admin] => Ok(Phase::User {
                name: name.clone(),
                admin: admin == "true",
            }),
            _ => bad("expects a user name"),
        },
        other => Err(Error::invalid(format!("unknown step type {other:?}"))),
    }
}

fn valid_env_name(k: &str) -> bool {
    let mut b = k.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// The key of the phase after `prev`: upstream's `sha256` over the pieces joined by `;`.
pub fn chain(prev: &str, pieces: &[&str]) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    for p in pieces {
        h.update(b";");
        h.update(p.as_bytes());
    }
    h.finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()
}

/// The key of a step, from the key before it.
pub fn step_key(prev: &str, step: &Step) -> String {
    chain(
        prev,
        &[
            &step.kind.to_ascii_uppercase(),
            &step.args.join(" "),
            step.files_hash.as_deref().unwrap_or(""),
        ],
    )
}

/// Quotes `s` for a POSIX shell.
pub fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Whether an `ENV` value changes when a shell expands it in double quotes (so the login
/// environment of a sandbox is needed, as upstream expands it in one).
pub fn needs_expansion(value: &str) -> bool {
    value.contains(['$', '\\'])
}

/// The login environment as `env -0` prints it.
pub fn parse_env0(out: &[u8]) -> BTreeMap<String, String> {
    out.split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

/// `value` as a shell expands it inside double quotes against `env` (upstream runs
/// `printf "%s" "<value>"` in a root login shell): `$VAR`, `${VAR}` and `${VAR:-word}` /
/// `${VAR-word}` expand, a backslash escapes `$`, `` ` ``, `"` and `\`; command substitution
/// is never run (upstream escapes it) and stays as written.
pub fn expand(value: &str, env: &BTreeMap<String, String>) -> String {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::new();
    let mut rest = value;
    while let Some(c) = rest.chars().next() {
        rest = &rest[c.len_utf8()..];
        match c {
            '\\' => match rest.chars().next() {
                Some(n @ ('$' | '`' | '"' | '\\')) => {
                    out.push(n);
                    rest = &rest[1..];
                }
                _ => out.push('\\'),
            },
            '$' if rest.starts_with('{') => {
                let Some(end) = rest.find('}') else {
                    out.push('$');
                    continue;
                };
                let inner = &rest[1..end];
                rest = &rest[end + 1..];
                let (name, default, if_empty) = match inner.find(":-") {
                    Some(i) => (&inner[..i], Some(&inner[i + 2..]), true),
                    None => match inner.find('-') {
                        Some(i) => (&inner[..i], Some(&inner[i + 1..]), false),
                        None => (inner, None, false),
                    },
                };
                if name.is_empty() || !name.chars().all(name_char) {
                    // Not a parameter upstream's shell would expand quietly; keep it.
                    out.push_str("${");
                    out.push_str(inner);
                    out.push('}');
                    continue;
                }
                match (env.get(name), default) {
                    (Some(v), Some(_)) if if_empty && v.is_empty() => {
                        out.push_str(&expand(default.unwrap_or(""), env))
                    }
                    (Some(v), _) => out.push_str(v),
                    (None, Some(d)) => out.push_str(&expand(d, env)),
                    (None, None) => {}
                }
            }
            '$' if rest.starts_with(|c: char| c.is_ascii_digit()) => {
                // A positional parameter: a login shell's are empty.
                rest = &rest[1..];
            }
            '$' => {
                let len = rest
                    .char_indices()
                    .find(|&(_, c)| !name_char(c))
                    .map_or(rest.len(), |(i, _)| i);
                if len == 0 {
                    out.push('$');
                    continue;
                }
                if let Some(v) = env.get(&rest[..len]) {
                    out.push_str(v);
                }
                rest = &rest[len..];
            }
            c => out.push(c),
        }
    }
    out
}

/// Creates `name` if it is missing; with `admin`, also gives it passwordless sudo (the e2b
/// default user phase).
pub fn user_script(name: &str, admin: bool) -> String {
    let n = quote(name);
    let mut s =
        format!("id -u {n} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {n}\n");
    if admin {
        s.push_str(&format!(
            "for g in sudo wheel; do getent group $g >/dev/null && usermod -aG $g {n} && break; done\n\
             passwd -d {n} >/dev/null 2>&1 || true\n\
             mkdir -p /etc/sudoers.d\n\
             echo {line} > /etc/sudoers.d/e2b-{file}\n\
             chmod 0440 /etc/sudoers.d/e2b-{file}\n",
            line = quote(&format!("{name} ALL=(ALL:ALL) NOPASSWD: ALL")),
            file = name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
        ));
    }
    s
}

/// Makes `path` (relative to `cwd`), gives the directories it created to `user`, and prints
/// where it is.
pub fn workdir_script(path: &str, cwd: Option<&str>, user: &str) -> String {
    let target = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{}/{path}", cwd.unwrap_or("").trim_end_matches('/'))
    };
    format!(
        "set -e\n\
         t={t}\n\
         first=\"$t\"\n\
         while [ ! -e \"$(dirname \"$first\")\" ]; do first=\"$(dirname \"$first\")\"; done\n\
         existed=0; [ -e \"$first\" ] && existed=1\n\
         mkdir -p \"$t\"\n\
         if [ $existed = 0 ]; then chown -R {u}:{u} \"$first\"; fi\n\
         cd \"$t\" && pwd -P\n",
        t = quote(&target),
        u = quote(user),
    )
}

/// Where a COPY step's archive is put inside the build's sandbox (left out of the layer).
pub const SCRATCH: &str = "/tmp/.e2b-build";

/// Unpacks the archive at `archive` and puts what `src` named at `dest`, as e2b's COPY does:
/// a file moved (into `dest` when it ends in `/`), a directory's contents merged, owners and
/// modes given.
pub fn copy_script(
    archive: &str,
    src: &str,
    dest: &str,
    owner: &str,
    mode: Option<&str>,
    workdir: &str,
) -> String {
    // The source root: `src` cut at its first glob character, then at the last '/'.
    let cut = src.find(['*', '?', '[', '{']).map_or(src, |i| &src[..i]);
    let root = if cut.len() < src.len() {
        cut.rfind('/').map_or("", |i| &cut[..i])
    } else {
        cut.trim_end_matches('/')
    };
    let dest = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("{}/{dest}", workdir.trim_end_matches('/'))
    };
    let owner = if owner.contains(':') {
        owner.to_string()
    } else {
        format!("{owner}:{owner}")
    };
    let chmod = mode.map_or(String::new(), |m| format!("chmod -R {} \"$s\"\n", quote(m)));
    format!(
        "set -e\n\
         u={scratch}/unpack-$$\n\
         rm -rf \"$u\"; mkdir -p \"$u\"\n\
         if [ \"$(head -c2 {a} | od -An -tx1 | tr -d ' ')\" = 1f8b ]; then z=z; else z=; fi\n\
         tar -x${{z}}f {a} -C \"$u\" --no-same-owner\n\
         s=\"$u\"/{root}\n\
         d={dest}\n\
         if [ -L \"$s\" ] || [ ! -e \"$s\" -a ! -L \"$s\" ]; then\n\
           [ -L \"$s\" ] || {{ echo \"nothing to copy at {src_msg}\" >&2; exit 1; }}\n\
           chown -h {o} \"$s\"\n\
         else\n\
           chown -R {o} \"$s\"\n\
           {chmod}\
         fi\n\
         if [ -d \"$s\" ] && [ ! -L \"$s\" ]; then\n\
           mkdir -p \"$d\"\n\
           (cd \"$s\" && tar -cf - .) | tar -xf - -C \"$d\" --keep-directory-symlink --no-overwrite-dir\n\
         else\n\
           case \"$d\" in */) mkdir -p \"$d\"; d=\"$d$(basename \"$s\")\";; *) mkdir -p \"$(dirname \"$d\")\";; esac\n\
           rm -rf \"$d\" 2>/dev/null || true\n\
           mv \"$s\" \"$d\"\n\
         fi\n\
         rm -rf \"$u\"\n",
        scratch = SCRATCH,
        a = quote(archive),
        root = quote(if root.is_empty() { "." } else { root }),
        dest = quote(&dest),
        o = quote(&owner),
        src_msg = src.replace(['"', '\\', '$', '`'], "_"),
    )
}

/// The configuration finalize applies as root (upstream's), with the build's identity in
/// `/.e2b`. Owners and modes change only where they differ: on an overlay a change copies the
/// whole file up, so a blanket `chown -R` would put every file of the home into the layer.
pub fn finalize_script(template_id: &str, build_id: &str) -> String {
    format!(
        "set -e\n\
         printf 'ENV_ID=%s\\nTEMPLATE_ID=%s\\nBUILD_ID=%s\\n' {t} {t} {b} > /.e2b\n\
         {user}\
         find /home/user \\( ! -user user -o ! -group user \\) -exec chown -h user:user {{}} +\n\
         find /usr/local ! -type l ! -perm 777 -exec chmod 777 {{}} + 2>/dev/null || true\n\
         mkdir -p /code && chmod 777 /code\n",
        t = quote(template_id),
        b = quote(build_id),
        user = user_script("user", true),
    )
}

/// The environment of a build's command: the context's, with the standard directories
/// appended to a `PATH` it sets.
pub fn command_env(ctx: &Context) -> BTreeMap<String, String> {
    let mut env = ctx.env.clone();
    if let Some(path) = env.get_mut("PATH") {
        path.push_str(":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    }
    env
}

/// What a step is called in the log: `RUN apt-get …`.
pub fn describe(step: &Step) -> String {
    let args: Vec<&str> = step
        .args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.is_empty())
        .collect();
    format!("{} {}", step.kind.to_ascii_uppercase(), args.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(kind: &str, args: &[&str]) -> Step {
        Step {
            kind: kind.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn steps_become_phases_or_clear_errors() {
        assert_eq!(
            phase_of(&step("RUN", &["echo hi", "root"])).unwrap(),
            Phase::Run {
                cmd: "echo hi".into(),
                user: Some("root".into())
            }
        );
        assert_eq!(
            phase_of(&step("arg", &["A", "1", "B", "2"])).unwrap(),
            Phase::Env(vec![("A".into(), "1".into()), ("B".into(), "2".into())])
        );
        assert!(phase_of(&step("ENV", &["A"])).is_err());
        assert!(phase_of(&step("ENV", &["1A", "x"])).is_err());
        assert!(phase_of(&step("ENV", &[])).is_err());
        assert!(phase_of(&step("WORKDIR", &[""])).is_err());
        assert!(phase_of(&step("FROM", &["x"])).is_err());
        let e = phase_of(&step("COPY", &["a", "b"])).unwrap_err();
        assert!(e.message.contains("files hash"), "{e}");
        let mut c = step("ADD", &["a", "/b", "", "0755"]);
        c.files_hash = Some("h".into());
        assert_eq!(
            phase_of(&c).unwrap(),
            Phase::Copy {
                src: "a".into(),
                dest: "/b".into(),
                owner: None,
                mode: Some("0755".into()),
                hash: "h".into()
            }
        );
        assert_eq!(
            phase_of(&step("USER", &["user", "true"])).unwrap(),
            Phase::User {
                name: "user".into(),
                admin: true
            }
        );
    }

    #[test]
    fn keys_chain_every_piece() {
        let a = step_key("k0", &step("RUN", &["echo", "root"]));
        assert_eq!(a.len(), 64);
        assert_eq!(a, step_key("k0", &step("run", &["echo", "root"])));
        assert_ne!(a, step_key("k1", &step("RUN", &["echo", "root"])));
        assert_ne!(a, step_key("k0", &step("RUN", &["echo"])));
        let mut c = step("COPY", &["a", "b"]);
        let plain = step_key("k0", &c);
        c.files_hash = Some("f".into());
        assert_ne!(plain, step_key("k0", &c));
        // The pieces are framed: moving a character between pieces changes the key.
        assert_ne!(chain("p", &["ab", "c"]), chain("p", &["a", "bc"]));
    }

    #[test]
    fn quoting_survives_the_shell() {
        assert_eq!(quote("plain/path-1.txt"), "plain/path-1.txt");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$(reboot)"), "'$(reboot)'");
    }

    #[test]
    fn copy_finds_the_source_root_and_destination() {
        let s = copy_script("/tmp/a.tar", "files/*.txt", "out/", "user", None, "/w");
        assert!(s.contains("s=\"$u\"/files\n"), "{s}");
        assert!(s.contains("d=/w/out/\n"), "{s}");
        assert!(s.contains("chown -R user:user"), "{s}");
        let s = copy_script("/tmp/a.tar", "app/", "/srv/app", "u:g", Some("0755"), "/w");
        assert!(
            s.contains("s=\"$u\"/app\n") && s.contains("d=/srv/app\n"),
            "{s}"
        );
        assert!(
            s.contains("chown -R u:g") && s.contains("chmod -R 0755"),
            "{s}"
        );
        let s = copy_script("/tmp/a.tar", "*", "/x", "user", None, "/w");
        assert!(s.contains("s=\"$u\"/.\n"), "{s}");
    }

    #[test]
    fn workdir_is_resolved_against_the_current_one() {
        let s = workdir_script("app", Some("/home/user/"), "user");
        assert!(s.contains("t=/home/user/app\n"), "{s}");
        let s = workdir_script("/srv/x y", None, "user");
        assert!(s.contains("t='/srv/x y'\n"), "{s}");
        let s = workdir_script("rel", None, "user");
        assert!(s.contains("t=/rel\n"), "{s}");
    }

    #[test]
    fn a_path_the_context_sets_keeps_the_standard_directories() {
        let mut ctx = Context {
            user: "user".into(),
            workdir: None,
            env: BTreeMap::from([("PATH".to_string(), "/opt/bin".to_string())]),
        };
        assert!(command_env(&ctx)["PATH"].starts_with("/opt/bin:/usr/local/sbin"));
        ctx.env.clear();
        assert!(!command_env(&ctx).contains_key("PATH"));
    }

    #[test]
    fn env_values_expand_as_in_double_quotes() {
        let env: BTreeMap<String, String> =
            [("HOME", "/root"), ("PATH", "/usr/bin:/bin"), ("EMPTY", "")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let cases = [
            ("plain", "plain"),
            ("$HOME/bin", "/root/bin"),
            ("/opt/bin:${PATH}", "/opt/bin:/usr/bin:/bin"),
            ("$NOPE-x", "-x"),
            ("${NOPE:-fallback $HOME}", "fallback /root"),
            ("${EMPTY:-used}", "used"),
            ("${EMPTY-kept}", ""),
            ("${NOPE-kept}", "kept"),
            ("cost \\$5", "cost $5"),
            ("a\\\\b", "a\\b"),
            ("a\\nb", "a\\nb"),
            ("$(id -u) `id`", "$(id -u) `id`"),
            ("$", "$"),
            ("x$", "x$"),
            ("$1abc", "abc"),
            ("${bad name}", "${bad name}"),
            ("${unterminated", "${unterminated"),
            ("ünïcode $HOME", "ünïcode /root"),
        ];
        for (value, want) in cases {
            assert_eq!(expand(value, &env), want, "{value}");
        }
        assert!(needs_expansion("$A") && needs_expansion("a\\b") && !needs_expansion("a b"));
        let parsed = parse_env0(b"A=1\0B=x=y\0junk\0");
        assert_eq!(parsed.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(parsed.len(), 2);
    }
}
