//! Changing a claimed sandbox's metadata after the claim (the Kubernetes facade keeps labels,
//! annotations and the submitted spec there): keys set and removed in one step under the
//! state lock, announced as MODIFIED only when something moved. Its lifecycle's end-of-lease
//! action changes the same way (e2b's deprecated resume with `autoPause`).

use std::collections::BTreeMap;

use super::Node;
use super::runtime::Runtime;
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
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            return Err(self.not_found(&st, id));
        };
        let mut next = c.record.metadata.clone();
        for k in remove {
            if !set.contains_key(k) {
                next.remove(k);
            }
        }
        next.extend(set);
        if next == c.record.metadata {
            return Ok((c.record.clone().without_token(), false));
        }
        // The same limits as at claim time, so a sandbox never holds what it could not be
        // claimed with.
        model::sandbox::validate_string_map("metadata", &next)?;
        c.record.metadata = next;
        let record = c.record.clone().without_token();
        st.emit(
            &self.inner.events,
            InventoryChange::Modified(record.clone()),
        );
        drop(st);
        self.changed();
        Ok((record, true))
    }

    /// Sets what the end of the lease does; `kill` also ends auto-resume, which only a paused
    /// sandbox can use.
    pub fn set_on_timeout(&self, id: &str, on_timeout: OnTimeout) -> Result<(SandboxRecord, bool)> {
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(id) else {
            return Err(self.not_found(&st, id));
        };
        let next = model::Lifecycle {
            on_timeout,
            auto_resume: c.record.lifecycle.auto_resume && on_timeout == OnTimeout::Pause,
        };
        if next == c.record.lifecycle {
            return Ok((c.record.clone().without_token(), false));
        }
        c.record.lifecycle = next;
        let record = c.record.clone().without_token();
        st.emit(
            &self.inner.events,
            InventoryChange::Modified(record.clone()),
        );
        drop(st);
        self.changed();
        Ok((record, true))
    }
}
