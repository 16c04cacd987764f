//! Claim routing by power-of-two choices: sample two candidates, take the better one.
//! "Better" is more warm instances of the pool key, then fewer claims.

use std::sync::Arc;

use rand::Rng;

use super::registry::NodeHandle;
use crate::model::PoolKey;

fn score(h: &NodeHandle, key: &PoolKey) -> (i64, i64) {
    (h.warm_estimate(key), -h.claims_estimate())
}

/// The name of the template `asked` names when it is another template's alias on some node
/// (e2b's SDKs ask for `code-interpreter-v1`); None when it is a name of its own, or unknown.
pub fn canonical_template(nodes: &[Arc<NodeHandle>], asked: &str) -> Option<String> {
    if nodes.iter().any(|h| h.offers_template(asked)) {
        return None;
    }
    nodes.iter().find_map(|h| {
        h.info()?
            .template_info
            .into_iter()
            .find(|t| t.aliases.iter().any(|a| a == asked))
            .map(|t| t.name)
    })
}

/// The first node that says it is building `template` (or a template it is an alias of).
pub fn building(nodes: &[Arc<NodeHandle>], template: &str) -> Option<String> {
    nodes.iter().find_map(|h| {
        let info = h.info()?;
        info.templates_building
            .iter()
            .any(|t| t == template)
            .then_some(info.name)
    })
}

/// The size a template's sandboxes have when a create names none (the code interpreter's
/// kernels need more than the smallest tier), as the first node that describes it says.
pub fn template_size(nodes: &[Arc<NodeHandle>], template: &str) -> Option<String> {
    nodes.iter().find_map(|h| {
        h.info()?
            .template_info
            .into_iter()
            .find(|t| t.name == template)
            .map(|t| t.size)
            .filter(|s| !s.is_empty())
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dispatch::client::NodeConn;
    use crate::model::{NodeInfo, NodeLimits, PoolStatus};

    fn node(addr: &str, warm: u32, claimed: u32) -> Arc<NodeHandle> {
        let h = Arc::new(NodeHandle::new(NodeConn::new(addr, "t").unwrap()));
        h.set_info(NodeInfo {
            name: addr.into(),
            advertise_address: addr.into(),
            pools: vec![PoolStatus {
                key: PoolKey::base(),
                warm,
                target: warm,
                booting: 0,
                captures_memory: false,
            }],
            claimed,
            paused: 0,
            checkpoints: 0,
            limits: NodeLimits {
                lease_default_seconds: 300,
                lease_max_seconds: 86400,
                fork_limit: 16,
                max_sandboxes: 512,
                cold_start: true,
                paused_retention_seconds: 3600,
            },
            templates: vec!["base".into()],
            revision: 0,
            lost: vec![],
            runtime: "process".into(),
            version: String::new(),
            started_at: chrono::Utc::now(),
            disk_bytes: 0,
            usage: vec![],
            data_address: String::new(),
            template_info: vec![crate::model::TemplateInfo {
                name: "base".into(),
                aliases: vec!["base-v1".into()],
                size: "medium".into(),
                ..Default::default()
            }],
            boundary: String::new(),
            captures_memory: false,
            templates_building: vec!["code-interpreter".into(), "code-interpreter-v1".into()],
            builds: false,
        });
        h
    }

    #[tokio::test]
    async fn aliases_resolve_to_the_template_that_declares_them() {
        let nodes = vec![node("10.0.0.1:1", 1, 0)];
        assert_eq!(
            canonical_template(&nodes, "base-v1").as_deref(),
            Some("base")
        );
        assert_eq!(
            canonical_template(&nodes, "base"),
            None,
            "a name of its own"
        );
        assert_eq!(canonical_template(&nodes, "other"), None, "unknown");
        assert_eq!(canonical_template(&[], "base-v1"), None);
        assert_eq!(template_size(&nodes, "base").as_deref(), Some("medium"));
        assert_eq!(template_size(&nodes, "other"), None);
        // A template on its way is named with its aliases.
        for t in ["code-interpreter", "code-interpreter-v1"] {
            assert_eq!(building(&nodes, t).as_deref(), Some("10.0.0.1:1"));
        }
        assert_eq!(building(&nodes, "base"), None);
    }

    #[tokio::test]
    async fn the_better_of_two_wins_and_every_candidate_is_tried_once() {
        let key = PoolKey::base();
        for _ in 0..50 {
            let mut c = vec![node("10.0.0.1:1", 0, 0), node("10.0.0.2:1", 5, 0)];
            assert_eq!(take_next(&mut c, &key).unwrap().address(), "10.0.0.2:1");
            assert_eq!(take_next(&mut c, &key).unwrap().address(), "10.0.0.1:1");
            assert!(take_next(&mut c, &key).is_none());
            // Equal warm capacity: fewer claims wins.
            let mut c = vec![node("10.0.0.3:1", 2, 9), node("10.0.0.4:1", 2, 1)];
            assert_eq!(take_next(&mut c, &key).unwrap().address(), "10.0.0.4:1");
        }
        // Among many equal nodes the pick spreads.
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let mut c: Vec<_> = (0..4)
                .map(|i| node(&format!("10.0.1.{i}:1"), 3, 0))
                .collect();
            seen.insert(take_next(&mut c, &key).unwrap().address().to_string());
        }
        assert_eq!(seen.len(), 4);
    }
}
