//! Warm pools for built templates: the build a template's `default` tag names gets a pool of
//! its own (`--built-template-pool`, when the template has a start or ready command), so a
//! create is handed a sandbox whose server already answers. A template without one boots in
//! tens of milliseconds and needs none. The pools follow the tag: a new build, a moved or
//! removed tag, a deleted template drop the old pool and its warm sandboxes.

use std::collections::BTreeSet;

use super::records::store_name;
use crate::model::PoolKey;
use crate::node::runtime::Runtime;
use crate::node::{Node, Pool};

impl<R: Runtime> Node<R> {
    /// The network a built template's sandboxes have unless a create says otherwise: the
    /// internet where this node can give it (e2b's default).
    pub(super) fn default_net(&self) -> &'static str {
        if self.inner.cfg.pools.iter().any(|p| p.key.net == "egress")
            || self.inner.runtime.name() == "builtin"
        {
            "egress"
        } else {
            "none"
        }
    }

    /// The pools built templates should have now.
    fn wanted_built_pools(&self) -> BTreeSet<PoolKey> {
        if self.inner.cfg.built_pool == 0 {
            return BTreeSet::new();
        }
        let net = self.default_net();
        self.builds()
            .records
            .templates()
            .into_iter()
            .filter_map(|t| {
                let build = t.tags.get("default")?;
                let template = self
                    .template(&store_name(&t.template_id, &build.build_id))
                    .ok()?;
                let meta = &template.meta;
                if meta.start_cmd.is_none() && meta.ready_cmd.is_none() {
                    return None;
                }
                PoolKey::new(&meta.name, net, meta.size.as_deref().unwrap_or("small")).ok()
            })
            .collect()
    }

    /// Makes the built templates' pools what their tags say, destroying the warm sandboxes of
    /// pools no longer wanted.
    pub(crate) fn sync_built_pools(&self) {
        let want = self.wanted_built_pools();
        let target = self.inner.cfg.built_pool;
        let mut gone = Vec::new();
        {
            let mut st = self.state();
            if st.closing {
                return;
            }
            let stale: Vec<PoolKey> = st
                .pools
                .iter()
                .filter(|(k, p)| p.built && !want.contains(k))
                .map(|(k, _)| k.clone())
                .collect();
            for k in stale {
                if let Some(p) = st.pools.remove(&k) {
                    gone.extend(p.warm);
                }
            }
            for k in want {
                st.pools.entry(k).or_insert_with(|| Pool::built(target));
            }
        }
        for inst in gone {
            self.destroy_later(inst, "its template's default build changed");
        }
        self.inner.wake_refill.notify_one();
    }
}
