//! Claim routing by power-of-two choices: sample two candidates, take the better one.
//! "Better" is more warm instances of the pool key, then fewer claims.

use std::sync::Arc;

use rand::Rng;

use super::registry::NodeHandle;
use crate::model::PoolKey;

fn score(h: &NodeHandle, key: &PoolKey) -> (i64, i64) {
    (h.warm_estimate(key), -h.claims_estimate())
}

/// Removes and returns the next node to try from `candidates`.
pub fn take_next(candidates: &mut Vec<Arc<NodeHandle>>, key: &PoolKey) -> Option<Arc<NodeHandle>> {
    match candidates.len() {
        0 => None,
        1 => candidates.pop(),
        n => {
            let mut rng = rand::rng();
            let a = rng.random_range(0..n);
            let mut b = rng.random_range(0..n - 1);
            if b >= a {
                b += 1;
            }
            let pick = if score(&candidates[b], key) > score(&candidates[a], key) {
                b
            } else {
                a
            };
            Some(candidates.swap_remove(pick))
        }
    }
}
