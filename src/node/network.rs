//! A claimed sandbox's network policy on its node: which egress rules a claim brings, putting
//! them in force before the caller's code runs, and replacing them while the sandbox lives
//! (they reach open connections' next packets).

use super::Node;
use super::runtime::{Instance, Runtime};
use crate::model::network::{Egress, NetworkPolicy};
use crate::model::{Error, PoolKey, Result, SandboxRecord};

impl<R: Runtime> Node<R> {
    /// The rules `policy` asks for on a sandbox of `key`: none without a network of its own
    /// (nothing leaves one anyway) or when nothing is denied. A policy that needs rules on a
    /// node that cannot enforce them is refused before anything is claimed.
    /// `tenant` (the claim's namespace) is whose secrets the rules' headers may name.
    pub(super) fn egress_for(
        &self,
        key: &PoolKey,
        policy: &NetworkPolicy,
        tenant: &str,
    ) -> Result<Option<Egress>> {
        let mut rules = policy.egress()?;
        if let Some(r) = &mut rules {
            r.tenant = tenant.to_string();
        }
        if key.net != "egress" {
            if !policy.denies_everything() && rules.is_some() {
                return Err(Error::invalid(format!(
                    "pool {key} has no network, so egress rules that allow something cannot apply to it"
                )));
            }
            return Ok(None);
        }
        if rules.is_some() && !self.inner.runtime.enforces_egress() {
            return Err(Error::invalid(format!(
                "node {:?} cannot enforce network policies (nftables is not installed: apt-get install nftables)",
                self.name()
            )));
        }
        if rules.as_ref().is_some_and(|r| r.needs_proxy()) && !self.inner.runtime.proxies_egress() {
            return Err(Error::invalid(format!(
                "domain names in network.allowOut and header rules in network.rules need an egress proxy, which node {:?} does not have on its {} runtime yet; give IPv4 addresses or CIDRs",
                self.name(),
                self.inner.runtime.name()
            )));
        }
        Ok(rules)
    }

    /// Puts `egress` in force on an instance about to be handed out; one that cannot take
    /// them is destroyed rather than handed out without them.
    pub(super) async fn with_egress(
        &self,
        inst: Instance<R::Handle>,
        egress: Option<&Egress>,
    ) -> Result<Instance<R::Handle>> {
        let Some(rules) = egress else {
            return Ok(inst);
        };
        match self.inner.runtime.set_egress(&inst, Some(rules)).await {
            Ok(()) => Ok(inst),
            Err(e) => {
                self.destroy_later(inst, "egress rules failed");
                Err(e)
            }
        }
    }

    /// Replaces the sandbox's network policy (the e2b update replaces the whole egress
    /// configuration; whether its ports are public stays as created). Answers the record
    /// without its token and whether it changed.
    pub async fn update_network(
        &self,
        id: &str,
        mut policy: NetworkPolicy,
    ) -> Result<(SandboxRecord, bool)> {
        policy.validate()?;
        let (_guard, current, inst) = self.lock_claim(id).await?;
        policy.allow_public_traffic = current.network.allow_public_traffic;
        policy.mask_request_host = current.network.mask_request_host.clone();
        if policy == current.network {
            return Ok((current.without_token(), false));
        }
        if current.key.net != "egress" && !policy.denies_everything() {
            return Err(Error::conflict(format!(
                "sandbox {id} was created without internet access (allow_internet_access: false), so it has no network to open; create it with internet access and a denyOut list to change its egress later"
            )));
        }
        let rules = self.egress_for(&current.key, &policy, current.namespace())?;
        // A sandbox paused on disk has no instance: its next boot gets the new rules (and
        // its /init the CA they need).
        if current.key.net == "egress" && !current.paused_on_disk() {
            // The sandbox trusts the proxy's CA before the proxy intercepts anything.
            let next = SandboxRecord {
                network: policy.clone(),
                ..current.clone()
            };
            if current.phase == crate::model::Phase::Paused {
                // Its agent is frozen: it cannot take the CA now.
                if super::identify::intercepts(&next) && !super::identify::intercepts(&current) {
                    return Err(Error::conflict(format!(
                        "sandbox {id} is paused; header rules can be added once it runs again"
                    )));
                }
            } else {
                self.trust_egress_ca(&next, &inst).await?;
            }
            // Lifting every rule is a change too: the old table must go.
            self.inner.runtime.set_egress(&inst, rules.as_ref()).await?;
        }
        self.modify_claim(id, |c| {
            c.record.network = policy;
            c.instance.logs.note(
                crate::model::logs::LogLevel::Info,
                match &rules {
                    Some(r) => format!(
                        "network policy updated: {} denied, {} allowed back",
                        r.deny.join(" "),
                        if r.allow.is_empty() {
                            "none".to_string()
                        } else {
                            r.allow.join(" ")
                        }
                    ),
                    None => "network policy updated: all egress open".to_string(),
                },
            );
            Ok(true)
        })
    }
}
