//! Containers made ahead for paused sandboxes' resumes. `runsc restore` into a container that
//! exists already skips starting runsc's sandbox processes (the Sentry, its gofer and their
//! seccomp programs: about 100 ms here), and that restore is started ahead too and held
//! before it reads anything (its own start-up, about 25 ms), so a resume pays for loading its
//! image only. Each standby is a waiting Sentry and gofer (about 24 MiB, in the sandbox's own
//! cgroup), so a node keeps a few, for the sandboxes paused most recently; the others resume
//! the slower way.

use super::runsc::HeldRestore;
use super::*;

/// A container made for a paused sandbox's restore, with its network holder (egress) and
/// the restore itself, started and held (see `Runsc::hold_restore`).
pub(super) struct Standby {
    pub container: String,
    pub holder: Option<Holder>,
    pub restore: HeldRestore,
    /// When it was made: the oldest gives way when the node keeps its fill.
    pub made: Instant,
}

impl GvisorRuntime {
    /// Makes a standby for `inst` if it is paused to disk, has none, the node keeps any and
    /// its runsc can restore into one; the oldest other standby gives way when the node has
    /// its fill.
    pub(super) async fn make_standby(&self, inst: &Instance<GvisorHandle>) -> Result<()> {
        if self.cfg.standbys == 0 || !self.cfg.runsc.restores_into_created {
            return Ok(());
        }
        let rules = match self.live().get(&inst.id) {
            Some(l) if l.paused && !l.frozen && l.container.is_none() && l.standby.is_none() => {
                l.egress.clone()
            }
            _ => return Ok(()),
        };
        let started = Instant::now();
        let image = inst.dir.join(IMAGE_DIR);
        let made = self
            .standby_for(
                &inst.id,
                &inst.dir,
                &image,
                &inst.handle.cgroup,
                inst.handle.egress,
                rules.as_ref(),
            )
            .await?;
        let (leftover, evicted) = {
            let mut live = self.live();
            match live.get_mut(&inst.id) {
                // Released while it was made.
                None => (Some(made), Vec::new()),
                Some(l) => {
                    l.standby = Some(made);
                    let ages: Vec<(String, Instant)> = live
                        .iter()
                        .filter_map(|(id, l)| l.standby.as_ref().map(|s| (id.clone(), s.made)))
                        .collect();
                    let evicted = overflow(ages, self.cfg.standbys)
                        .into_iter()
                        .filter_map(|id| live.get_mut(&id).and_then(|l| l.standby.take()))
                        .collect();
                    (None, evicted)
                }
            }
        };
        for s in leftover.into_iter().chain(evicted) {
            self.drop_standby(s).await;
        }
        tracing::debug!(
            instance = %inst.id,
            ms = started.elapsed().as_secs_f64() * 1e3,
            "made a standby for the sandbox's resume"
        );
        Ok(())
    }

    /// Makes a standby for a restore of `image` into the sandbox of `dir`: its container
    /// (with egress, its network holder first, `rules` in force) and the restore, held.
    pub(super) async fn standby_for(
        &self,
        inst_id: &str,
        dir: &Path,
        image: &Path,
        cg: &CgroupSet,
        egress: bool,
        rules: Option<&Egress>,
    ) -> Result<Standby> {
        let (container, holder) = self.ground(inst_id, dir, cg, egress, rules).await?;
        let bundle = dir.join("bundle");
        let runsc = &self.cfg.runsc;
        let restore = match runsc.create(&bundle, &container, cg, egress).await {
            Ok(()) => {
                runsc
                    .hold_restore(image, &bundle, &container, cg, egress)
                    .await
            }
            Err(e) => Err(e),
        };
        match restore {
            Ok(restore) => Ok(Standby {
                container,
                holder,
                restore,
                made: Instant::now(),
            }),
            Err(e) => {
                // A create that failed half way may have left its processes; a restore not
                // seen held may have gone on.
                let _ = runsc.delete(&container).await;
                Err(e)
            }
        }
    }

    /// The sandbox's standby, if it has one; it is the caller's from here.
    pub(super) fn take_standby(&self, id: &str) -> Option<Standby> {
        self.live().get_mut(id).and_then(|l| l.standby.take())
    }

    /// Ends a standby's container; its held restore and its holder go with it.
    pub(super) async fn drop_standby(&self, s: Standby) {
        let Standby {
            container,
            holder,
            restore,
            ..
        } = s;
        drop(restore);
        let _ = self.cfg.runsc.delete(&container).await;
        drop(holder);
    }
}

/// Which of the standbys (each a sandbox and when its standby was made) give way so that at
/// most `keep` are left: the oldest.
fn overflow(mut ages: Vec<(String, Instant)>, keep: usize) -> Vec<String> {
    ages.sort_by_key(|(_, made)| std::cmp::Reverse(*made));
    ages.into_iter().skip(keep).map(|(id, _)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_standbys_give_way() {
        let t = Instant::now();
        let at = |ms| t + Duration::from_millis(ms);
        let ages = vec![
            ("b".to_string(), at(20)),
            ("a".to_string(), at(10)),
            ("d".to_string(), at(40)),
            ("c".to_string(), at(30)),
        ];
        let mut gone = overflow(ages.clone(), 2);
        gone.sort();
        assert_eq!(gone, ["a", "b"]);
        assert_eq!(overflow(ages.clone(), 4), Vec::<String>::new());
        assert_eq!(overflow(ages.clone(), 9), Vec::<String>::new());
        assert_eq!(overflow(ages, 0).len(), 4);
    }
}
