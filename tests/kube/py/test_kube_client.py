"""Scenarios that drive sandbox-gateway's Kubernetes facade (`agents.x-k8s.io/v1beta1`
sandboxes) with the official Kubernetes Python client (`kubernetes==37.0.2`, installed by
tests/e2b/setup.sh into target/e2b-sdk/py-kube).

Run against a running gateway:

    KUBECONFIG=<kubeconfig of a team-a key, namespace team-a> \
    KUBE_ADMIN_KUBECONFIG=<kubeconfig of a `*` key> \
    KUBE_NAMESPACE=team-a \
    target/e2b-sdk/py-kube/bin/python -m pytest tests/kube/py -q

(`sandbox-gateway kubeconfig --data-dir DIR --server https://ADDR --api-key KEY --namespace NS`
prints a kubeconfig.) Optional:

    KUBE_OTHER_NAMESPACE   a namespace the team-a key may not use (default team-b); the admin
                           key creates a sandbox there for the all-namespaces and 403 checks
    E2B_API_URL            the gateway's e2b API: snapshots taken here are deleted through it
                           (the facade has no route for that); without it they are left behind
    KUBE_TEST_EXPIRY=1     also run the watch-expiry test, which makes the server forget old
                           revisions by pushing ~16k pause/resume changes through it (minutes)

Every sandbox a test creates is deleted at the end of the test, whatever the outcome, and a
final sweep deletes anything still carrying this run's `suite=<run id>` label. Listings and
watches are filtered by that label, so concurrent runs against one gateway do not disturb
each other. Waits are bounded by generous timeouts and never asserted on.
"""

from __future__ import annotations

import json
import os
import re
import threading
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, Dict, List, Optional, Tuple

import pytest
import yaml
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

GROUP = "agents.x-k8s.io"
VERSION = "v1beta1"
PLURAL = "sandboxes"
API_VERSION = f"{GROUP}/{VERSION}"
GV = (GROUP, VERSION)

KUBECONFIG = os.environ.get("KUBECONFIG", "")
ADMIN_KUBECONFIG = os.environ.get("KUBE_ADMIN_KUBECONFIG", "")
NS = os.environ.get("KUBE_NAMESPACE", "team-a")
OTHER_NS = os.environ.get("KUBE_OTHER_NAMESPACE", "team-b")
E2B_API_URL = os.environ.get("E2B_API_URL", "").rstrip("/")
EXPIRY_TEST = os.environ.get("KUBE_TEST_EXPIRY", "") not in ("", "0")

PREFIX = "sandbox.cocoonstack.io/"
CLAIM_ID = PREFIX + "claim-id"
DEADLINE = PREFIX + "deadline"
ADDRESS = PREFIX + "address"
TOKEN = PREFIX + "token"
TTL = PREFIX + "ttl-seconds"
NODE_LABEL = PREFIX + "node"
PHASE_LABEL = PREFIX + "phase"
CLAIM_LABEL = PREFIX + "claim"
TEMPLATE_LABEL = PREFIX + "template"

RUN = f"kpy-{uuid.uuid4().hex[:10]}"
SUITE = f"suite={RUN}"
CLAIM_ID_RE = re.compile(r"^sb_[0-9a-f]{16}$")
CHILD_NAME_RE = re.compile(r"^sb-[0-9a-f]{16}$")
SNAPSHOT_ID_RE = re.compile(r"^ck_[0-9a-f]{16}$")

# Generous: the gateway runs on this machine, so clocks agree; these only absorb scheduling.
CLOCK_SLACK = timedelta(seconds=30)
# How long a watch may run before the server ends it; tests stop earlier once they have seen
# what they wait for, so this only bounds a failing test.
WATCH_SECONDS = 30


# ---------------------------------------------------------------------------------------------
# clients and helpers


def _client(path: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=path)


@pytest.fixture(scope="session", autouse=True)
def _env():
    missing = [
        n
        for n, v in [("KUBECONFIG", KUBECONFIG), ("KUBE_ADMIN_KUBECONFIG", ADMIN_KUBECONFIG)]
        if not v
    ]
    if missing:
        pytest.fail(f"set {', '.join(missing)} (see the module docstring)")


@pytest.fixture(scope="session")
def api_client() -> client.ApiClient:
    # load_kube_config is the documented entry point; it configures the default client.
    config.load_kube_config(config_file=KUBECONFIG)
    c = client.ApiClient()
    yield c
    c.close()


@pytest.fixture(scope="session")
def api(api_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


@pytest.fixture(scope="session")
def admin_client() -> client.ApiClient:
    c = _client(ADMIN_KUBECONFIG)
    yield c
    c.close()


@pytest.fixture(scope="session")
def admin(admin_client) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(admin_client)


@pytest.fixture(scope="session", autouse=True)
def _sweep(_env, admin):
    """After the run: nothing labelled with this run may be left."""
    yield
    left = admin.list_cluster_custom_object(*GV, PLURAL, label_selector=SUITE)["items"]
    for o in left:
        try:
            admin.delete_namespaced_custom_object(
                *GV, o["metadata"]["namespace"], PLURAL, o["metadata"]["name"]
            )
        except ApiException as e:
            if e.status != 404:
                raise
    assert not left, f"sandboxes left behind by the tests: {[name_of(o) for o in left]}"


def name_of(o: dict) -> str:
    return f"{o['metadata'].get('namespace')}/{o['metadata']['name']}"


def unique(prefix: str = "c") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def sandbox_body(
    name: Optional[str] = None,
    generate_name: Optional[str] = None,
    labels: Optional[Dict[str, str]] = None,
    annotations: Optional[Dict[str, str]] = None,
    spec: Optional[dict] = None,
    namespace: Optional[str] = None,
) -> dict:
    meta: dict = {"labels": {"suite": RUN, **(labels or {})}}
    if name:
        meta["name"] = name
    if generate_name:
        meta["generateName"] = generate_name
    if annotations:
        meta["annotations"] = annotations
    if namespace:
        meta["namespace"] = namespace
    body_spec = {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}
    body_spec.update(spec or {})
    return {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": meta, "spec": body_spec}


def status_of(e: ApiException) -> dict:
    """The Status object an error reply carries."""
    assert e.body, f"error {e.status} has no body"
    s = json.loads(e.body)
    assert s.get("kind") == "Status" and s.get("apiVersion") == "v1", s
    assert s.get("status") == "Failure", s
    assert s.get("code") == e.status, s
    return s


def expect_error(code: int, reason: str, fn: Callable, *args, **kw) -> dict:
    with pytest.raises(ApiException) as info:
        fn(*args, **kw)
    assert info.value.status == code, (
        f"want {code} {reason}, got {info.value.status}: {info.value.body}"
    )
    s = status_of(info.value)
    assert s["reason"] == reason, s
    return s


def parse_time(t: str) -> datetime:
    return datetime.fromisoformat(t.replace("Z", "+00:00"))


def now() -> datetime:
    return datetime.now(timezone.utc)


def condition(o: dict, kind: str = "Ready") -> dict:
    found = [c for c in (o.get("status") or {}).get("conditions") or [] if c.get("type") == kind]
    assert len(found) == 1, f"{name_of(o)}: want one {kind} condition: {o.get('status')}"
    return found[0]


def rv(o: dict) -> int:
    v = o["metadata"]["resourceVersion"]
    assert re.fullmatch(r"[0-9]+", v), f"resourceVersion {v!r}"
    return int(v)


def subresource(
    c: client.ApiClient, ns: str, name: str, sub: str, body: dict, query=None
) -> Tuple[int, dict]:
    """POSTs to a sandbox subresource (CustomObjectsApi has no method for these) through the
    client's own request path: kubernetes 37's ApiClient serializes with param_serialize, sends
    with call_api(method, url, headers, body) and raises ApiException from response_deserialize."""
    method, url, headers, data, post = c.param_serialize(
        method="POST",
        resource_path="/apis/{group}/{version}/namespaces/{namespace}/sandboxes/{name}/{sub}",
        path_params={"group": GROUP, "version": VERSION, "namespace": ns, "name": name, "sub": sub},
        header_params={"Accept": "application/json", "Content-Type": "application/json"},
        query_params=query,
        body=body,
        auth_settings=["BearerToken"],
    )
    res = c.call_api(
        method, url, header_params=headers, body=data, post_params=post, _request_timeout=60
    )
    res.read()
    out = c.response_deserialize(res, {"2XX": "object"})
    return out.status_code, out.data


class Made:
    """Creates sandboxes and remembers them; deletes them all (with the admin key) at teardown."""

    def __init__(self, api, admin):
        self.api = api
        self.admin = admin
        self.objects: List[Tuple[str, str]] = []
        self.snapshots: List[str] = []

    def create(self, ns: str = NS, api=None, **kw) -> dict:
        o = (api or self.api).create_namespaced_custom_object(*GV, ns, PLURAL, sandbox_body(**kw))
        self.track(ns, o["metadata"]["name"])
        return o

    def track(self, ns: str, name: str):
        self.objects.append((ns, name))

    def cleanup(self):
        errors = []
        for ns, name in reversed(self.objects):
            try:
                self.admin.delete_namespaced_custom_object(*GV, ns, PLURAL, name)
            except ApiException as e:
                if e.status != 404:
                    errors.append(f"delete {ns}/{name}: {e.status} {e.body}")
        for ck in self.snapshots:
            if not E2B_API_URL:
                continue
            key = self.api.api_client.configuration.api_key.get("BearerToken", "").removeprefix(
                "Bearer "
            )
            req = urllib.request.Request(
                f"{E2B_API_URL}/templates/{ck}", method="DELETE", headers={"X-API-Key": key}
            )
            try:
                urllib.request.urlopen(req, timeout=30).close()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(f"delete snapshot {ck}: {e!r}")
        assert not errors, errors


@pytest.fixture
def made(api, admin):
    m = Made(api, admin)
    yield m
    m.cleanup()


def list_ns(api, ns: str = NS, **kw) -> dict:
    return api.list_namespaced_custom_object(*GV, ns, PLURAL, **kw)


def create(api, body: dict, ns: str = NS, **kw) -> dict:
    return api.create_namespaced_custom_object(*GV, ns, PLURAL, body, **kw)


def get(api, name: str, ns: str = NS) -> dict:
    return api.get_namespaced_custom_object(*GV, ns, PLURAL, name)


def delete(api, name: str, ns: str = NS, **kw) -> dict:
    return api.delete_namespaced_custom_object(*GV, ns, PLURAL, name, **kw)


def names(listing: dict) -> List[str]:
    return [o["metadata"]["name"] for o in listing["items"]]


def watch_until(
    fn: Callable, *args, until: Callable[[List[Tuple[str, dict]]], bool], on_event=None, **kw
):
    """Events (type, raw object) of one watch, until `until(events)` holds or the server ends
    the stream after WATCH_SECONDS."""
    w = watch.Watch()
    events: List[Tuple[str, dict]] = []
    for ev in w.stream(
        fn, *args, timeout_seconds=WATCH_SECONDS, _request_timeout=WATCH_SECONDS + 30, **kw
    ):
        events.append((ev["type"], ev["raw_object"]))
        if on_event:
            on_event(ev["type"], ev["raw_object"])
        if until(events):
            w.stop()
            break
    return events


def watch_ns(api, ns: str = NS, **kw) -> List[Tuple[str, dict]]:
    return watch_until(api.list_namespaced_custom_object, *GV, ns, PLURAL, **kw)


def seen(events, kind: str, name: str) -> int:
    return sum(1 for t, o in events if t == kind and o["metadata"]["name"] == name)


# ---------------------------------------------------------------------------------------------
# discovery and authentication


def test_api_resources(api_client):
    resources = client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
    assert resources.group_version == API_VERSION
    by_name = {r.name: r for r in resources.resources}
    assert by_name["sandboxes"].kind == "Sandbox" and by_name["sandboxes"].namespaced
    assert {"create", "delete", "get", "list", "watch"} <= set(by_name["sandboxes"].verbs)
    for sub in ("pause", "resume", "fork", "snapshot"):
        assert f"sandboxes/{sub}" in by_name, sorted(by_name)


def test_group_discovery(api_client):
    # ApisApi asks for `/apis/` (with the slash), which kube-apiserver serves like `/apis`.
    groups = client.ApisApi(api_client).get_api_versions()
    g = [g for g in groups.groups if g.name == GROUP]
    assert g and g[0].preferred_version.group_version == API_VERSION


def test_core_and_version_discovery(api_client):
    # CoreApi asks for `/api/` and VersionApi for `/version/`, as kube-apiserver serves them.
    assert client.CoreApi(api_client).get_api_versions().versions is not None
    assert client.VersionApi(api_client).get_code().major


def test_a_bad_token_is_unauthorized(tmp_path):
    # The kubeconfig loader re-applies its token before every request, so the bad token goes
    # into a kubeconfig of its own.
    kc = yaml.safe_load(open(KUBECONFIG))
    for u in kc["users"]:
        u["user"]["token"] = "e2b_" + "0" * 40
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kc))
    c = _client(str(path))
    try:
        expect_error(401, "Unauthorized", list_ns, client.CustomObjectsApi(c))
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------
# create, get, delete


def test_create_claims_a_sandbox_and_get_reads_it(api, made):
    name = unique("create")
    t0 = now()
    o = made.create(name=name, labels={"app": "web"}, annotations={TTL: "120"})
    m = o["metadata"]
    assert o["apiVersion"] == API_VERSION and o["kind"] == "Sandbox"
    assert m["name"] == name and m["namespace"] == NS
    assert m["uid"] and m["creationTimestamp"] and rv(o) > 0
    assert m["labels"]["app"] == "web" and m["labels"]["suite"] == RUN
    # The reply echoes the submitted spec.
    assert o["spec"] == sandbox_body()["spec"]
    a = m["annotations"]
    assert CLAIM_ID_RE.match(a[CLAIM_ID]), a
    assert a[ADDRESS] and a[TOKEN], a
    assert a[TTL] == "120"
    deadline = parse_time(a[DEADLINE])
    assert (
        t0 + timedelta(seconds=120) - CLOCK_SLACK
        <= deadline
        <= now() + timedelta(seconds=120) + CLOCK_SLACK
    )
    assert o["status"]["nodeName"]
    assert condition(o)["status"] == "True"

    g = get(api, name)
    gm = g["metadata"]
    assert g["apiVersion"] == API_VERSION and g["kind"] == "Sandbox"
    assert gm["name"] == name and gm["namespace"] == NS and gm["uid"] == m["uid"]
    assert gm["annotations"][CLAIM_ID] == a[CLAIM_ID]
    assert parse_time(gm["annotations"][DEADLINE]) == deadline
    labels = gm["labels"]
    assert labels["app"] == "web" and labels["suite"] == RUN
    assert labels[NODE_LABEL] == o["status"]["nodeName"]
    assert labels[PHASE_LABEL] == "Running"
    assert labels[CLAIM_LABEL] == name
    assert labels[TEMPLATE_LABEL] == "base"
    assert g["status"]["nodeName"] == o["status"]["nodeName"]
    assert condition(g)["status"] == "True"
    # A read does not hand out the sandbox's access token.
    assert TOKEN not in gm["annotations"]


def test_generate_name(made):
    o = made.create(generate_name="gen-")
    n = o["metadata"]["name"]
    assert n.startswith("gen-") and len(n) > len("gen-"), n


def test_shutdown_time_sets_the_deadline(api, made):
    at = (now() + timedelta(seconds=200)).replace(microsecond=0)
    o = made.create(
        name=unique("shut"), spec={"shutdownTime": at.isoformat().replace("+00:00", "Z")}
    )
    # The lease is counted in whole seconds from when the node claims the sandbox, so the
    # deadline is the requested time or a little after it, never before.
    deadline = parse_time(o["metadata"]["annotations"][DEADLINE])
    assert at - timedelta(seconds=1) <= deadline <= at + CLOCK_SLACK, (deadline, at)
    g = get(api, o["metadata"]["name"])
    assert parse_time(g["metadata"]["annotations"][DEADLINE]) == deadline


@pytest.mark.parametrize(
    "why,kw",
    [
        ("past shutdownTime", {"spec": {"shutdownTime": "2000-01-01T00:00:00Z"}}),
        ("malformed shutdownTime", {"spec": {"shutdownTime": "tomorrow"}}),
        ("malformed ttl", {"annotations": {TTL: "soon"}}),
        ("negative ttl", {"annotations": {TTL: "-5"}}),
    ],
)
def test_a_bad_lease_is_refused_and_claims_nothing(api, made, why, kw):
    case = unique("lease")
    expect_error(
        400, "BadRequest", create, api, sandbox_body(name=case, labels={"case": case}, **kw)
    )
    assert list_ns(api, label_selector=f"{SUITE},case={case}")["items"] == []
    expect_error(404, "NotFound", get, api, case)


def test_invalid_objects_are_refused(api):
    expect_error(
        400, "BadRequest", create, api, sandbox_body(name=unique("ns"), namespace=OTHER_NS)
    )
    expect_error(422, "Invalid", create, api, sandbox_body(name="Not_A_DNS_Name"))
    expect_error(422, "Invalid", create, api, sandbox_body())
    wrong_kind = sandbox_body(name=unique("kind"))
    wrong_kind["kind"] = "Pod"
    expect_error(400, "BadRequest", create, api, wrong_kind)


def test_a_repeated_create_claims_a_second_sandbox(api, made):
    """Create is a claim, not an upsert (the lifecycle contract): the same name twice is two
    sandboxes, each with its own claim id; callers that may repeat a create use generateName."""
    name = unique("dup")
    first = made.create(name=name)
    second = made.create(name=name)
    ids = {o["metadata"]["annotations"][CLAIM_ID] for o in (first, second)}
    assert len(ids) == 2, ids
    listed = list_ns(api, field_selector=f"metadata.name={name}")
    assert {o["metadata"]["annotations"][CLAIM_ID] for o in listed["items"]} == ids
    assert names(listed) == [name, name]


def test_delete_returns_the_object_and_it_is_gone(api, made):
    name = unique("del")
    o = made.create(name=name)
    d = delete(api, name)
    assert d["kind"] == "Sandbox" and d["metadata"]["name"] == name
    assert d["metadata"]["uid"] == o["metadata"]["uid"]
    assert d["metadata"]["annotations"][CLAIM_ID] == o["metadata"]["annotations"][CLAIM_ID]
    s = expect_error(404, "NotFound", get, api, name)
    assert s["details"]["name"] == name and s["details"]["group"] == GROUP, s
    expect_error(404, "NotFound", delete, api, name)
    assert name not in names(list_ns(api, label_selector=SUITE))


def test_delete_checks_the_uid_precondition(api, made):
    name = unique("pre")
    o = made.create(name=name)
    wrong = client.V1DeleteOptions(
        preconditions=client.V1Preconditions(uid="00000000-0000-0000-0000-000000000000")
    )
    expect_error(409, "Conflict", delete, api, name, body=wrong)
    get(api, name)
    right = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=o["metadata"]["uid"]))
    delete(api, name, body=right)
    expect_error(404, "NotFound", get, api, name)


def test_dry_run_is_refused_and_changes_nothing(api, made):
    case = unique("dry")
    expect_error(
        400,
        "BadRequest",
        create,
        api,
        sandbox_body(name=case, labels={"case": case}),
        dry_run="All",
    )
    assert list_ns(api, label_selector=f"{SUITE},case={case}")["items"] == []
    expect_error(404, "NotFound", get, api, case)

    made.create(name=case, labels={"case": case})
    expect_error(400, "BadRequest", delete, api, case, dry_run="All")
    expect_error(400, "BadRequest", delete, api, case, body=client.V1DeleteOptions(dry_run=["All"]))
    g = get(api, case)
    assert condition(g)["status"] == "True"


def test_missing_objects_are_not_found(api, api_client):
    name = unique("missing")
    expect_error(404, "NotFound", get, api, name)
    expect_error(404, "NotFound", delete, api, name)
    expect_error(404, "NotFound", subresource, api_client, NS, name, "pause", {})


# ---------------------------------------------------------------------------------------------
# namespaces and permissions


@pytest.fixture
def other_ns_sandbox(made, admin) -> dict:
    """A sandbox in the namespace the team-a key may not use, made with the admin key."""
    return made.create(ns=OTHER_NS, api=admin, name=unique("other"), labels={"where": "other"})


def test_other_namespaces_are_forbidden(api, api_client, made, admin, other_ns_sandbox):
    name = other_ns_sandbox["metadata"]["name"]
    case = unique("forbid")
    s = expect_error(403, "Forbidden", list_ns, api, OTHER_NS)
    assert OTHER_NS in s["message"], s
    expect_error(403, "Forbidden", get, api, name, ns=OTHER_NS)
    expect_error(
        403, "Forbidden", create, api, sandbox_body(name=case, labels={"case": case}), ns=OTHER_NS
    )
    expect_error(403, "Forbidden", delete, api, name, ns=OTHER_NS)
    for sub, body in [
        ("pause", {}),
        ("resume", {}),
        ("fork", {"count": 1}),
        ("snapshot", {"name": "x"}),
    ]:
        expect_error(403, "Forbidden", subresource, api_client, OTHER_NS, name, sub, body)
    with pytest.raises(ApiException) as info:
        watch_ns(api, OTHER_NS, until=lambda _: True)
    assert info.value.status == 403
    expect_error(403, "Forbidden", api.list_cluster_custom_object, *GV, PLURAL)
    # Nothing happened there: the admin still sees the sandbox as it was, and no new one.
    g = get(admin, name, OTHER_NS)
    assert condition(g)["status"] == "True"
    assert list_ns(admin, OTHER_NS, label_selector=f"{SUITE},case={case}")["items"] == []


def test_admin_lists_all_namespaces(admin, made, other_ns_sandbox):
    mine = made.create(name=unique("mine"))
    listing = admin.list_cluster_custom_object(*GV, PLURAL, label_selector=SUITE)
    assert listing["kind"] == "SandboxList" and listing["apiVersion"] == API_VERSION
    got = {name_of(o) for o in listing["items"]}
    assert name_of(mine) in got and name_of(other_ns_sandbox) in got, got
    only_other = admin.list_cluster_custom_object(
        *GV, PLURAL, label_selector=SUITE, field_selector=f"metadata.namespace={OTHER_NS}"
    )
    assert {o["metadata"]["namespace"] for o in only_other["items"]} == {OTHER_NS}
    assert name_of(other_ns_sandbox) in {name_of(o) for o in only_other["items"]}


# ---------------------------------------------------------------------------------------------
# list: selectors, pagination, resource versions


def test_list_shows_objects_with_annotations_labels_and_conditions(api, made):
    case = unique("list")
    a = made.create(name=f"{case}-a", labels={"case": case})
    b = made.create(name=f"{case}-b", labels={"case": case})
    listing = list_ns(api, label_selector=f"{SUITE},case={case}")
    assert listing["kind"] == "SandboxList" and listing["apiVersion"] == API_VERSION
    assert sorted(names(listing)) == sorted([a["metadata"]["name"], b["metadata"]["name"]])
    created = {o["metadata"]["name"]: o for o in (a, b)}
    for o in listing["items"]:
        m = o["metadata"]
        assert o["kind"] == "Sandbox" and o["apiVersion"] == API_VERSION
        assert m["namespace"] == NS
        assert m["annotations"][CLAIM_ID] == created[m["name"]]["metadata"]["annotations"][CLAIM_ID]
        assert parse_time(m["annotations"][DEADLINE]) > now()
        assert m["labels"]["case"] == case and m["labels"][PHASE_LABEL] == "Running"
        assert m["labels"][NODE_LABEL] == o["status"]["nodeName"]
        assert m["labels"][CLAIM_LABEL] == m["name"] and m["labels"][TEMPLATE_LABEL] == "base"
        assert condition(o)["status"] == "True"
        assert rv(o) <= int(listing["metadata"]["resourceVersion"])


def test_resource_versions_only_grow(api, made):
    before = int(list_ns(api)["metadata"]["resourceVersion"])
    o = made.create(name=unique("rv"))
    assert rv(o) > before
    after = int(list_ns(api)["metadata"]["resourceVersion"])
    assert after >= rv(o)
    delete(api, o["metadata"]["name"])
    assert int(list_ns(api)["metadata"]["resourceVersion"]) > after


def test_label_selectors(api, made):
    case = unique("sel")
    web = made.create(name=f"{case}-web", labels={"case": case, "app": "web", "tier": "a"})
    db = made.create(name=f"{case}-db", labels={"case": case, "app": "db"})
    w, d = web["metadata"]["name"], db["metadata"]["name"]

    def sel(s: str) -> List[str]:
        return sorted(names(list_ns(api, label_selector=f"{SUITE},case={case},{s}")))

    assert sel("app=web") == [w]
    assert sel("app==db") == [d]
    assert sel("app!=web") == [d]
    assert sel("app in (web,db)") == sorted([w, d])
    assert sel("app notin (web)") == [d]
    assert sel("tier") == [w]
    assert sel("!tier") == [d]
    assert sel("app=nothing") == []
    # The system labels select as well.
    assert sel(f"{CLAIM_LABEL}={w}") == [w]
    assert sel(f"{PHASE_LABEL}=Running") == sorted([w, d])
    assert sel(f"{TEMPLATE_LABEL}=base") == sorted([w, d])
    expect_error(400, "BadRequest", list_ns, api, label_selector="app in web")


def test_field_selectors(api, made):
    case = unique("fld")
    a = made.create(name=f"{case}-a", labels={"case": case})
    b = made.create(name=f"{case}-b", labels={"case": case})
    an, bn = a["metadata"]["name"], b["metadata"]["name"]
    node = a["status"]["nodeName"]
    sel = f"{SUITE},case={case}"

    def fs(f: str, labels: str = sel) -> List[str]:
        return sorted(names(list_ns(api, label_selector=labels, field_selector=f)))

    assert fs(f"metadata.name={an}") == [an]
    assert fs(f"metadata.name={an}", labels="") == [an]
    assert fs(f"metadata.name!={an}") == [bn]
    assert fs(f"metadata.namespace={NS}") == sorted([an, bn])
    assert fs(f"metadata.namespace={OTHER_NS}") == []
    assert an in fs(f"status.nodeName={node}")
    assert fs(f"status.nodeName={node},metadata.name={an}") == [an]
    assert an not in fs(f"status.nodeName!={node}")
    assert fs("status.nodeName=no-such-node") == []
    assert fs(f"metadata.name={unique('none')}", labels="") == []
    for bad in ["spec.shutdownTime=x", "metadata.labels=x", "metadata.name"]:
        expect_error(400, "BadRequest", list_ns, api, field_selector=bad)


def test_pagination_is_a_consistent_snapshot(api, made):
    case = unique("page")
    sel = f"{SUITE},case={case}"
    made_names = sorted(
        made.create(name=f"{case}-{i}", labels={"case": case})["metadata"]["name"] for i in range(5)
    )

    first = list_ns(api, label_selector=sel, limit=2)
    assert len(first["items"]) == 2
    token = first["metadata"].get("continue")
    assert token, first["metadata"]
    assert first["metadata"].get("remainingItemCount") == 3, first["metadata"]
    list_rv = first["metadata"]["resourceVersion"]

    # Change the set between pages: the pages still show the list as it was.
    made.create(name=f"{case}-9", labels={"case": case})
    gone = made_names[-1]
    delete(api, gone)

    pages = [first]
    while token:
        page = list_ns(api, label_selector=sel, limit=2, _continue=token)
        assert page["metadata"]["resourceVersion"] == list_rv, page["metadata"]
        assert len(page["items"]) <= 2
        pages.append(page)
        token = page["metadata"].get("continue")
        assert len(pages) <= 10, "pagination never ends"
    got = [n for p in pages for n in names(p)]
    assert got == made_names, got
    assert (
        "remainingItemCount" not in pages[-1]["metadata"]
        or pages[-1]["metadata"]["remainingItemCount"] == 0
    )

    # A fresh list sees the changes.
    fresh = sorted(names(list_ns(api, label_selector=sel)))
    assert fresh == sorted([n for n in made_names if n != gone] + [f"{case}-9"])
    # An unknown continue token is 410 Expired: the client must list again.
    expect_error(410, "Expired", list_ns, api, label_selector=sel, limit=2, _continue="bm9wZTow")


# ---------------------------------------------------------------------------------------------
# watch


def test_watch_sees_a_create_once_as_added(api, made):
    """A watch started without a resourceVersion first reports what exists (ADDED), then what
    changes: a sandbox created from another thread while the watch runs arrives exactly once,
    as ADDED."""
    case = unique("watch")
    sel = f"{SUITE},case={case}"
    existing = made.create(name=f"{case}-0", labels={"case": case})["metadata"]["name"]
    x, y = f"{case}-x", f"{case}-y"
    errors: List[BaseException] = []
    started = threading.Event()

    def create_x_then_y():
        try:
            made.create(name=x, labels={"case": case})
            # y is claimed after x's claim returned, so its ADDED comes after x's: once y is
            # seen, every event about x has been delivered.
            made.create(name=y, labels={"case": case})
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    creator = threading.Thread(target=create_x_then_y, daemon=True)

    def on_event(kind: str, o: dict):
        # The initial ADDED of the existing sandbox shows the watch is established.
        if kind == "ADDED" and o["metadata"]["name"] == existing and not started.is_set():
            started.set()
            creator.start()

    events = watch_ns(
        api,
        label_selector=sel,
        until=lambda evs: seen(evs, "ADDED", y) > 0 or bool(errors),
        on_event=on_event,
    )
    if started.is_set():
        creator.join(60)
    assert not errors, errors
    assert started.is_set(), (
        f"no initial ADDED for {existing}: {[(t, o['metadata']['name']) for t, o in events]}"
    )
    assert events[0][0] == "ADDED" and events[0][1]["metadata"]["name"] == existing
    assert seen(events, "ADDED", existing) == 1
    assert seen(events, "ADDED", x) == 1, [(t, o["metadata"]["name"]) for t, o in events]
    assert seen(events, "ADDED", y) == 1
    for _, o in events:
        assert o["kind"] == "Sandbox" and o["apiVersion"] == API_VERSION
        assert o["metadata"]["labels"]["case"] == case
        assert CLAIM_ID_RE.match(o["metadata"]["annotations"][CLAIM_ID])
    # Resource versions along the stream only grow once past the initial state.
    changes = [rv(o) for _, o in events[1:]]
    assert changes == sorted(changes), changes


def test_watch_resumes_from_a_resource_version(api, made):
    case = unique("resume")
    sel = f"{SUITE},case={case}"
    a = made.create(name=f"{case}-a", labels={"case": case})["metadata"]["name"]
    after_a = list_ns(api, label_selector=sel)["metadata"]["resourceVersion"]
    b = made.create(name=f"{case}-b", labels={"case": case})["metadata"]["name"]
    delete(api, a)

    # From after a's creation: b's ADDED, then a's DELETED, and no ADDED for a.
    events = watch_ns(
        api,
        label_selector=sel,
        resource_version=after_a,
        until=lambda evs: seen(evs, "DELETED", a) > 0,
    )
    got = [(t, o["metadata"]["name"]) for t, o in events]
    assert ("ADDED", b) in got and got[-1] == ("DELETED", a), got
    assert seen(events, "ADDED", a) == 0, got
    assert got.index(("ADDED", b)) < got.index(("DELETED", a)), got
    assert all(int(after_a) < rv(o) for _, o in events), got

    # "0" means "any": the current state, as ADDED.
    events = watch_ns(
        api, label_selector=sel, resource_version="0", until=lambda evs: seen(evs, "ADDED", b) > 0
    )
    got = [(t, o["metadata"]["name"]) for t, o in events]
    assert got == [("ADDED", b)], got

    # From the list's own version after everything: only later changes (b's deletion).
    latest = list_ns(api, label_selector=sel)["metadata"]["resourceVersion"]
    delete(api, b)
    events = watch_ns(
        api,
        label_selector=sel,
        resource_version=latest,
        until=lambda evs: seen(evs, "DELETED", b) > 0,
    )
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("DELETED", b)]


def test_watch_reports_pause_resume_and_delete(api, api_client, made):
    case = unique("life")
    sel = f"{SUITE},case={case}"
    start = list_ns(api, label_selector=sel)["metadata"]["resourceVersion"]
    created = made.create(name=case, labels={"case": case})
    name = created["metadata"]["name"]
    assert subresource(api_client, NS, name, "pause", {})[0] == 201
    assert subresource(api_client, NS, name, "resume", {})[0] == 201
    delete(api, name)

    events = watch_ns(
        api,
        label_selector=sel,
        resource_version=start,
        until=lambda evs: seen(evs, "DELETED", name) > 0,
    )
    kinds = [t for t, _ in events]
    assert kinds[0] == "ADDED" and kinds[-1] == "DELETED" and kinds.count("ADDED") == 1, kinds
    # The ADDED event is the object as the create reply showed it.
    assert rv(events[0][1]) == rv(created)
    assert events[0][1]["metadata"]["uid"] == created["metadata"]["uid"]
    ready = [
        (t, condition(o)["status"], condition(o)["reason"]) for t, o in events if t == "MODIFIED"
    ]
    paused = [i for i, (_, s, r) in enumerate(ready) if s == "False" and r == "SandboxSuspended"]
    resumed = [i for i, (_, s, _) in enumerate(ready) if s == "True"]
    assert paused and resumed and paused[0] < resumed[-1], ready
    revisions = [rv(o) for _, o in events]
    assert revisions == sorted(revisions) and len(set(revisions)) == len(revisions), revisions


def test_watch_with_a_selector_sees_objects_enter_and_leave_it(api, api_client, made):
    """With a label selector, Kubernetes reports an object that comes to match as ADDED and one
    that stops matching as DELETED (client-go's caches depend on it). Pausing a sandbox moves it
    from `phase=Running` to `phase=Paused`."""
    case = unique("phase")
    base = f"{SUITE},case={case}"
    start = list_ns(api, label_selector=base)["metadata"]["resourceVersion"]
    x = made.create(name=f"{case}-x", labels={"case": case})["metadata"]["name"]
    subresource(api_client, NS, x, "pause", {})
    delete(api, x)
    # A sentinel changed after everything about x: once a watch reports it, it has reported x.
    s = made.create(name=f"{case}-s", labels={"case": case})["metadata"]["name"]
    subresource(api_client, NS, s, "pause", {})

    def watch_phase(phase: str):
        evs = watch_ns(
            api,
            label_selector=f"{base},{PHASE_LABEL}={phase}",
            resource_version=start,
            until=lambda evs: any(o["metadata"]["name"] == s for _, o in evs),
        )
        return (
            [t for t, o in evs if o["metadata"]["name"] == x],
            [t for t, o in evs if o["metadata"]["name"] == s][:1],
        )

    # Running: x appears, then leaves the selection when paused; the sentinel appears.
    running = watch_phase("Running")
    # Paused: x enters the selection when paused, then is deleted; the sentinel enters.
    paused = watch_phase("Paused")
    want = ((["ADDED", "DELETED"], ["ADDED"]), (["ADDED", "DELETED"], ["ADDED"]))
    assert (running, paused) == want, (
        f"(x, sentinel) event types: running {running}, paused {paused}"
    )


def test_watch_timeout_ends_the_stream(api):
    sel = f"{SUITE},case={unique('quiet')}"
    w = watch.Watch()
    started = now()
    events = list(
        w.stream(
            api.list_namespaced_custom_object,
            *GV,
            NS,
            PLURAL,
            label_selector=sel,
            timeout_seconds=1,
            _request_timeout=120,
        )
    )
    assert events == []
    assert now() - started < timedelta(seconds=100)


def test_admin_watches_all_namespaces(admin, made, other_ns_sandbox):
    sel = f"{SUITE},where=other"
    events = watch_until(
        admin.list_cluster_custom_object,
        *GV,
        PLURAL,
        label_selector=sel,
        until=lambda evs: any(
            o["metadata"]["name"] == other_ns_sandbox["metadata"]["name"] for _, o in evs
        ),
    )
    assert ("ADDED", name_of(other_ns_sandbox)) in [(t, name_of(o)) for t, o in events]


def test_a_pinned_name_watch_starts_from_the_object(api, made):
    name = made.create(name=unique("pin"))["metadata"]["name"]
    events = watch_ns(api, field_selector=f"metadata.name={name}", until=lambda evs: len(evs) >= 1)
    assert [(t, o["metadata"]["name"]) for t, o in events] == [("ADDED", name)]


@pytest.mark.skipif(
    not EXPIRY_TEST, reason="set KUBE_TEST_EXPIRY=1: pushes ~16k changes through the server"
)
def test_watch_from_a_forgotten_version_is_410_gone(api, api_client, made):
    case = unique("old")
    sel = f"{SUITE},case={case}"
    targets = [
        made.create(name=f"{case}-{i}", labels={"case": case})["metadata"]["name"] for i in range(4)
    ]
    old = list_ns(api, label_selector=sel)["metadata"]["resourceVersion"]
    # The server remembers the last 16384 changes; each pause or resume is one. Push past that
    # from a few threads, each flipping its own sandbox.
    per_target = (16384 + 64) // len(targets) + 1
    errors: List[BaseException] = []

    def flip(name: str):
        try:
            for i in range(per_target):
                subresource(api_client, NS, name, "pause" if i % 2 == 0 else "resume", {})
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            errors.append(e)

    threads = [threading.Thread(target=flip, args=(n,), daemon=True) for n in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    assert not errors, errors[:3]
    assert int(list_ns(api, label_selector=sel)["metadata"]["resourceVersion"]) - int(old) > 16384
    # The Watch helper raises the ERROR event's Status as an ApiException (it does not retry
    # when timeout_seconds is given).
    with pytest.raises(ApiException) as info:
        watch_ns(api, label_selector=sel, resource_version=old, until=lambda _: True)
    assert info.value.status == 410, info.value
    assert str(info.value.reason).startswith("Expired"), info.value.reason
    # A fresh list and a watch from its version work again.
    latest = list_ns(api, label_selector=sel)
    assert sorted(names(latest)) == sorted(targets)


# ---------------------------------------------------------------------------------------------
# subresources


def test_pause_and_resume(api, api_client, made):
    created = made.create(name=unique("pause"))
    name = created["metadata"]["name"]
    code, reply = subresource(api_client, NS, name, "pause", {})
    assert (
        code == 201
        and reply["kind"] == "SandboxPauseOptions"
        and reply["apiVersion"] == API_VERSION
    ), reply
    g = get(api, name)
    c = condition(g)
    assert (c["status"], c["reason"]) == ("False", "SandboxSuspended"), c
    assert g["metadata"]["labels"][PHASE_LABEL] == "Paused"
    assert g["spec"]["operatingMode"] == "Suspended"
    assert rv(g) > rv(created)
    assert name in names(list_ns(api, label_selector=f"{SUITE},{PHASE_LABEL}=Paused"))

    code, reply = subresource(api_client, NS, name, "resume", {"kind": "SandboxResumeOptions"})
    assert code == 201 and reply["kind"] == "SandboxResumeOptions", reply
    g = get(api, name)
    assert condition(g)["status"] == "True"
    assert g["metadata"]["labels"][PHASE_LABEL] == "Running"


def test_fork(api, api_client, made):
    parent = made.create(name=unique("fork"))
    pname = parent["metadata"]["name"]
    t0 = now()
    code, reply = subresource(api_client, NS, pname, "fork", {"count": 2, "ttlSeconds": 60})
    assert (
        code == 201 and reply["kind"] == "SandboxForkResult" and reply["apiVersion"] == API_VERSION
    ), reply
    children = reply["children"]
    for c in children:
        if CLAIM_ID_RE.match(c.get("sandboxID", "")):
            made.track(NS, c["sandboxID"].replace("_", "-"))
    assert len(children) == 2, reply
    ids = [c["sandboxID"] for c in children]
    assert len(set(ids)) == 2 and all(CLAIM_ID_RE.match(i) for i in ids), ids
    for c in children:
        assert c["nodeName"] and c["address"] and c["token"], c
        child = c["sandboxID"].replace("_", "-")
        assert CHILD_NAME_RE.match(child)
        # Readable at once, by its DNS-safe name, in the parent's namespace.
        g = get(api, child)
        assert g["metadata"]["name"] == child and g["metadata"]["namespace"] == NS
        assert g["metadata"]["annotations"][CLAIM_ID] == c["sandboxID"]
        assert g["status"]["nodeName"] == c["nodeName"]
        assert condition(g)["status"] == "True"
        deadline = parse_time(g["metadata"]["annotations"][DEADLINE])
        assert (
            t0 + timedelta(seconds=60) - CLOCK_SLACK
            <= deadline
            <= now() + timedelta(seconds=60) + CLOCK_SLACK
        )
        assert child in names(list_ns(api, field_selector=f"metadata.name={child}"))
    # The parent goes on.
    assert condition(get(api, pname))["status"] == "True"
    for c in children:
        child = c["sandboxID"].replace("_", "-")
        d = delete(api, child)
        assert d["metadata"]["name"] == child
        expect_error(404, "NotFound", get, api, child)


def test_snapshot(api_client, made):
    src = made.create(name=unique("snap"))
    name = f"{RUN}-snap"
    t0 = now().replace(microsecond=0)
    code, reply = subresource(api_client, NS, src["metadata"]["name"], "snapshot", {"name": name})
    if SNAPSHOT_ID_RE.match(str(reply.get("snapshotID", ""))):
        made.snapshots.append(reply["snapshotID"])
    assert (
        code == 201
        and reply["kind"] == "SandboxSnapshotResult"
        and reply["apiVersion"] == API_VERSION
    ), reply
    assert SNAPSHOT_ID_RE.match(reply["snapshotID"]), reply
    assert reply["name"] == name and reply["nodeName"] == src["status"]["nodeName"], reply
    created = parse_time(reply["creationTimestamp"])
    assert t0 - CLOCK_SLACK <= created <= now() + CLOCK_SLACK


def test_subresource_errors(api, api_client, made):
    name = made.create(name=unique("suberr"))["metadata"]["name"]
    expect_error(404, "NotFound", subresource, api_client, NS, name, "explode", {})
    expect_error(
        400,
        "BadRequest",
        subresource,
        api_client,
        NS,
        name,
        "pause",
        {"kind": "SandboxForkOptions"},
    )
    expect_error(400, "BadRequest", subresource, api_client, NS, name, "fork", {"count": -1})
    expect_error(
        400, "BadRequest", subresource, api_client, NS, name, "snapshot", {"name": "x" * 80}
    )
    # Server-side dry run is refused on the verbs too, and the sandbox is left running.
    expect_error(
        400, "BadRequest", subresource, api_client, NS, name, "pause", {}, [("dryRun", "All")]
    )
    assert condition(get(api, name))["status"] == "True"
