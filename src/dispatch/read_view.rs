//! The read view: every node's inventory merged into one list with a monotonic revision, for
//! unpinned lists and watches. A node's entries come from its change stream (a node whose
//! stream is lost keeps its entries until the staleness bound, then leaves the view) or, in
//! cluster mode, from the snapshots it publishes as a NodeInventory object.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::broadcast;

use super::catch_up::CatchUp;
use super::forms::Forms;
use crate::model::{InventoryChange, InventoryEvent, SandboxRecord};

/// Changes kept for watches that resume from an older revision. Each holds its sandbox's
/// record (and the one before a modification), so a gateway's memory grows until this many
/// changes have happened; the soak driver measures its slope after that.
pub const HISTORY: usize = 16_384;
/// Changes a watcher may fall behind by; the channel's slots hold the same events as `history`.
const BROADCAST: usize = HISTORY;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewEventKind {
    Added,
    Modified,
    Deleted,
}

#[derive(Debug, Clone)]
pub struct ViewEvent {
    pub kind: ViewEventKind,
    pub revision: u64,
    pub sandbox: Arc<SandboxRecord>,
    /// For a modification, the state before it (a filtered watch needs it to tell an object
    /// entering or leaving its selection).
    pub previous: Option<Arc<SandboxRecord>>,
}

/// A watch asked to resume from a revision the view no longer remembers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired {
    pub oldest: u64,
}

/// A sandbox in the view and the revision at which it last changed, with the serialized
/// forms the surfaces made of it (shared by clones; a changed record is a new entry).
#[derive(Debug, Clone)]
pub struct Entry {
    pub record: Arc<SandboxRecord>,
    pub revision: u64,
    pub forms: Arc<Forms>,
}

impl Entry {
    pub fn new(record: Arc<SandboxRecord>, revision: u64) -> Entry {
        Entry {
            record,
            revision,
            forms: Arc::default(),
        }
    }
}

/// Where an entry sorts in lists: claim ref (`<namespace>/<name>`), then id, then node (the
/// same id reported by two nodes is two entries).
type SortKey = (String, String, String);

fn sort_key(node: &str, r: &SandboxRecord) -> SortKey {
    (r.claim_ref.clone(), r.id.clone(), node.to_string())
}

#[derive(Default)]
struct NodeSlice {
    sandboxes: HashMap<String, Entry>,
    /// A snapshot being received (between stream start or RESET and SYNCED).
    incoming: Option<HashMap<String, Arc<SandboxRecord>>>,
    lost_since: Option<Instant>,
    /// Fed by published snapshots, which lag: what this dispatcher changed itself after a
    /// snapshot was taken wins over that snapshot.
    snapshots: bool,
    /// Sandboxes this dispatcher changed, and when (snapshot-fed nodes only).
    local: HashMap<String, DateTime<Utc>>,
    /// The node's inventory revision the entries reflect (stream-fed nodes, once synced).
    applied: u64,
}

#[derive(Default)]
struct Inner {
    revision: u64,
    nodes: HashMap<String, NodeSlice>,
    /// Every node's entries in list order, kept beside `nodes` on every change so that a list
    /// of 50,000 is a walk, not a sort.
    sorted: BTreeMap<SortKey, Entry>,
    history: VecDeque<ViewEvent>,
    /// Sandboxes this dispatcher released (id → node, when), until their node confirms it:
    /// a late event or snapshot from before the release must not bring them back.
    released: HashMap<String, (String, Instant)>,
}

/// How long a local release shadows stream events for its sandbox at most.
const RELEASE_SHADOW: Duration = Duration::from_secs(120);

/// A change this dispatcher made itself and already knows the outcome of.
#[derive(Debug, Clone)]
pub enum LocalChange {
    /// A claim, fork child, pause or resume: the node's answer.
    Upsert(Box<SandboxRecord>),
    Released {
        id: String,
    },
    Deadline {
        id: String,
        deadline: chrono::DateTime<chrono::Utc>,
    },
}

pub struct ReadView {
    inner: RwLock<Inner>,
    tx: broadcast::Sender<ViewEvent>,
    /// The whole view in list order and the revision it is current as of, shared by every
    /// unfiltered list until the view changes.
    listed: Shared,
    /// The same, ordered by claim time (see `by_start`).
    by_start: Shared,
    /// What live reads saw of each node, which lists wait for.
    catch_up: CatchUp,
}

/// A whole-view slice and the revision it was made at, kept until the revision moves.
type Shared = Mutex<Option<(u64, Arc<[Entry]>)>>;

fn shared(
    slot: &Shared,
    inner: &Inner,
    make: impl FnOnce(&Inner) -> Arc<[Entry]>,
) -> (Arc<[Entry]>, u64) {
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((revision, all)) = slot.as_ref()
        && *revision == inner.revision
    {
        return (all.clone(), *revision);
    }
    let all = make(inner);
    *slot = Some((inner.revision, all.clone()));
    (all, inner.revision)
}

impl Default for ReadView {
    fn default() -> Self {
        Self::new()
    }
}

impl Inner {
    fn drop_node(&mut self, tx: &broadcast::Sender<ViewEvent>, node: &str) {
        if let Some(slice) = self.nodes.remove(node) {
            let mut gone: Vec<_> = slice.sandboxes.into_values().map(|e| e.record).collect();
            gone.sort_by(|a, b| a.id.cmp(&b.id));
            for rec in gone {
                self.sorted.remove(&sort_key(node, &rec));
                self.record(tx, ViewEventKind::Deleted, rec, None);
            }
        }
    }

    fn record(
        &mut self,
        tx: &broadcast::Sender<ViewEvent>,
        kind: ViewEventKind,
        sandbox: Arc<SandboxRecord>,
        previous: Option<Arc<SandboxRecord>>,
    ) -> u64 {
        self.revision += 1;
        let ev = ViewEvent {
            kind,
            revision: self.revision,
            sandbox,
            previous,
        };
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(ev.clone());
        let _ = tx.send(ev);
        self.revision
    }

    fn upsert(&mut self, tx: &broadcast::Sender<ViewEvent>, node: &str, record: SandboxRecord) {
        if self.released.contains_key(&record.id) {
            return;
        }
        let slice = self.nodes.entry(node.to_string()).or_default();
        if let Some(incoming) = &mut slice.incoming {
            incoming.insert(record.id.clone(), Arc::new(record));
            return;
        }
        let (kind, previous) = match slice.sandboxes.get(&record.id) {
            None => (ViewEventKind::Added, None),
            Some(old) if *old.record == record => return,
            Some(old) => (ViewEventKind::Modified, Some(old.record.clone())),
        };
        if let Some(old) = &previous {
            self.sorted.remove(&sort_key(node, old));
        }
        let record = Arc::new(record);
        let revision = self.record(tx, kind, record.clone(), previous);
        let entry = Entry::new(record, revision);
        self.sorted
            .insert(sort_key(node, &entry.record), entry.clone());
        if let Some(slice) = self.nodes.get_mut(node) {
            slice.sandboxes.insert(entry.record.id.clone(), entry);
        }
    }

    fn remove(&mut self, tx: &broadcast::Sender<ViewEvent>, node: &str, id: &str) {
        self.released.remove(id);
        let Some(slice) = self.nodes.get_mut(node) else {
            return;
        };
        if let Some(incoming) = &mut slice.incoming {
            incoming.remove(id);
            return;
        }
        if let Some(old) = slice.sandboxes.remove(id) {
            self.sorted.remove(&sort_key(node, &old.record));
            self.record(tx, ViewEventKind::Deleted, old.record, None);
        }
    }

    /// Replaces a node's entries with the snapshot it just finished sending, announcing only
    /// what differs. `as_of` is when a published snapshot was taken; local changes made
    /// after it are kept over what it says.
    fn settle(
        &mut self,
        tx: &broadcast::Sender<ViewEvent>,
        node: &str,
        as_of: Option<DateTime<Utc>>,
    ) {
        let Some(slice) = self.nodes.get_mut(node) else {
            return;
        };
        let Some(mut incoming) = slice.incoming.take() else {
            return;
        };
        slice.lost_since = None;
        let old = std::mem::take(&mut slice.sandboxes);
        match as_of {
            Some(as_of) => {
                slice.local.retain(|_, at| *at > as_of);
                for id in slice.local.keys() {
                    match old.get(id) {
                        Some(e) => incoming.insert(id.clone(), e.record.clone()),
                        None => incoming.remove(id),
                    };
                }
            }
            None => slice.local.clear(),
        }
        // A complete snapshot settles this node's local releases: keep shadowing what it
        // still lists, forget the rest.
        self.released
            .retain(|id, (n, _)| n != node || incoming.contains_key(id));
        incoming.retain(|id, _| !self.released.contains_key(id));
        let mut next: HashMap<String, Entry> = HashMap::with_capacity(incoming.len());
        for (id, entry) in &old {
            if !incoming.contains_key(id) {
                self.sorted.remove(&sort_key(node, &entry.record));
                self.record(tx, ViewEventKind::Deleted, entry.record.clone(), None);
            }
        }
        for (id, record) in incoming {
            let entry = match old.get(&id) {
                Some(o) if *o.record == *record => o.clone(),
                prior => {
                    let kind = if prior.is_some() {
                        ViewEventKind::Modified
                    } else {
                        ViewEventKind::Added
                    };
                    if let Some(p) = prior {
                        self.sorted.remove(&sort_key(node, &p.record));
                    }
                    let previous = prior.map(|p| p.record.clone());
                    let revision = self.record(tx, kind, record.clone(), previous);
                    let entry = Entry::new(record, revision);
                    self.sorted
                        .insert(sort_key(node, &entry.record), entry.clone());
                    entry
                }
            };
            next.insert(id, entry);
        }
        if let Some(slice) = self.nodes.get_mut(node) {
            slice.sandboxes = next;
        }
    }
}

impl ReadView {
    pub fn new() -> Self {
        let (tx, _) = broadcast::channel(BROADCAST);
        // Revisions start from the time the view was made, so that a version handed out by an
        // earlier run (or another replica) is never taken for one of this view's.
        let base = chrono::Utc::now().timestamp_micros().max(0) as u64;
        ReadView {
            inner: RwLock::new(Inner {
                revision: base,
                ..Inner::default()
            }),
            tx,
            listed: Mutex::new(None),
            by_start: Mutex::new(None),
            catch_up: CatchUp::default(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// A node's stream (re)started: what it sends until SYNCED is its complete inventory.
    pub fn stream_started(&self, node: &str) {
        let mut inner = self.write();
        let slice = inner.nodes.entry(node.to_string()).or_default();
        slice.incoming = Some(HashMap::new());
        slice.applied = 0;
        self.catch_up.restart(node);
    }

    /// A node's stream ended; its entries stay until `sweep` finds them stale.
    pub fn stream_lost(&self, node: &str) {
        let mut inner = self.write();
        if let Some(slice) = inner.nodes.get_mut(node) {
            slice.incoming = None;
            slice.lost_since.get_or_insert_with(Instant::now);
        }
        self.catch_up.moved();
    }

    pub fn apply(&self, node: &str, event: InventoryEvent) {
        let mut inner = self.write();
        let revision = event.revision;
        match event.change {
            InventoryChange::Added(r) | InventoryChange::Modified(r) => {
                inner.upsert(&self.tx, node, r)
            }
            InventoryChange::Deleted(r) => inner.remove(&self.tx, node, &r.id),
            InventoryChange::Synced => inner.settle(&self.tx, node, None),
            InventoryChange::Reset => {
                inner.nodes.entry(node.to_string()).or_default().incoming = Some(HashMap::new())
            }
        }
        // A snapshot being received is not applied until SYNCED settles it.
        if let Some(slice) = inner.nodes.get_mut(node)
            && slice.incoming.is_none()
        {
            slice.applied = slice.applied.max(revision);
        }
        drop(inner);
        self.catch_up.moved();
    }

    /// A live read saw `node`'s inventory at `revision`: lists wait for the view to get there.
    pub fn observed(&self, node: &str, revision: u64) {
        self.catch_up.observe(node, revision);
    }

    /// Waits, at most `timeout`, until the view reflects what every live read made before
    /// this call saw, so that a list does not show a sandbox older than a get just did.
    /// Nodes fed by snapshots, and nodes whose stream is down, are not waited for. Answers
    /// whether it caught up.
    pub async fn caught_up(&self, timeout: Duration) -> bool {
        self.catch_up
            .wait(timeout, |targets| {
                let inner = self.read();
                targets.iter().any(|(node, revision)| {
                    inner.nodes.get(node).is_some_and(|s| {
                        !s.snapshots
                            && s.lost_since.is_none()
                            && (s.incoming.is_some() || s.applied < *revision)
                    })
                })
            })
            .await
    }

    /// Applies a change this dispatcher just made, so that a list on this replica reflects
    /// it at once instead of after the node's stream catches up.
    pub fn apply_local(&self, node: &str, change: LocalChange) {
        let mut inner = self.write();
        if let Some(slice) = inner.nodes.get_mut(node)
            && slice.snapshots
        {
            let id = match &change {
                LocalChange::Upsert(r) => &r.id,
                LocalChange::Released { id } | LocalChange::Deadline { id, .. } => id,
            };
            slice.local.insert(id.clone(), Utc::now());
        }
        match change {
            LocalChange::Upsert(record) => inner.upsert(&self.tx, node, record.without_token()),
            LocalChange::Released { id } => {
                inner.remove(&self.tx, node, &id);
                inner
                    .released
                    .insert(id, (node.to_string(), Instant::now()));
            }
            LocalChange::Deadline { id, deadline } => {
                let current = inner
                    .nodes
                    .get(node)
                    .and_then(|s| s.sandboxes.get(&id))
                    .map(|e| (*e.record).clone());
                if let Some(mut r) = current {
                    r.deadline = deadline;
                    inner.upsert(&self.tx, node, r);
                }
            }
        }
    }

    /// Replaces a node's entries with a snapshot it published at `as_of`.
    pub fn replace(&self, node: &str, records: Vec<SandboxRecord>, as_of: DateTime<Utc>) {
        let mut inner = self.write();
        let slice = inner.nodes.entry(node.to_string()).or_default();
        slice.snapshots = true;
        slice.incoming = Some(
            records
                .into_iter()
                .map(|r| (r.id.clone(), Arc::new(r.without_token())))
                .collect(),
        );
        inner.settle(&self.tx, node, Some(as_of));
    }

    /// Drops a node's entries at once (it left the fleet).
    pub fn forget(&self, node: &str) {
        let mut inner = self.write();
        inner.drop_node(&self.tx, node);
        drop(inner);
        self.catch_up.moved();
    }

    /// Drops the entries of nodes whose streams have been lost for longer than `stale_after`.
    /// Returns the nodes dropped.
    pub fn sweep(&self, stale_after: Duration) -> Vec<String> {
        let mut inner = self.write();
        inner
            .released
            .retain(|_, (_, at)| at.elapsed() < RELEASE_SHADOW);
        let stale: Vec<String> = inner
            .nodes
            .iter()
            .filter(|(_, s)| s.lost_since.is_some_and(|t| t.elapsed() >= stale_after))
            .map(|(n, _)| n.clone())
            .collect();
        for node in &stale {
            inner.drop_node(&self.tx, node);
        }
        stale
    }

    pub fn revision(&self) -> u64 {
        self.read().revision
    }

    /// The records that pass `keep`, sorted by claim ref (`<namespace>/<name>`), then id; and
    /// the revision they are current as of.
    pub fn list(&self, keep: impl Fn(&SandboxRecord) -> bool) -> (Vec<Arc<SandboxRecord>>, u64) {
        let (entries, revision) = self.entries(keep);
        (entries.into_iter().map(|e| e.record).collect(), revision)
    }

    /// Like `list`, with the revision at which each record last changed, in
    /// "<namespace>/<name>" order, as Kubernetes stores its keys.
    pub fn entries(&self, keep: impl Fn(&SandboxRecord) -> bool) -> (Vec<Entry>, u64) {
        let inner = self.read();
        let out: Vec<Entry> = inner
            .sorted
            .values()
            .filter(|e| keep(&e.record))
            .cloned()
            .collect();
        (out, inner.revision)
    }

    /// Every entry in list order, and the revision it is current as of. While the view does
    /// not change this is the same shared slice, so a list (or the first page of one) does not
    /// copy 50,000 entries each time.
    pub fn all_entries(&self) -> (Arc<[Entry]>, u64) {
        let inner = self.read();
        shared(&self.listed, &inner, |inner| {
            inner.sorted.values().cloned().collect()
        })
    }

    /// Every entry ordered by claim time, then id, oldest first (ties keep list order), shared
    /// like `all_entries`: listings by age page through it without sorting again.
    pub fn by_start(&self) -> (Arc<[Entry]>, u64) {
        let inner = self.read();
        shared(&self.by_start, &inner, |inner| {
            let mut all: Vec<Entry> = inner.sorted.values().cloned().collect();
            all.sort_by(|a, b| {
                (a.record.claimed_at, &a.record.id).cmp(&(b.record.claimed_at, &b.record.id))
            });
            all.into()
        })
    }

    pub fn entry(&self, id: &str) -> Option<Entry> {
        let inner = self.read();
        inner
            .nodes
            .values()
            .find_map(|s| s.sandboxes.get(id).cloned())
    }

    pub fn find_id(&self, id: &str) -> Option<Arc<SandboxRecord>> {
        self.entry(id).map(|e| e.record)
    }

    pub fn find_claim_ref(&self, claim_ref: &str) -> Vec<Arc<SandboxRecord>> {
        let inner = self.read();
        let from = (claim_ref.to_string(), String::new(), String::new());
        inner
            .sorted
            .range(from..)
            .take_while(|(k, _)| k.0 == claim_ref)
            .map(|(_, e)| e.record.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.read().sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Changes after revision `since` (all remembered ones when None is given, which callers
    /// use after an initial list) and a receiver for later ones. A receiver event whose
    /// revision is not above the last backlog revision is a duplicate and must be skipped.
    pub fn watch(
        &self,
        since: u64,
    ) -> Result<(Vec<ViewEvent>, broadcast::Receiver<ViewEvent>), Expired> {
        let inner = self.read();
        let rx = self.tx.subscribe();
        if since == inner.revision {
            return Ok((Vec::new(), rx));
        }
        if since > inner.revision {
            // Not a version this view ever handed out.
            return Err(Expired {
                oldest: inner.revision,
            });
        }
        let oldest = inner
            .history
            .front()
            .map_or(inner.revision + 1, |e| e.revision);
        if since + 1 < oldest {
            return Err(Expired { oldest });
        }
        let backlog = inner
            .history
            .iter()
            .filter(|e| e.revision > since)
            .cloned()
            .collect();
        Ok((backlog, rx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Phase;

    fn rec(id: &str, claim_ref: &str) -> SandboxRecord {
        SandboxRecord::fixture(id, claim_ref)
    }

    fn ev(change: InventoryChange) -> InventoryEvent {
        InventoryEvent {
            change,
            revision: 0,
        }
    }

    /// The sorted index holds exactly the nodes' entries, at the same revisions.
    fn assert_index_matches(v: &ReadView) {
        let inner = v.read();
        let mut from_nodes: Vec<(String, String, String, u64)> = inner
            .nodes
            .iter()
            .flat_map(|(n, s)| {
                s.sandboxes.values().map(move |e| {
                    let r = &e.record;
                    (r.claim_ref.clone(), r.id.clone(), n.clone(), e.revision)
                })
            })
            .collect();
        from_nodes.sort();
        let from_index: Vec<_> = inner
            .sorted
            .iter()
            .map(|(k, e)| (k.0.clone(), k.1.clone(), k.2.clone(), e.revision))
            .collect();
        assert_eq!(from_nodes, from_index);
    }

    #[test]
    fn lists_come_sorted_and_a_change_starts_with_empty_forms() {
        use crate::dispatch::forms::{Form, Rendered};
        let v = ReadView::new();
        v.stream_started("n1");
        v.stream_started("n2");
        for (node, id, claim_ref) in [
            ("n1", "z", "b/x"),
            ("n2", "y", "a/y"),
            ("n1", "c", "a/y"),
            ("n2", "d", "c/a"),
        ] {
            let mut r = rec(id, claim_ref);
            r.node = node.into();
            v.apply(node, ev(InventoryChange::Added(r)));
        }
        v.apply("n1", ev(InventoryChange::Synced));
        v.apply("n2", ev(InventoryChange::Synced));
        assert_index_matches(&v);
        let (all, _) = v.entries(|_| true);
        let order: Vec<&str> = all.iter().map(|e| e.record.id.as_str()).collect();
        assert_eq!(order, ["c", "y", "z", "d"], "by claim ref, then id");
        let (shared, at) = v.all_entries();
        let order: Vec<&str> = shared.iter().map(|e| e.record.id.as_str()).collect();
        assert_eq!(order, ["c", "y", "z", "d"]);
        let (again, _) = v.all_entries();
        assert!(Arc::ptr_eq(&shared, &again), "shared while nothing changes");
        assert_eq!(v.find_claim_ref("a/y").len(), 2);
        assert!(
            v.find_claim_ref("a/").is_empty(),
            "a prefix is not a claim ref"
        );

        let first = v.entry("z").unwrap();
        first.forms.get_or_render(Form::KubeObject, || Rendered {
            bytes: bytes::Bytes::from_static(b"old"),
            mark: 0..0,
        });
        assert!(
            v.entry("z").unwrap().forms.get(Form::KubeObject).is_some(),
            "clones share their forms"
        );
        let mut m = rec("z", "b/x");
        m.phase = Phase::Paused;
        v.apply("n1", ev(InventoryChange::Modified(m)));
        let changed = v.entry("z").unwrap();
        assert!(changed.revision > first.revision);
        let (fresh, now) = v.all_entries();
        assert!(now > at && !Arc::ptr_eq(&shared, &fresh));
        assert_eq!(
            fresh[2].revision, changed.revision,
            "the new entry is listed"
        );
        assert!(
            changed.forms.get(Form::KubeObject).is_none(),
            "a changed record is rendered afresh"
        );
        // A claim ref that changes moves the entry in the order.
        let mut moved = rec("z", "a/a");
        moved.node = "n1".into();
        v.apply("n1", ev(InventoryChange::Modified(moved)));
        assert_index_matches(&v);
        assert_eq!(v.entries(|_| true).0[0].record.id, "z");
        v.apply("n2", ev(InventoryChange::Deleted(rec("d", "c/a"))));
        assert_index_matches(&v);
        // A resync of n2 that drops "y" and adds "e".
        v.stream_lost("n2");
        v.stream_started("n2");
        v.apply("n2", ev(InventoryChange::Added(rec("e", "c/e"))));
        v.apply("n2", ev(InventoryChange::Synced));
        assert_index_matches(&v);
        v.forget("n1");
        assert_index_matches(&v);
        assert_eq!(v.len(), 1);
    }

    #[test]
    fn snapshots_settle_into_diffs_and_revisions_only_grow() {
        let v = ReadView::new();
        v.stream_started("n1");
        v.apply("n1", ev(InventoryChange::Added(rec("a", "ns/a"))));
        v.apply("n1", ev(InventoryChange::Added(rec("b", "ns/b"))));
        assert_eq!(v.len(), 0, "nothing shows before the snapshot is complete");
        v.apply("n1", ev(InventoryChange::Synced));
        assert_eq!(v.len(), 2);
        let r1 = v.revision();
        let (two, _) = v.watch(r1 - 2).unwrap();
        assert_eq!(two.len(), 2, "two changes so far");

        // A reconnect whose snapshot lost "a", kept "b" unchanged, and gained "c".
        v.stream_lost("n1");
        v.stream_started("n1");
        v.apply("n1", ev(InventoryChange::Added(rec("b", "ns/b"))));
        v.apply("n1", ev(InventoryChange::Added(rec("c", "other/c"))));
        v.apply("n1", ev(InventoryChange::Synced));
        let (events, _) = v.watch(r1).unwrap();
        let kinds: Vec<_> = events
            .iter()
            .map(|e| (e.kind, e.sandbox.id.clone()))
            .collect();
        assert_index_matches(&v);
        assert!(kinds.contains(&(ViewEventKind::Deleted, "a".into())));
        assert!(kinds.contains(&(ViewEventKind::Added, "c".into())));
        assert_eq!(kinds.len(), 2);
        assert!(events.windows(2).all(|w| w[0].revision < w[1].revision));

        let (ns, _) = v.list(|r| r.namespace() == "ns");
        assert_eq!(ns.len(), 1);
        assert_eq!(v.find_claim_ref("other/c").len(), 1);

        let mut m = rec("c", "other/c");
        m.phase = Phase::Paused;
        v.apply("n1", ev(InventoryChange::Modified(m)));
        assert_eq!(v.find_id("c").unwrap().phase, Phase::Paused);
    }

    #[test]
    fn local_changes_show_at_once_and_late_stream_events_do_not_undo_them() {
        let v = ReadView::new();
        v.stream_started("n1");
        v.apply("n1", ev(InventoryChange::Synced));
        let mut r = rec("a", "ns/a");
        r.token = "secret".into();
        v.apply_local("n1", LocalChange::Upsert(Box::new(r.clone())));
        assert_eq!(
            v.find_id("a").unwrap().token,
            "",
            "the view never holds tokens"
        );
        let later = chrono::DateTime::UNIX_EPOCH + chrono::TimeDelta::seconds(60);
        v.apply_local(
            "n1",
            LocalChange::Deadline {
                id: "a".into(),
                deadline: later,
            },
        );
        assert_eq!(v.find_id("a").unwrap().deadline, later);
        v.apply_local("n1", LocalChange::Released { id: "a".into() });
        assert!(v.find_id("a").is_none());
        // The node's stream still has to report the claim and then its release.
        v.apply("n1", ev(InventoryChange::Added(rec("a", "ns/a"))));
        assert!(
            v.find_id("a").is_none(),
            "a late ADDED does not resurrect a released sandbox"
        );
        v.apply("n1", ev(InventoryChange::Deleted(rec("a", "ns/a"))));
        v.apply("n1", ev(InventoryChange::Added(rec("a", "ns/a"))));
        assert!(
            v.find_id("a").is_some(),
            "once confirmed, the shadow is gone"
        );
        assert_index_matches(&v);
    }

    #[test]
    fn lost_nodes_leave_after_the_staleness_bound() {
        let v = ReadView::new();
        v.stream_started("n1");
        v.apply("n1", ev(InventoryChange::Added(rec("a", "ns/a"))));
        v.apply("n1", ev(InventoryChange::Synced));
        v.stream_lost("n1");
        assert!(v.sweep(Duration::from_secs(60)).is_empty());
        assert_eq!(v.len(), 1, "a lost node stays until it is stale");
        assert_eq!(v.sweep(Duration::ZERO), vec!["n1".to_string()]);
        assert_eq!(v.len(), 0);
    }

    #[test]
    fn published_snapshots_do_not_undo_newer_local_changes() {
        let v = ReadView::new();
        let t0 = Utc::now() - chrono::TimeDelta::seconds(30);
        v.replace("n1", vec![rec("a", "ns/a"), rec("b", "ns/b")], t0);
        assert_eq!(v.len(), 2);
        let before = v.revision();
        v.replace("n1", vec![rec("a", "ns/a"), rec("b", "ns/b")], t0);
        assert_eq!(
            v.revision(),
            before,
            "an unchanged snapshot announces nothing"
        );

        // This replica claims "c", pauses "a" and releases "b"; the next snapshot was taken
        // before any of that.
        v.apply_local("n1", LocalChange::Upsert(Box::new(rec("c", "ns/c"))));
        let mut paused = rec("a", "ns/a");
        paused.phase = Phase::Paused;
        v.apply_local("n1", LocalChange::Upsert(Box::new(paused)));
        v.apply_local("n1", LocalChange::Released { id: "b".into() });
        v.replace(
            "n1",
            vec![rec("a", "ns/a"), rec("b", "ns/b")],
            t0 + chrono::TimeDelta::seconds(1),
        );
        assert!(
            v.find_id("c").is_some(),
            "an older snapshot keeps a newer claim"
        );
        assert_eq!(v.find_id("a").unwrap().phase, Phase::Paused);
        assert!(v.find_id("b").is_none(), "nor brings back a release");

        // A snapshot taken after the changes is the truth again: "c" was released elsewhere.
        let mut paused = rec("a", "ns/a");
        paused.phase = Phase::Paused;
        v.replace(
            "n1",
            vec![paused],
            Utc::now() + chrono::TimeDelta::seconds(1),
        );
        assert!(v.find_id("c").is_none());
        assert_eq!(v.len(), 1);
        assert_index_matches(&v);

        v.forget("n1");
        assert!(v.is_empty());
        let (events, _) = v.watch(before).unwrap();
        assert_eq!(events.last().unwrap().kind, ViewEventKind::Deleted);
    }

    #[test]
    fn old_revisions_expire() {
        let v = ReadView::new();
        v.stream_started("n1");
        v.apply("n1", ev(InventoryChange::Synced));
        for i in 0..(HISTORY + 10) {
            v.apply("n1", ev(InventoryChange::Added(rec(&format!("s{i}"), ""))));
        }
        assert!(v.watch(1).is_err(), "older than anything remembered");
        let current = v.revision();
        assert!(v.watch(current + 1).is_err(), "a version from elsewhere");
        let (backlog, _) = v.watch(current - 3).unwrap();
        assert_eq!(backlog.len(), 3);
    }

    #[tokio::test]
    async fn a_list_waits_for_the_stream_to_reach_what_a_live_read_saw() {
        let at = |change, revision| InventoryEvent { change, revision };
        let short = Duration::from_millis(20);
        let v = Arc::new(ReadView::new());
        v.stream_started("n1");
        v.apply("n1", at(InventoryChange::Added(rec("a", "ns/a")), 4));
        v.apply("n1", at(InventoryChange::Synced, 4));
        assert!(v.caught_up(short).await, "nothing seen yet");

        // A get saw the sandbox paused at revision 5; its event is still on the wire.
        v.observed("n1", 5);
        assert!(!v.caught_up(short).await, "the view is at 4");
        let paused = SandboxRecord {
            phase: Phase::Paused,
            ..rec("a", "ns/a")
        };
        let delivery = {
            let v = v.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                v.apply("n1", at(InventoryChange::Modified(paused), 5));
            })
        };
        assert!(v.caught_up(Duration::from_secs(10)).await);
        assert_eq!(v.find_id("a").map(|r| r.phase), Some(Phase::Paused));
        delivery.await.expect("delivered");

        // A RESET holds the view until SYNCED, even past the revision seen.
        v.observed("n1", 6);
        v.apply("n1", at(InventoryChange::Reset, 6));
        v.apply("n1", at(InventoryChange::Added(rec("a", "ns/a")), 6));
        assert!(!v.caught_up(short).await, "resyncing");
        v.apply("n1", at(InventoryChange::Synced, 6));
        assert!(v.caught_up(short).await);

        // A stream that is down is not waited for, nor is a restarted node's old revision.
        v.observed("n1", 9);
        v.stream_lost("n1");
        assert!(v.caught_up(short).await, "lost streams are not waited for");
        v.stream_started("n1");
        v.apply("n1", at(InventoryChange::Synced, 1));
        assert!(
            v.caught_up(short).await,
            "the restarted node's snapshot is newer"
        );

        // Snapshot-fed nodes (cluster mode) are not waited for either.
        v.replace("n2", vec![rec("b", "ns/b")], Utc::now());
        v.observed("n2", 100);
        assert!(v.caught_up(short).await);
    }
}
