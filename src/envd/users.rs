//! The sandbox's users and groups, read from its own `/etc/passwd` and `/etc/group` (no NSS:
//! the sandbox's files are the only truth, and glibc's NSS would consult the host's modules).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One OS user as envd runs things for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
    /// Supplementary groups (the primary group first), as `initgroups` would set them.
    pub groups: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
    home: String,
    shell: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// A snapshot of the user and group databases. Re-read per request: a command may add users
/// (`useradd`) and the next call must see them, and the files are small.
#[derive(Debug, Clone, Default)]
pub struct UserDb {
    users: Vec<PasswdEntry>,
    groups: Vec<GroupEntry>,
    user_by_uid: HashMap<u32, usize>,
    group_by_gid: HashMap<u32, usize>,
}

/// `name:passwd:uid:gid:gecos:home:shell`; malformed lines are skipped, as getpwent does.
fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 7 || f[0].is_empty() {
                return None;
            }
            Some(PasswdEntry {
                name: f[0].to_string(),
                uid: f[2].trim().parse().ok()?,
                gid: f[3].trim().parse().ok()?,
                home: f[5].to_string(),
                shell: f[6].trim_end().to_string(),
            })
        })
        .collect()
}

/// `name:passwd:gid:member,member`.
fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            if f.len() < 4 || f[0].is_empty() {
                return None;
            }
            Some(GroupEntry {
                name: f[0].to_string(),
                gid: f[2].trim().parse().ok()?,
                members: f[3]
                    .trim_end()
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

impl UserDb {
    pub fn from_texts(passwd: &str, group: &str) -> UserDb {
        let users = parse_passwd(passwd);
        let groups = parse_group(group);
        let mut user_by_uid = HashMap::new();
        for (i, u) in users.iter().enumerate() {
            // The first entry for a uid names it, as getpwuid answers.
            user_by_uid.entry(u.uid).or_insert(i);
        }
        let mut group_by_gid = HashMap::new();
        for (i, g) in groups.iter().enumerate() {
            group_by_gid.entry(g.gid).or_insert(i);
        }
        UserDb {
            users,
            groups,
            user_by_uid,
            group_by_gid,
        }
    }

    /// Reads `<root>/etc/passwd` and `<root>/etc/group`; a missing file is an empty database.
    pub fn load_from(root: &Path) -> UserDb {
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        UserDb::from_texts(&read("etc/passwd"), &read("etc/group"))
    }

    pub fn load() -> UserDb {
        UserDb::load_from(Path::new("/"))
    }

    pub fn user(&self, name: &str) -> Option<User> {
        let e = self.users.iter().find(|u| u.name == name)?;
        let mut groups = vec![e.gid];
        for g in &self.groups {
            if g.members.iter().any(|m| m == name) && !groups.contains(&g.gid) {
                groups.push(g.gid);
            }
        }
        Some(User {
            name: e.name.clone(),
            uid: e.uid,
            gid: e.gid,
            home: PathBuf::from(&e.home),
            shell: e.shell.clone(),
            groups,
        })
    }

    pub fn user_by_uid(&self, uid: u32) -> Option<User> {
        let name = self.users.get(*self.user_by_uid.get(&uid)?)?.name.clone();
        self.user(&name)
    }

    /// The owner name EntryInfo shows: the user's name, else the number (as envd does).
    pub fn uid_name(&self, uid: u32) -> String {
        self.user_by_uid
            .get(&uid)
            .and_then(|&i| self.users.get(i))
            .map(|u| u.name.clone())
            .unwrap_or_else(|| uid.to_string())
    }

    pub fn gid_name(&self, gid: u32) -> String {
        self.group_by_gid
            .get(&gid)
            .and_then(|&i| self.groups.get(i))
            .map(|g| g.name.clone())
            .unwrap_or_else(|| gid.to_string())
    }
}

/// The effective uid envd runs as.
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The user envd itself runs as, from the database, or a bare record when it has no entry
/// (a container started with an arbitrary uid).
pub fn current_user(db: &UserDb) -> User {
    let uid = euid();
    db.user_by_uid(uid).unwrap_or_else(|| User {
        name: uid.to_string(),
        uid,
        // SAFETY: getegid has no preconditions and cannot fail.
        gid: unsafe { libc::getegid() },
        home: std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/")),
        shell: "/bin/sh".into(),
        groups: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n\
        # a comment\n\
        broken line\n\
        user:x:1000:1000:User,,,:/home/user:/bin/bash\n\
        bad:x:notanumber:1:x:/:/bin/sh\n\
        alias:x:1000:1000::/home/alias:/bin/sh\n\
        svc:x:999:998::/var/lib/svc:\n";
    const GROUP: &str =
        "root:x:0:\nuser:x:1000:\nsudo:x:27:user,other\ndocker:x:998: user \nwheel:x:10:root\n";

    #[test]
    fn parses_users_and_their_groups() {
        let db = UserDb::from_texts(PASSWD, GROUP);
        let u = db.user("user").unwrap();
        assert_eq!((u.uid, u.gid), (1000, 1000));
        assert_eq!(u.home, PathBuf::from("/home/user"));
        assert_eq!(u.shell, "/bin/bash");
        assert_eq!(u.groups, vec![1000, 27, 998]);
        assert_eq!(db.user("root").unwrap().groups, vec![0, 10]);
        assert!(db.user("bad").is_none(), "a non-numeric uid is skipped");
        assert!(db.user("broken").is_none());
        assert!(db.user("nobody-here").is_none());
        assert_eq!(db.user("svc").unwrap().shell, "");
    }

    #[test]
    fn names_owners_by_first_entry_or_number() {
        let db = UserDb::from_texts(PASSWD, GROUP);
        assert_eq!(db.uid_name(1000), "user");
        assert_eq!(db.uid_name(4242), "4242");
        assert_eq!(db.gid_name(27), "sudo");
        assert_eq!(db.gid_name(5), "5");
        assert_eq!(db.user_by_uid(0).unwrap().name, "root");
    }

    #[test]
    fn missing_files_are_empty() {
        let db = UserDb::load_from(Path::new("/nonexistent-root"));
        assert!(db.user("root").is_none());
        assert_eq!(db.uid_name(0), "0");
    }
}
