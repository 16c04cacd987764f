//! A team's templates once built: described and listed with their builds, tagged and
//! untagged, published, deleted (what `e2b template` and the SDKs' tag calls do).

use chrono::Utc;

use super::records::BuildRecord;
use crate::model::builds::{
    BuildState, BuildSummary, TagRecord, TagsAssigned, TemplateOp, TemplateRecord, TemplateView,
};
use crate::model::{Error, Result};
use crate::node::Node;
use crate::node::runtime::Runtime;

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| Error::internal(format!("encoding an answer: {e}")))
}

impl<R: Runtime> Node<R> {
    /// The team's template called `name` (its id or alias): 404 when nobody has one, 403 when
    /// only another team does.
    fn team_template(&self, team: &str, name: &str) -> Result<TemplateRecord> {
        let all = self.builds().records.templates();
        let mut others = false;
        for t in all {
            if t.template_id == name || t.alias == name {
                if t.team == team {
                    return Ok(t);
                }
                others = true;
            }
        }
        if others {
            Err(Error::forbidden(format!(
                "template '{name}' belongs to another team"
            )))
        } else {
            Err(Error::not_found(format!("template '{name}' not found")))
        }
    }

    fn builds_of(&self, t: &TemplateRecord) -> Vec<BuildRecord> {
        let records = &self.builds().records;
        t.builds
            .iter()
            .filter_map(|id| records.build(id).ok().flatten())
            .collect()
    }

    fn view(&self, t: TemplateRecord) -> TemplateView {
        let builds: Vec<BuildSummary> = self
            .builds_of(&t)
            .into_iter()
            .map(|b| {
                let layer_bytes = b
                    .store_name
                    .as_deref()
                    .and_then(|s| self.inner.templates.get(s).ok())
                    .map_or(0, |t| t.meta.size_bytes);
                BuildSummary {
                    updated_at: b.finished_at.or(b.started_at).unwrap_or(b.created_at),
                    build_id: b.build_id,
                    state: b.state,
                    created_at: b.created_at,
                    finished_at: b.finished_at,
                    cpu_count: b.cpu_count,
                    memory_mb: b.memory_mb,
                    layer_bytes,
                }
            })
            .collect();
        let st = self.state();
        let prefix = format!("{}.", t.template_id);
        let (spawn_count, last_spawned_at) = st
            .usage
            .iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .fold((0, None), |(n, last), (_, (c, at))| {
                (n + c, last.max(Some(*at)))
            });
        TemplateView {
            record: t,
            builds,
            spawn_count,
            last_spawned_at,
        }
    }

    /// Carries out `op`; the answer's shape depends on it.
    pub fn template_op(&self, op: TemplateOp) -> Result<serde_json::Value> {
        // The layers of a template about to be deleted, for the collection after it.
        let released: std::collections::HashSet<String> = match &op {
            TemplateOp::Delete { team, name } => self
                .team_template(team, name)
                .map(|t| {
                    self.builds_of(&t)
                        .iter()
                        .filter_map(|b| b.store_name.as_deref())
                        .filter_map(|s| self.template(s).ok())
                        .flat_map(|t| t.meta.layers)
                        .collect()
                })
                .unwrap_or_default(),
            _ => Default::default(),
        };
        let deletes = matches!(op, TemplateOp::Delete { .. });
        let moves_tags = matches!(
            op,
            TemplateOp::AssignTags { .. }
                | TemplateOp::RemoveTags { .. }
                | TemplateOp::Delete { .. }
        );
        let done = self.carry_out(op);
        if moves_tags && done.is_ok() {
            self.sync_built_pools();
        }
        if deletes && done.is_ok() {
            self.collect_build_garbage(released);
        }
        done
    }

    fn carry_out(&self, op: TemplateOp) -> Result<serde_json::Value> {
        let b = self.builds();
        match op {
            TemplateOp::Resolve { team, name } => match self.resolve_built(&team, &name)? {
                Some(t) => to_json(&t.meta.name),
                None => Err(Error::not_found(format!("template '{name}' not found"))),
            },
            TemplateOp::Describe { team, name } => {
                let t = self.team_template(&team, &name)?;
                to_json(&self.view(t))
            }
            TemplateOp::List { team } => {
                let views: Vec<TemplateView> = b
                    .records
                    .templates()
                    .into_iter()
                    .filter(|t| t.team == team || t.public)
                    .map(|t| self.view(t))
                    .collect();
                to_json(&views)
            }
            TemplateOp::AssignTags {
                team,
                name,
                tag,
                tags,
            } => {
                let _w = b.write_lock();
                let mut t = self.team_template(&team, &name)?;
                let build = t
                    .tags
                    .get(&tag)
                    .map(|r| r.build_id.clone())
                    .ok_or_else(|| {
                        Error::not_found(format!("template '{name}' has no build tagged {tag}"))
                    })?;
                let now = Utc::now();
                for new in &tags {
                    t.tags.insert(
                        new.clone(),
                        TagRecord {
                            build_id: build.clone(),
                            assigned_at: now,
                        },
                    );
                }
                t.updated_at = now;
                b.records.save_template(&t)?;
                to_json(&TagsAssigned {
                    build_id: build,
                    tags,
                })
            }
            TemplateOp::RemoveTags { team, name, tags } => {
                let _w = b.write_lock();
                let mut t = self.team_template(&team, &name)?;
                if let Some(missing) = tags.iter().find(|tag| !t.tags.contains_key(*tag)) {
                    return Err(Error::not_found(format!(
                        "template '{name}' has no tag {missing}"
                    )));
                }
                for tag in &tags {
                    t.tags.remove(tag);
                }
                t.updated_at = Utc::now();
                b.records.save_template(&t)?;
                to_json(&())
            }
            TemplateOp::Publish { team, name, public } => {
                let _w = b.write_lock();
                let mut t = self.team_template(&team, &name)?;
                t.public = public;
                t.updated_at = Utc::now();
                b.records.save_template(&t)?;
                to_json(&vec![format!("{team}/{}", t.alias)])
            }
            TemplateOp::Delete { team, name } => {
                let _w = b.write_lock();
                let t = self.team_template(&team, &name)?;
                let builds = self.builds_of(&t);
                if builds.iter().any(|b| b.state == BuildState::Building) {
                    return Err(Error::invalid(format!(
                        "cannot delete template '{name}' while it is being built"
                    )));
                }
                let stores: Vec<String> =
                    builds.iter().filter_map(|b| b.store_name.clone()).collect();
                let in_use = {
                    let st = self.state();
                    st.claims
                        .values()
                        .any(|c| stores.contains(&c.record.key.template))
                        // A built template's own warm pool goes with it (see `warm`).
                        || st
                            .pools
                            .iter()
                            .any(|(k, p)| !p.built && stores.contains(&k.template))
                };
                if in_use {
                    return Err(Error::invalid(format!(
                        "cannot delete template '{name}' because there are running sandboxes using it"
                    )));
                }
                b.records.remove_template(&t.template_id)?;
                for s in stores {
                    self.inner.templates.remove_built(&s);
                }
                to_json(&())
            }
        }
    }
}
