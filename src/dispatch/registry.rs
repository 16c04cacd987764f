//! The nodes a dispatcher knows: one handle per node address with its connection, what the
//! node last reported about itself, and local estimates of its warm capacity that claims keep
//! current between reports.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Instant;

use super::client::NodeConn;
use crate::model::{NodeInfo, PoolKey};

#[derive(Default)]
struct HandleState {
    info: Option<NodeInfo>,
    up: bool,
    down_since: Option<Instant>,
    warm: HashMap<PoolKey, i64>,
    claims: i64,
}

pub struct NodeHandle {
    conn: NodeConn,
    state: Mutex<HandleState>,
}

impl NodeHandle {
    pub fn new(conn: NodeConn) -> Self {
        NodeHandle {
            conn,
            state: Mutex::new(HandleState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, HandleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn conn(&self) -> &NodeConn {
        &self.conn
    }

    pub fn address(&self) -> &str {
        self.conn.address()
    }

    /// The node's name once it has answered at least once.
    pub fn name(&self) -> Option<String> {
        self.state().info.as_ref().map(|i| i.name.clone())
    }

    /// A name for messages: the node's name, or its address before it has answered.
    pub fn label(&self) -> String {
        self.name().unwrap_or_else(|| self.address().to_string())
    }

    pub fn is_up(&self) -> bool {
        self.state().up
    }

    pub fn info(&self) -> Option<NodeInfo> {
        self.state().info.clone()
    }

    pub fn offers_template(&self, template: &str) -> bool {
        self.state()
            .info
            .as_ref()
            .is_some_and(|i| i.templates.iter().any(|t| t == template))
    }

    /// The longest lease the node grants, once it has reported.
    pub fn lease_max_seconds(&self) -> Option<u64> {
        self.state()
            .info
            .as_ref()
            .map(|i| i.limits.lease_max_seconds)
    }

    pub fn cold_starts(&self) -> bool {
        self.state()
            .info
            .as_ref()
            .is_some_and(|i| i.limits.cold_start)
    }

    pub fn set_info(&self, info: NodeInfo) {
        let mut st = self.state();
        st.warm = info
            .pools
            .iter()
            .map(|p| (p.key.clone(), i64::from(p.warm)))
            .collect();
        st.claims = i64::from(info.claimed);
        st.info = Some(info);
        st.up = true;
        st.down_since = None;
    }

    pub fn mark_down(&self) {
        let mut st = self.state();
        st.up = false;
        st.down_since.get_or_insert_with(Instant::now);
    }

    pub fn down_since(&self) -> Option<Instant> {
        self.state().down_since
    }

    /// Warm instances of `key` the node is believed to hold right now.
    pub fn warm_estimate(&self, key: &PoolKey) -> i64 {
        self.state().warm.get(key).copied().unwrap_or(0)
    }

    pub fn claims_estimate(&self) -> i64 {
        self.state().claims
    }

    pub fn took_claim(&self, key: &PoolKey, warm: bool) {
        let mut st = self.state();
        if warm && let Some(w) = st.warm.get_mut(key) {
            *w -= 1;
        }
        st.claims += 1;
    }

    pub fn refused_claim(&self, key: &PoolKey) {
        self.state().warm.insert(key.clone(), 0);
    }
}

#[derive(Default)]
pub struct Registry {
    nodes: RwLock<Vec<Arc<NodeHandle>>>,
    by_name: RwLock<HashMap<String, Arc<NodeHandle>>>,
}

impl Registry {
    /// Adds a node by address; answers the existing handle if the address is known.
    pub fn add(&self, conn: NodeConn) -> (Arc<NodeHandle>, bool) {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = nodes.iter().find(|h| h.address() == conn.address()) {
            return (h.clone(), false);
        }
        let h = Arc::new(NodeHandle::new(conn));
        nodes.push(h.clone());
        (h, true)
    }

    pub fn remove(&self, address: &str) -> Option<Arc<NodeHandle>> {
        let mut nodes = self.nodes.write().unwrap_or_else(|p| p.into_inner());
        let pos = nodes.iter().position(|h| h.address() == address)?;
        let h = nodes.remove(pos);
        if let Some(name) = h.name() {
            let mut by_name = self.by_name.write().unwrap_or_else(|p| p.into_inner());
            if by_name.get(&name).is_some_and(|x| Arc::ptr_eq(x, &h)) {
                by_name.remove(&name);
            }
        }
        Some(h)
    }

    /// Records the name a node reported.
    pub fn named(&self, handle: &Arc<NodeHandle>, name: &str) {
        let mut by_name = self.by_name.write().unwrap_or_else(|p| p.into_inner());
        by_name.insert(name.to_string(), handle.clone());
    }

    pub fn by_name(&self, name: &str) -> Option<Arc<NodeHandle>> {
        self.by_name
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub fn all(&self) -> Vec<Arc<NodeHandle>> {
        self.nodes.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Nodes that answered their last report.
    pub fn up(&self) -> Vec<Arc<NodeHandle>> {
        self.all().into_iter().filter(|h| h.is_up()).collect()
    }
}
