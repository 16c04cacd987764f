//! The owner index: which node owns a claim id, a claim ref or a checkpoint. Filled at claim,
//! fork and checkpoint time and on every resolved lookup, bounded in size; a miss is answered
//! by the read view or by asking the nodes.

use std::sync::Arc;

use moka::sync::Cache;

use super::registry::NodeHandle;

pub struct OwnerIndex {
    by_id: Cache<String, Arc<NodeHandle>>,
    by_ref: Cache<String, Arc<NodeHandle>>,
    by_checkpoint: Cache<String, Arc<NodeHandle>>,
}

impl OwnerIndex {
    pub fn new(capacity: u64) -> Self {
        OwnerIndex {
            by_id: Cache::new(capacity),
            by_ref: Cache::new(capacity),
            by_checkpoint: Cache::new(capacity / 4 + 1),
        }
    }

    pub fn node_of_id(&self, id: &str) -> Option<Arc<NodeHandle>> {
        self.by_id.get(id)
    }

    pub fn node_of_ref(&self, claim_ref: &str) -> Option<Arc<NodeHandle>> {
        self.by_ref.get(claim_ref)
    }

    pub fn node_of_checkpoint(&self, id: &str) -> Option<Arc<NodeHandle>> {
        self.by_checkpoint.get(id)
    }

    pub fn remember(&self, id: &str, claim_ref: &str, node: &Arc<NodeHandle>) {
        self.by_id.insert(id.to_string(), node.clone());
        if !claim_ref.is_empty() {
            self.by_ref.insert(claim_ref.to_string(), node.clone());
        }
    }

    pub fn remember_checkpoint(&self, id: &str, node: &Arc<NodeHandle>) {
        self.by_checkpoint.insert(id.to_string(), node.clone());
    }

    pub fn forget_id(&self, id: &str) {
        self.by_id.invalidate(id);
    }

    pub fn forget_ref(&self, claim_ref: &str) {
        self.by_ref.invalidate(claim_ref);
    }

    pub fn forget_checkpoint(&self, id: &str) {
        self.by_checkpoint.invalidate(id);
    }
}
