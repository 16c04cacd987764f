"""PATCH, server-side apply and PUT on sandbox-gateway's `agents.x-k8s.io/v1beta1` sandboxes
with the official Kubernetes Python client (`kubernetes==37.0.2`, installed by
tests/e2b/setup.sh into target/e2b-sdk/py-kube). tests/kube_patch.rs runs it against a
gateway it starts; by hand:

    KUBECONFIG=<kubeconfig of a team-a key, namespace team-a> \
    KUBE_ADMIN_KUBECONFIG=<kubeconfig of a `*` key> \
    KUBE_NAMESPACE=team-a KUBE_OTHER_NAMESPACE=team-b \
    target/e2b-sdk/py-kube/bin/python -m pytest tests/kube/py-patch -q

Every sandbox a test creates carries this run's `suite=<run id>` label and is deleted at the
end of the test; listings and watches are filtered by that label.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from datetime import datetime, timedelta, timezone
from typing import Callable, List, Tuple

import pytest
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

DEADLINE = "sandbox.cocoonstack.io/deadline"
PHASE_LABEL = "sandbox.cocoonstack.io/phase"
RUN = f"kpatch-{uuid.uuid4().hex[:10]}"
SUITE = f"suite={RUN}"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"
WATCH_SECONDS = 30


@pytest.fixture(scope="session")
def api() -> client.CustomObjectsApi:
    if not KUBECONFIG or not ADMIN_KUBECONFIG:
        pytest.fail("set KUBECONFIG and KUBE_ADMIN_KUBECONFIG (see the module docstring)")
    c = config.new_client_from_config(config_file=KUBECONFIG)
    yield client.CustomObjectsApi(c)
    c.close()


@pytest.fixture(scope="session")
def admin() -> client.CustomObjectsApi:
    c = config.new_client_from_config(config_file=ADMIN_KUBECONFIG)
    yield client.CustomObjectsApi(c)
    c.close()


class Made:
    """Sandboxes a test created, deleted (with the admin key) when it ends."""

    def __init__(self, api, admin):
        self.api, self.admin, self.names = api, admin, []

    def create(self, name: str, labels=None, annotations=None, spec=None) -> dict:
        o = self.api.create_namespaced_custom_object(
            *GV, NS, PLURAL, body(name, labels, annotations, spec)
        )
        self.names.append(o["metadata"]["name"])
        return o

    def cleanup(self):
        for name in self.names:
            try:
                self.admin.delete_namespaced_custom_object(*GV, NS, PLURAL, name)
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def made(api, admin):
    m = Made(api, admin)
    yield m
    m.cleanup()


def body(name, labels=None, annotations=None, spec=None) -> dict:
    meta = {"name": name, "labels": {"suite": RUN, **(labels or {})}}
    if annotations:
        meta["annotations"] = annotations
    s = {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "base"}]}}}
    s.update(spec or {})
    return {"apiVersion": API_VERSION, "kind": "Sandbox", "metadata": meta, "spec": s}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def get(api, name: str) -> dict:
    return api.get_namespaced_custom_object(*GV, NS, PLURAL, name)


def patch(api, name: str, patch_body, content_type: str = MERGE, ns: str = NS, **kw) -> dict:
    return api.patch_namespaced_custom_object(
        *GV, ns, PLURAL, name, patch_body, _content_type=content_type, **kw
    )


def rv(o: dict) -> int:
    return int(o["metadata"]["resourceVersion"])


def ready(o: dict) -> Tuple[str, str]:
    c = [c for c in o["status"]["conditions"] if c["type"] == "Ready"][0]
    return c["status"], c["reason"]


def parse_time(t: str) -> datetime:
    return datetime.fromisoformat(t.replace("Z", "+00:00"))


def in_minutes(m: int) -> str:
    t = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=m)
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def expect_error(code: int, reason: str, fn: Callable, *args, **kw) -> dict:
    with pytest.raises(ApiException) as info:
        fn(*args, **kw)
    assert info.value.status == code, f"want {code}, got {info.value.status}: {info.value.body}"
    s = json.loads(info.value.body)
    assert s["kind"] == "Status" and s["reason"] == reason, s
    return s


def test_merge_patch_stores_labels_and_annotations_and_a_watch_sees_them(api, made):
    name = unique("merge")
    start = rv(made.create(name))
    events: List[Tuple[str, dict]] = []
    done = threading.Event()

    def follow():
        w = watch.Watch()
        for ev in w.stream(
            api.list_namespaced_custom_object,
            *GV,
            NS,
            PLURAL,
            label_selector=SUITE,
            resource_version=str(start),
            timeout_seconds=WATCH_SECONDS,
        ):
            events.append((ev["type"], ev["raw_object"]))
            if ev["raw_object"]["metadata"]["labels"].get("color") == "blue":
                w.stop()
                break
        done.set()

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    out = patch(
        api, name, {"metadata": {"labels": {"color": "blue"}, "annotations": {"owner": "py"}}}
    )
    assert out["metadata"]["labels"]["color"] == "blue"
    assert rv(out) > start
    o = get(api, name)
    assert o["metadata"]["annotations"]["owner"] == "py"
    listed = api.list_namespaced_custom_object(*GV, NS, PLURAL, label_selector="color=blue")
    assert [i["metadata"]["name"] for i in listed["items"]] == [name]
    done.wait(WATCH_SECONDS + 10)
    assert ("MODIFIED", name) in [(k, o["metadata"]["name"]) for k, o in events], events
    # The same patch again changes nothing: same resourceVersion.
    again = patch(
        api, name, {"metadata": {"labels": {"color": "blue"}, "annotations": {"owner": "py"}}}
    )
    assert rv(again) == rv(out)


def test_json_and_strategic_patches(api, made):
    name = unique("json")
    made.create(name, labels={"a": "1"})
    out = patch(
        api,
        name,
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {"op": "replace", "path": "/metadata/labels/a", "value": "2"},
        ],
        JSON_PATCH,
    )
    assert out["metadata"]["labels"]["a"] == "2"
    s = expect_error(
        422,
        "Invalid",
        patch,
        api,
        name,
        [{"op": "test", "path": "/metadata/labels/a", "value": "1"}],
        JSON_PATCH,
    )
    assert "error in our request" in s["message"], s
    out = patch(api, name, {"metadata": {"labels": {"b": "3"}}}, STRATEGIC)
    assert out["metadata"]["labels"]["a"] == "2" and out["metadata"]["labels"]["b"] == "3"


def test_operating_mode_pauses_and_resumes(api, made):
    name = unique("mode")
    made.create(name)
    out = patch(api, name, {"spec": {"operatingMode": "Suspended"}})
    assert out["spec"]["operatingMode"] == "Suspended"
    assert ready(out) == ("False", "SandboxSuspended")
    assert get(api, name)["metadata"]["labels"][PHASE_LABEL] == "Paused"
    out = patch(api, name, {"spec": {"operatingMode": "Running"}})
    assert ready(out) == ("True", "DependenciesReady")
    s = expect_error(422, "Invalid", patch, api, name, {"spec": {"operatingMode": "Off"}})
    assert s["details"]["causes"][0]["field"] == "spec.operatingMode", s


def test_shutdown_time_renews_the_lease(api, made):
    name = unique("lease")
    made.create(name, spec={"shutdownTime": in_minutes(10)})
    for minutes in (40, 3):
        when = in_minutes(minutes)
        out = patch(api, name, {"spec": {"shutdownTime": when}})
        granted = parse_time(out["metadata"]["annotations"][DEADLINE])
        assert abs((granted - parse_time(when)).total_seconds()) <= 2, (when, granted)
        assert out["spec"]["shutdownTime"] == when
    s = expect_error(
        422, "Invalid", patch, api, name, {"spec": {"shutdownTime": "2001-01-01T00:00:00Z"}}
    )
    assert s["details"]["causes"][0]["field"] == "spec.shutdownTime", s


def test_the_rest_of_the_spec_is_immutable(api, made):
    name = unique("immutable")
    before = made.create(name)
    changed = {"spec": {"podTemplate": {"spec": {"containers": [{"name": "main", "image": "x"}]}}}}
    s = expect_error(422, "Invalid", patch, api, name, changed)
    cause = s["details"]["causes"][0]
    assert cause["field"] == "spec.podTemplate" and "field is immutable" in cause["message"], s
    assert s["details"]["name"] == name and s["details"]["kind"] == "Sandbox", s
    assert rv(get(api, name)) == rv(before), "a refused patch changes nothing"


def test_server_side_apply_creates_updates_and_forgets(api, made):
    name = unique("ssa")
    applied = body(name, labels={"owned": "yes"})
    # Created (201, as the API server answers an apply that creates; this client decodes only
    # the 200 answer of a patch, so read it back).
    patch(api, name, applied, APPLY, field_manager="pytest")
    made.names.append(name)
    o = get(api, name)
    assert o["metadata"]["labels"]["owned"] == "yes"
    first = rv(o)
    # Unchanged: nothing moves.
    assert rv(patch(api, name, applied, APPLY, field_manager="pytest")) == first
    # A label this manager applied and no longer names goes; others' stay.
    patch(api, name, {"metadata": {"labels": {"theirs": "1"}}})
    out = patch(api, name, body(name), APPLY, field_manager="pytest")
    labels = out["metadata"]["labels"]
    assert "owned" not in labels and labels["theirs"] == "1", labels
    expect_error(400, "BadRequest", patch, api, name, applied, APPLY)


def test_replace_checks_the_resource_version(api, made):
    name = unique("put")
    made.create(name)
    o = get(api, name)
    o["metadata"]["labels"]["put"] = "1"
    out = api.replace_namespaced_custom_object(*GV, NS, PLURAL, name, o)
    assert out["metadata"]["labels"]["put"] == "1"
    o["metadata"]["labels"]["put"] = "2"
    s = expect_error(409, "Conflict", api.replace_namespaced_custom_object, *GV, NS, PLURAL, name, o)
    assert "has been modified" in s["message"], s


def test_dry_run_and_other_tenants_are_refused(api, admin, made):
    name = unique("refused")
    before = made.create(name)
    expect_error(400, "BadRequest", patch, api, name, {"metadata": {"labels": {"x": "y"}}}, dry_run="All")
    assert rv(get(api, name)) == rv(before)
    expect_error(403, "Forbidden", patch, api, name, {"metadata": {"labels": {"x": "y"}}}, ns=OTHER_NS)
    # An admin may label it; the owner sees the label.
    admin.patch_namespaced_custom_object(
        *GV, NS, PLURAL, name, {"metadata": {"labels": {"by": "admin"}}}
    )
    assert get(api, name)["metadata"]["labels"]["by"] == "admin"
