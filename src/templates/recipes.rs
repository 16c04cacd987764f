//! Built-in recipes: templates the gateway knows how to make by name, derived from `base`
//! with pinned packages and files that ship in this binary (the files live beside this
//! module, as the real files they are). `template build code-interpreter` makes one; a node
//! whose pools name one builds it in the background on first start.

use sha2::{Digest, Sha256};

use super::derive::{File, Steps};
use crate::sandbox::services::Service;

#[derive(Clone, Copy)]
pub struct Recipe {
    pub name: &'static str,
    /// Other names claims may use (e2b's SDKs default to `code-interpreter-v1`).
    pub aliases: &'static [&'static str],
    /// The template it is made from.
    pub from: &'static str,
    pub apt: &'static [&'static str],
    pub pip: Option<&'static str>,
    pub files: &'static [File],
    pub commands: &'static [&'static str],
    pub services: &'static [Service],
    /// The size tier of its sandboxes when a create names none.
    pub size: Option<&'static str>,
    /// What people are told to expect while it builds.
    pub note: &'static str,
}

impl Recipe {
    pub fn steps(&self) -> Steps {
        Steps {
            apt: self.apt.iter().map(|s| s.to_string()).collect(),
            pip: self.pip,
            files: self.files.to_vec(),
            commands: self.commands.to_vec(),
        }
    }

    /// A digest of everything the recipe puts into a template: a template whose description
    /// carries another one was made from an older recipe.
    pub fn digest(&self) -> String {
        let mut h = Sha256::new();
        let mut put = |s: &[u8]| {
            h.update((s.len() as u64).to_le_bytes());
            h.update(s);
        };
        put(self.from.as_bytes());
        for a in self.apt {
            put(a.as_bytes());
        }
        put(self.pip.unwrap_or_default().as_bytes());
        for f in self.files {
            put(f.path.as_bytes());
            put(f.content);
            put(&f.mode.to_le_bytes());
        }
        for c in self.commands {
            put(c.as_bytes());
        }
        for s in self.services {
            put(s.name().as_bytes());
        }
        for a in self.aliases {
            put(a.as_bytes());
        }
        put(self.size.unwrap_or_default().as_bytes());
        let d = h.finalize();
        d.iter().take(12).map(|b| format!("{b:02x}")).collect()
    }
}

/// The recipe called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static Recipe> {
    RECIPES.iter().find(|r| r.name == name)
}

const RECIPES: &[Recipe] = &[super::code_interpreter::RECIPE, super::desktop::RECIPE];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipes_are_found_by_name_and_digest_their_inputs() {
        let r = find("code-interpreter").expect("the code interpreter recipe");
        assert!(r.aliases.contains(&"code-interpreter-v1"));
        assert_eq!(r.services, &[Service::CodeInterpreter]);
        assert!(find("base").is_none() && find("nope").is_none());
        let d = r.digest();
        assert_eq!(d.len(), 24);
        assert_eq!(d, r.digest(), "stable");
        let changed = Recipe {
            commands: &["true"],
            ..*r
        };
        assert_ne!(changed.digest(), d);
    }
}
