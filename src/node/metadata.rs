//! Changing a claimed sandbox's metadata after the claim (the Kubernetes facade keeps labels,
//! annotations and the submitted spec there): keys set and removed in one step under the
//! state lock, announced as MODIFIED only when something moved. Its lifecycle's end-of-lease
//! action changes the same way (e2b's deprecated resume with `autoPause`).

use std::collections::BTreeMap;

use super::runtime::Runtime;
use super::{Claim, Node};
use crate::model::{self, InventoryChange, OnTimeout, Result, SandboxRecord};

impl<R: Runtime> Node<R> {
    /// Sets `set` and removes `remove` (a key in both is set). Answers the record without its
    /// token and whether it changed; an unchanged one spends no revision, so watchers see no
    /// event for a no-op.
    pub fn update_metadata(
        &self,
        id: &str,
        set: BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<(SandboxRecord, bool)> {
        self.modify_claim(id, |c| {
            let mut next = c.record.metadata.clone();
            for k in remove {
                if !set.contains_key(k) {
                    next.remove(k);
                }
            }
            next.extend(set);
            if next == c.record.metadata {
                return Ok(false);
            }
            // The same limits as at claim time, so a sandbox never holds what it could not be
            // claimed with.
            model::sandbox::validate_string_map("metadata", &next)?;
            c.record.metadata = next;
            Ok(true)
        })
    }

    /// Sets what the end of the lease does; `kill` also ends auto-resume, which only a paused
    /// sandbox can use.
    pub fn set_on_timeout(&self, id: &str, on_timeout: OnTimeout) -> Result<(SandboxRecord, bool)> {
        self.modify_claim(id, |c| {
            let next = model::Lifecycle {
                on_timeout,
                auto_resume: c.record.lifecycle.auto_resume && on_timeout == OnTimeout::Pause,
                pause_mode: c.record.lifecycle.pause_mode,
            };
            let changed = next != c.record.lifecycle;
            c.record.lifecycle = next;
            Ok(changed)
        })
    }

    /// Changes a claim under the state lock with `change`, which answers whether anything
    /// moved; only a change spends a revision and is announced as MODIFIED. Answers the record
    /// without its token.
    pub(super) fn modify_claim(
        &self,
        id: &str,
        change: impl FnOnce(&mut Claim<R::Handle>) -> Result<bool>,
    ) -> Result<(SandboxRecord, bool)> {
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            return Err(self.not_found(&st, id));
        };
        let changed = change(c)?;
        let record = c.record.clone().without_token();
        if !changed {
            return Ok((record, false));
        }
        st.emit(
            &self.inner.events,
            InventoryChange::Modified(record.clone()),
        );
        drop(st);
        self.changed();
        Ok((record, true))
    }
}
