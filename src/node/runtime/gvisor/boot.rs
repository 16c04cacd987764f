//! Starting a gVisor sandbox: its directory, bundle, cgroups and volumes' views prepared,
//! a start readied (door generation, network holder), runsc run or restore (into a standby or
//! a fork child's container made ahead), and the wait for its door.

use super::*;

/// How `launch` starts a sandbox.
pub(super) enum Start<'a> {
    /// From its bundle, with a build's root or volumes mounted for it when given.
    Fresh(Option<&'a ChildMounts>),
    /// From a checkpoint image.
    Restore(&'a Path),
    /// From a checkpoint image, into a container made for it ahead (see `standby`).
    Into(&'a Path, Box<Standby>),
    /// From a checkpoint image still being written, into a container made while it is (see
    /// `pending`).
    Ahead(&'a Path, Pending),
}

impl GvisorRuntime {
    /// Boots the sandbox `spec` describes (the runtime's `boot`): fresh, from a checkpoint,
    /// from a checkpoint still being written (a fork's child), or taking in saved files.
    pub(super) async fn start_instance(
        &self,
        spec: BootSpec<'_>,
    ) -> Result<Instance<GvisorHandle>> {
        // A seed is a checkpoint to restore, or files a filesystem-only pause saved, which a
        // fresh sandbox takes in.
        let saved_files = spec.seed.filter(|s| files::is_files(s));
        let checkpoint = spec.seed.filter(|s| !files::is_files(s));
        // A fork's children start while their image is written (see `pending`).
        let pending = checkpoint.and_then(|image| self.pending.get(image));
        let init_token = match (checkpoint, &pending) {
            (_, Some(p)) => p.init_token.clone(),
            (None, None) => ids::random_hex(24),
            (Some(image), None) => {
                let bytes = std::fs::read(image.join(IMAGE_META))
                    .map_err(io_err("reading the checkpoint's description"))?;
                serde_json::from_slice::<ImageMeta>(&bytes)
                    .map_err(|e| Error::internal(format!("the checkpoint's description: {e}")))?
                    .init_token
            }
        };
        let (root, mounts) = if spec.build {
            std::fs::create_dir(spec.dir)
                .map_err(io_err(format!("creating {}", spec.dir.display())))?;
            match self.build_root(&spec).await {
                Ok((root, mounts)) => (root, Some(mounts)),
                Err(e) => {
                    Self::remove_instance_dir(spec.dir);
                    return Err(e);
                }
            }
        } else {
            let root = self.plain_root(spec.template).await?;
            std::fs::create_dir(spec.dir)
                .map_err(io_err(format!("creating {}", spec.dir.display())))?;
            (root, None)
        };
        let mut mounts = mounts;
        let prepared = self
            .volume_views(&spec, checkpoint.is_some(), &mut mounts)
            .and_then(|volumes| self.prepare(&spec, &root, &init_token, &volumes));
        let cg = match prepared {
            Ok(cg) => cg,
            Err(e) => {
                Self::remove_instance_dir(spec.dir);
                return Err(e);
            }
        };
        let egress = Net::parse(&spec.key.net)? == Net::Egress;
        let root_made_ns = if spec.build {
            0
        } else {
            use std::os::unix::fs::MetadataExt;
            std::fs::symlink_metadata(&root)
                .map(|m| m.ctime() * 1_000_000_000 + m.ctime_nsec())
                .unwrap_or(0)
        };
        let launched = self
            .launch(
                spec.instance_id,
                spec.dir,
                match (checkpoint, pending) {
                    (Some(image), Some(pending)) => Start::Ahead(image, pending),
                    (Some(image), None) => Start::Restore(image),
                    (None, _) => Start::Fresh(mounts.as_ref()),
                },
                &cg,
                egress,
                spec.egress,
            )
            .await;
        let (container, holder) = match launched {
            Ok(l) => l,
            Err(e) => {
                self.proxies.forget_instance(spec.instance_id);
                let _ = self.cgroups.destroy(&cg);
                Self::remove_instance_dir(spec.dir);
                return Err(e);
            }
        };
        let oom_kills = std::sync::Arc::default();
        let guard = oomguard::start(
            spec.instance_id,
            &cg,
            spec.key.tier().memory_bytes,
            Self::door(spec.dir),
            std::sync::Arc::clone(&oom_kills),
        );
        self.live().insert(
            spec.instance_id.to_string(),
            Live {
                container: Some(container),
                paused: false,
                frozen: false,
                busy: false,
                holder,
                egress: spec.egress.cloned(),
                _guard: guard,
                oom_kills,
                pending: None,
                standby: None,
            },
        );
        let inst = Instance {
            id: spec.instance_id.to_string(),
            dir: spec.dir.to_path_buf(),
            address: String::new(),
            handle: GvisorHandle {
                cgroup: cg,
                egress,
                init_token,
                root_made_ns,
                volumes: !spec.volumes.is_empty(),
            },
            logs: Default::default(),
            agent: Default::default(),
        };
        if let Some(seed) = saved_files
            && let Err(e) = files::load(&Self::door(spec.dir), seed).await
        {
            if let Err(gone) = self.destroy(&inst).await {
                tracing::error!(instance = %inst.id, error = %gone, "a sandbox that could not take its files was not destroyed");
            }
            return Err(e.context("loading the sandbox's saved files"));
        }
        Ok(inst)
    }

    /// Readies a start of the sandbox of `dir`: a new door generation, and with egress a new
    /// network holder (its rules in force) that the bundle joins. Answers a new container
    /// name and the holder.
    pub(super) async fn ground(
        &self,
        inst_id: &str,
        dir: &Path,
        cg: &CgroupSet,
        egress: bool,
        rules: Option<&Egress>,
    ) -> Result<(String, Option<Holder>)> {
        Self::bump_generation(dir)?;
        let holder = if egress {
            let slirp4netns = self.cfg.slirp4netns.clone().ok_or_else(|| {
                Error::invalid("net egress needs slirp4netns (apt-get install slirp4netns)")
            })?;
            let spec = HolderSpec {
                slirp4netns,
                blocked: self.cfg.blocked.clone(),
            };
            let h = Holder::start(
                &self.cfg.agent,
                &spec,
                cg,
                self.reaper.lifeline(),
                self.cfg.boot_timeout,
            )
            .await?;
            if rules.is_some() {
                // A proxy from an earlier start listens in a namespace that is gone.
                self.proxies.forget(inst_id);
                self.enforce(inst_id, h.router_netns(), rules).await?;
            }
            bundle::join_netns(&dir.join("bundle"), &h.netns())?;
            Some(h)
        } else {
            None
        };
        Ok((format!("{inst_id}-{}", ids::random_hex(3)), holder))
    }

    /// Starts the sandbox of `dir` as `start` says and waits for its door: in the container
    /// `made` (a standby, see `standby`) when given, else in a new one readied by `ground`.
    /// Answers the container's name and its network holder.
    pub(super) async fn launch(
        &self,
        inst_id: &str,
        dir: &Path,
        start: Start<'_>,
        cg: &CgroupSet,
        egress: bool,
        rules: Option<&Egress>,
    ) -> Result<(String, Option<Holder>)> {
        let (made, image, root) = match start {
            Start::Into(image, made) => (Some(made), Some(image), None),
            Start::Ahead(image, pending) => {
                match self
                    .standby_for(inst_id, dir, image, cg, egress, rules)
                    .await
                {
                    Ok(s) => {
                        if let Err(e) = pending.complete().await {
                            self.drop_standby(s).await;
                            return Err(e);
                        }
                        (Some(Box::new(s)), Some(image), None)
                    }
                    // One child's start-up is no reason to fail a fork: it restores the
                    // ordinary way once the image is complete.
                    Err(e) => {
                        tracing::warn!(instance = %inst_id, error = %e, "could not ready a fork child's restore ahead; restoring once its image is complete");
                        pending.complete().await?;
                        (None, Some(image), None)
                    }
                }
            }
            Start::Restore(image) => (None, Some(image), None),
            Start::Fresh(root) => (None, None, root),
        };
        let standby = made.is_some();
        let (container, holder, held) = match made {
            Some(s) => (s.container, s.holder, Some(s.restore)),
            None => {
                let (c, h) = self.ground(inst_id, dir, cg, egress, rules).await?;
                (c, h, None)
            }
        };
        let bundle = dir.join("bundle");
        let runsc = &self.cfg.runsc;
        let started = match (image, held) {
            (Some(image), Some(held)) if held.image == image => held.release().await,
            // Into a standby, runsc only hands the image to the Sentry and gofer made in the
            // cgroups and starts nothing, so it need not move into them (10-20 ms here).
            (Some(image), _) => {
                let cg = (!standby).then_some(cg);
                runsc.restore(image, &bundle, &container, cg, egress).await
            }
            (None, _) => runsc.run(&bundle, &container, cg, egress, root).await,
        };
        if let Err(e) = started {
            if standby {
                // The container was made before; a failed restore leaves it.
                let _ = runsc.delete(&container).await;
            }
            return Err(e);
        }
        let door = Instant::now();
        if let Err(e) = self.wait_door(dir, None, self.cfg.boot_timeout).await {
            let _ = runsc.delete(&container).await;
            return Err(e);
        }
        tracing::debug!(
            instance = %inst_id,
            ms = door.elapsed().as_secs_f64() * 1e3,
            "the sandbox's door answered"
        );
        Ok((container, holder))
    }

    /// A build instance's root (see `buildroot`), prepared off the async threads.
    async fn build_root(&self, spec: &BootSpec<'_>) -> Result<(PathBuf, ChildMounts)> {
        let roots = self.build_roots()?;
        let bytes = self.cfg.disk_bytes.unwrap_or(spec.key.tier().disk_bytes);
        let (dir, template) = (spec.dir.to_path_buf(), spec.template.clone());
        tokio::task::spawn_blocking(move || roots.prepare(&dir, &template, bytes))
            .await
            .map_err(|e| Error::internal(format!("preparing the build's root failed: {e}")))?
            .map_err(io_err("preparing the build's root"))
    }

    pub(super) fn build_roots(&self) -> Result<std::sync::Arc<BuildRoots>> {
        self.builds
            .clone()
            .map_err(|why| Error::invalid(format!("this node cannot run template builds: {why}")))
    }

    /// Removes an instance's directory, after unmounting its build disk if it has one (a
    /// removal through a mount would empty that disk and then fail).
    fn remove_instance_dir(dir: &Path) {
        if let Err(e) = BuildRoots::release(dir) {
            tracing::error!(error = %e, "could not unmount a build disk");
            return;
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Makes `spec.volumes` mountable in the sandbox: a mount point for each in the
    /// instance's directory, where runsc's child shows the volume through an id-mapped view
    /// (see `views`; nothing is mounted in the node's namespace), and what the bundle binds
    /// from there. A checkpoint's sandbox keeps the mounts it was saved with, so none are
    /// added to one.
    fn volume_views(
        &self,
        spec: &BootSpec<'_>,
        restore: bool,
        mounts: &mut Option<ChildMounts>,
    ) -> Result<Vec<(PathBuf, String)>> {
        if spec.volumes.is_empty() {
            return Ok(Vec::new());
        }
        if restore {
            return Err(Error::invalid(
                "volumes cannot be mounted into a sandbox started from a gVisor snapshot; create it without volume mounts",
            ));
        }
        let views = self.views.clone().map_err(|why| {
            Error::invalid(format!(
                "this node cannot mount volumes into gVisor sandboxes: {why}"
            ))
        })?;
        let child = mounts.get_or_insert_with(|| ChildMounts::new(views.clone()));
        let mut binds = Vec::with_capacity(spec.volumes.len());
        for (i, v) in spec.volumes.iter().enumerate() {
            let source = Path::new(&v.source);
            views.check(source, true).map_err(|e| {
                Error::invalid(format!(
                    "volume {:?} cannot be mounted on this node's gVisor sandboxes: {e}",
                    v.name
                ))
            })?;
            let point = spec.dir.join(VOLUMES_DIR).join(i.to_string());
            std::fs::create_dir_all(&point).map_err(io_err("making a volume's mount point"))?;
            child
                .view(source, &point, true)
                .map_err(io_err("naming a volume's mount"))?;
            binds.push((point, v.path.clone()));
        }
        Ok(binds)
    }

    fn prepare(
        &self,
        spec: &BootSpec<'_>,
        root: &Path,
        init_token: &str,
        volumes: &[(PathBuf, String)],
    ) -> Result<CgroupSet> {
        let dir = spec.dir;
        std::fs::create_dir(dir.join("run")).map_err(io_err("preparing the instance"))?;
        let egress = Net::parse(&spec.key.net)? == Net::Egress;
        if egress && self.cfg.slirp4netns.is_none() {
            return Err(Error::invalid(
                "net egress needs slirp4netns on the node (apt-get install slirp4netns)",
            ));
        }
        let tier = spec.key.tier();
        let b = bundle::spec(&bundle::BundleSpec {
            root,
            agent: &self.cfg.agent.program,
            libs: &self.libs,
            loader: &self.loader,
            run_dir: &dir.join("run"),
            hostname: &ids::dns_safe(spec.instance_id),
            init_token,
            memory_bytes: tier.memory_bytes,
            cpu_count: tier.cpu_count,
            pids: tier.pids,
            // The holder's namespace is filled in at each start.
            netns: egress.then_some(Path::new("/proc/self/ns/net")),
            services: &spec.template.meta.services,
            volumes,
        })?;
        bundle::write(&dir.join("bundle"), &b)?;
        let cg = self
            .cgroups
            .create(spec.instance_id)
            .map_err(io_err("creating the instance cgroups"))?;
        let limits = Limits {
            // Above the sandbox's memory: the memory guard acts at it (see `oomguard`).
            memory_bytes: oomguard::host_limit(tier.memory_bytes),
            cpus: tier.cpu_count,
            // The Sentry's own threads count against this too.
            pids: tier.pids + 256,
        };
        if let Err(e) = self.cgroups.limit(&cg, limits) {
            let _ = self.cgroups.destroy(&cg);
            return Err(Error::io("limiting the instance", e));
        }
        Ok(cg)
    }
}
