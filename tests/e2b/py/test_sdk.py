"""Scenarios that drive sandbox-gateway's e2b control plane with the unmodified e2b Python SDK.

Run against a running gateway (see tests/e2b/run.sh, which starts one and runs every suite):

    E2B_API_URL=http://127.0.0.1:PORT \
    E2B_API_KEY=<key of tenant team-a> E2B_OTHER_API_KEY=<key of tenant team-b> \
    target/e2b-sdk/py-2.63.0/bin/python -m pytest tests/e2b/py -q

They pass with e2b 2.63.0 (v2 create/connect routes) and 2.50.0 (v1 routes). Where 2.50.0 differs,
the test checks the SDK's signature or version first: it has no `idempotency_key` (that test is
skipped), spells a filesystem-only pause `keep_memory=False` instead of `mode="filesystem"`, and
sends 300 s itself where 2.51+ leaves a timeout out. Only control-plane calls are used: the
gateway serves no data plane (envd), so commands and files are never touched.

Every sandbox a test creates is killed and every snapshot it takes is deleted at the end of the
test, whatever the outcome. Sandboxes carry `suite=<run id>` metadata and listings are filtered
by it, so concurrent runs against the same gateway do not disturb each other.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import os
import re
import secrets
import time
import uuid
from datetime import datetime, timedelta, timezone
from typing import Iterable, List, Optional

import httpx
import pytest
from packaging.version import Version

from e2b import (
    AuthenticationException,
    InvalidArgumentException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

SDK_VERSION = Version(importlib.metadata.version("e2b"))
API_URL = os.environ.get("E2B_API_URL", "").rstrip("/")
KEY_A = os.environ.get("E2B_API_KEY", "")
KEY_B = os.environ.get("E2B_OTHER_API_KEY", "")
# The namespace that KEY_A maps to: snapshot names are stamped `<namespace>/<name>`.
NAMESPACE_A = os.environ.get("E2B_NAMESPACE", "team-a")
MAX_CHECKPOINT_NAME = 63

RUN = f"py{SDK_VERSION.major}{SDK_VERSION.minor}-{uuid.uuid4().hex[:10]}"
SANDBOX_ID = re.compile(r"^sb-[0-9a-f]{16}$")
SNAPSHOT_ID = re.compile(r"^ck_[0-9a-f]{16}$")
MIB = 1024 * 1024

# Generous: the gateway runs on this machine, so clocks agree; these only absorb scheduling.
CLOCK_SLACK = timedelta(seconds=30)
LEASE_SLACK = timedelta(seconds=10)


def _has_param(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


# 2.51 moved create/connect to the v2 routes and leaves `timeout` out of create, connect and fork
# when not given (the API's defaults apply); 2.50 uses the v1 routes and always sends 300 s.
USES_V2_ROUTES = SDK_VERSION >= Version("2.51.0")
HAS_PAUSE_MODE = _has_param(Sandbox._cls_pause, "mode")
HAS_IDEMPOTENCY_KEY = _has_param(Sandbox.create, "idempotency_key")


@pytest.fixture(scope="session", autouse=True)
def _gateway_env():
    missing = [
        n
        for n, v in [
            ("E2B_API_URL", API_URL),
            ("E2B_API_KEY", KEY_A),
            ("E2B_OTHER_API_KEY", KEY_B),
        ]
        if not v
    ]
    if missing:
        pytest.fail(f"set {', '.join(missing)} (see tests/e2b/run.sh)", pytrace=False)
    assert KEY_A != KEY_B, "E2B_API_KEY and E2B_OTHER_API_KEY must be different tenants"


def now() -> datetime:
    return datetime.now(timezone.utc)


def tag(**extra: str) -> dict:
    return {"suite": RUN, **extra}


def wrong_key() -> str:
    return "e2b_" + secrets.token_hex(20)


def status_of(exc: BaseException) -> Optional[int]:
    """The HTTP status an SDK exception came from (attribute, else the `NNN:` message prefix)."""
    code = getattr(exc, "status_code", None)
    if code is not None:
        return code
    m = re.match(r"^(\d{3}):", str(exc))
    return int(m.group(1)) if m else None


def assert_close(actual: datetime, expected: datetime, slack: timedelta, what: str):
    assert abs(actual - expected) <= slack, (
        f"{what}: got {actual.isoformat()}, expected {expected.isoformat()} ± {slack}"
    )


def lease_seconds(info) -> float:
    return (info.end_at - info.started_at).total_seconds()


def raw(method: str, path: str, key: str = None, **kw) -> httpx.Response:
    """A plain HTTP call, for what the SDK hides (status codes, routes it no longer uses)."""
    headers = {"X-API-KEY": key or KEY_A, **kw.pop("headers", {})}
    return httpx.request(method, API_URL + path, headers=headers, timeout=30, **kw)


def list_all(query: Optional[SandboxQuery] = None, **kw) -> List:
    pager = Sandbox.list(query=query, **kw)
    out = []
    pages = 0
    while pager.has_next:
        out.extend(pager.next_items())
        pages += 1
        assert pages < 1000, "listing never ends"
    return out


def ids(items: Iterable) -> List[str]:
    return [i.sandbox_id for i in items]


def snapshot_ids(items: Iterable) -> List[str]:
    return [s.snapshot_id for s in items]


def list_snapshots_all(**kw) -> List:
    pager = Sandbox.list_snapshots(**kw)
    out = []
    while pager.has_next:
        out.extend(pager.next_items())
        assert len(out) < 100000, "snapshot listing never ends"
    return out


class Cleanup:
    """Kills the sandboxes and deletes the snapshots a test made, with the key that owns them."""

    def __init__(self):
        self.sandboxes: List[tuple] = []
        self.snapshots: List[tuple] = []

    def sandbox(self, sbx_or_id, key: str = None):
        sid = sbx_or_id if isinstance(sbx_or_id, str) else sbx_or_id.sandbox_id
        self.sandboxes.append((sid, key or KEY_A))
        return sbx_or_id

    def snapshot(self, snapshot_id: str, key: str = None):
        self.snapshots.append((snapshot_id, key or KEY_A))
        return snapshot_id

    def create(self, key: str = None, **kw) -> Sandbox:
        kw.setdefault("metadata", tag())
        if key:
            kw["api_key"] = key
        sbx = Sandbox.create(**kw)
        self.sandbox(sbx, key)
        return sbx

    def run(self):
        errors = []
        for sid, key in reversed(self.sandboxes):
            try:
                Sandbox.kill(sid, api_key=key)
            except Exception as e:  # keep cleaning up
                errors.append(f"kill {sid}: {e!r}")
        for ck, key in reversed(self.snapshots):
            try:
                Sandbox.delete_snapshot(ck, api_key=key)
            except Exception as e:
                errors.append(f"delete snapshot {ck}: {e!r}")
        assert not errors, "cleanup failed: " + "; ".join(errors)


@pytest.fixture
def cleanup():
    c = Cleanup()
    yield c
    c.run()


# ---------------------------------------------------------------------------------------------
# create / get_info


def test_create_defaults_and_info(cleanup):
    before = now()
    sbx = cleanup.create(metadata=tag(owner="alice", note="a b&c=d"), envs={"FOO": "bar"})
    assert SANDBOX_ID.match(sbx.sandbox_id), sbx.sandbox_id
    assert sbx.sandbox_domain == "localhost"

    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.cpu_count == 1
    assert info.memory_mb == 512
    assert info.metadata == tag(owner="alice", note="a b&c=d")
    assert info.envd_version
    assert_close(info.started_at, before, CLOCK_SLACK, "started_at")
    # v2 (2.51+) omits the timeout and gets the gateway's 300 s default; 2.50 sends 300 itself.
    assert lease_seconds(info) == pytest.approx(300, abs=1)

    # The static variant answers the same.
    again = Sandbox.get_info(sbx.sandbox_id)
    assert again.sandbox_id == info.sandbox_id
    assert again.end_at == info.end_at
    assert again.metadata == info.metadata


def test_create_with_timeout(cleanup):
    sbx = cleanup.create(timeout=120)
    info = sbx.get_info()
    assert lease_seconds(info) == pytest.approx(120, abs=1)
    assert_close(info.end_at, now() + timedelta(seconds=120), LEASE_SLACK, "end_at")


def test_default_timeouts_of_both_create_routes(cleanup):
    """The SDK always picks one route; the defaults of both are checked over plain HTTP."""
    for path, expected in [("/v2/sandboxes", 300), ("/sandboxes", 15)]:
        res = raw("POST", path, json={"templateID": "base", "metadata": tag(route=path)})
        assert res.status_code == 201, (path, res.status_code, res.text)
        body = res.json()
        cleanup.sandbox(body["sandboxID"])
        assert SANDBOX_ID.match(body["sandboxID"]), body
        assert body["templateID"] == "base"
        assert body["domain"] == "localhost"
        info = Sandbox.get_info(body["sandboxID"])
        assert lease_seconds(info) == pytest.approx(expected, abs=1), path


def test_allow_internet_access_round_trip(cleanup):
    for allowed in (True, False):
        sbx = cleanup.create(allow_internet_access=allowed, metadata=tag(net=str(allowed)))
        info = sbx.get_info()
        assert info.allow_internet_access is allowed, info
        assert info.state == SandboxState.RUNNING


def test_create_from_unknown_template_fails(cleanup):
    with pytest.raises(SandboxException) as e:
        cleanup.create(template="no-such-template-" + RUN)
    assert status_of(e.value) == 404, repr(e.value)


@pytest.mark.parametrize(
    "option",
    ["network_domains", "mcp", "volume_mounts", "iam"],
)
def test_unsupported_create_options_are_refused(cleanup, option):
    kwargs = {
        # Domains are exceptions to denying everything, as on e2b (tests/e2b_network.rs).
        "network_domains": {"network": {"allow_out": ["example.com"]}},
        "mcp": {"mcp": {"exa": {"apiKey": "x"}}},
        "volume_mounts": {"volume_mounts": {"/data": "vol-" + RUN}},
        "iam": {
            "iam": {
                "tokens": {
                    "aws": {"audience": "sts.amazonaws.com", "token_type": "JWT-SVID"}
                }
            }
        },
    }[option]
    meta = tag(option=option)
    with pytest.raises(SandboxException) as e:
        cleanup.create(metadata=meta, **kwargs)
    assert status_of(e.value) == 400, repr(e.value)
    # The refusal names what is missing.
    named = {
        "network_domains": "ALL_TRAFFIC",
        "mcp": "mcp-gateway",
        "volume_mounts": "not found",
        "iam": "identity",
    }[option]
    assert named in str(e.value), str(e.value)
    # Nothing was started.
    assert list_all(SandboxQuery(metadata=meta)) == []


# ---------------------------------------------------------------------------------------------
# list


def test_list_filters_order_and_pagination(cleanup):
    before = now() - timedelta(seconds=1)
    made = []
    for i in range(3):
        made.append(cleanup.create(metadata=tag(idx=str(i), note="a b&c=d")))
        time.sleep(0.02)  # distinct start times, so the order below is defined
    infos = [s.get_info() for s in made]
    mine = SandboxQuery(metadata=tag())

    # Every state by default; the creates show up at once.
    assert sorted(ids(list_all(mine))) == sorted(ids(made))

    # Metadata is an exact match on every given pair, including encoded characters.
    assert ids(list_all(SandboxQuery(metadata=tag(idx="1")))) == [made[1].sandbox_id]
    assert ids(list_all(SandboxQuery(metadata={"suite": RUN, "idx": "1 "}))) == []
    assert list_all(SandboxQuery(metadata={"suite": RUN[:-1]})) == []
    assert len(list_all(SandboxQuery(metadata={"suite": RUN, "note": "a b&c=d"}))) == 3
    assert list_all(SandboxQuery(metadata={"suite": RUN, "note": "a b"})) == []
    odd = cleanup.create(metadata=tag(**{"k=1 &x é": "v&1=2%+ü/?#"}))
    assert ids(list_all(SandboxQuery(metadata={"suite": RUN, "k=1 &x é": "v&1=2%+ü/?#"}))) == [
        odd.sandbox_id
    ]
    assert odd.kill() is True

    # A listed item carries the same facts as get_info.
    listed = {i.sandbox_id: i for i in list_all(mine)}
    for info in infos:
        item = listed[info.sandbox_id]
        assert item.template_id == "base"
        assert item.state == SandboxState.RUNNING
        assert item.cpu_count == 1 and item.memory_mb == 512
        assert item.metadata == info.metadata
        assert item.started_at == info.started_at
        assert item.end_at == info.end_at

    # State filter, after a pause (lists reflect it immediately).
    assert made[0].pause() is True
    running = SandboxQuery(metadata=tag(), state=[SandboxState.RUNNING])
    paused = SandboxQuery(metadata=tag(), state=[SandboxState.PAUSED])
    both = SandboxQuery(metadata=tag(), state=[SandboxState.RUNNING, SandboxState.PAUSED])
    assert sorted(ids(list_all(running))) == sorted(ids(made[1:]))
    assert ids(list_all(paused)) == [made[0].sandbox_id]
    assert list_all(paused)[0].state == SandboxState.PAUSED
    assert sorted(ids(list_all(both))) == sorted(ids(made))

    # Template filter.
    assert sorted(ids(list_all(SandboxQuery(metadata=tag(), template="base")))) == sorted(
        ids(made)
    )
    assert list_all(SandboxQuery(metadata=tag(), template="other-" + RUN)) == []

    # startedAfter.
    assert sorted(ids(list_all(SandboxQuery(metadata=tag(), started_after=before)))) == sorted(
        ids(made)
    )
    after_all = max(i.started_at for i in infos) + timedelta(seconds=1)
    assert list_all(SandboxQuery(metadata=tag(), started_after=after_all)) == []
    middle = infos[0].started_at + (infos[2].started_at - infos[0].started_at) / 2
    assert infos[0].started_at < middle < infos[2].started_at
    got = ids(list_all(SandboxQuery(metadata=tag(), started_after=middle)))
    assert made[0].sandbox_id not in got and made[2].sandbox_id in got

    # Order by start time, across pages of one item; no token on the last page.
    by_start = [i.sandbox_id for i in sorted(infos, key=lambda i: i.started_at)]
    for order, expected in [("asc", by_start), ("desc", by_start[::-1]), (None, by_start[::-1])]:
        pager = Sandbox.list(query=mine, limit=1, order=order)
        pages = []
        while pager.has_next:
            page = pager.next_items()
            pages.append(ids(page))
            assert len(pages) <= 3, f"order={order}: more pages than sandboxes: {pages}"
            assert pager.has_next == (len(pages) < 3), (
                f"order={order}: has_next after page {len(pages)} is {pager.has_next}"
            )
        assert pages == [[i] for i in expected], f"order={order}"

    # A page of two, then the rest.
    pager = Sandbox.list(query=mine, limit=2, order="asc")
    assert ids(pager.next_items()) == by_start[:2]
    assert pager.has_next and pager.next_token
    resumed = Sandbox.list(query=mine, limit=2, order="asc", next_token=pager.next_token)
    assert ids(resumed.next_items()) == by_start[2:]
    assert not resumed.has_next

    # Kills show up at once too.
    assert made[1].kill() is True
    assert sorted(ids(list_all(mine))) == sorted([made[0].sandbox_id, made[2].sandbox_id])


def test_list_started_after_is_inclusive(cleanup):
    """"Started at or after this time", as both SDKs and the API's parameter description say."""
    sbx = cleanup.create()
    info = sbx.get_info()
    got = ids(list_all(SandboxQuery(metadata=tag(), started_after=info.started_at)))
    assert got == [sbx.sandbox_id], (
        f"startedAfter={info.started_at.isoformat()} (== started_at of {sbx.sandbox_id}) "
        f"must include that sandbox; got {got}"
    )


def test_list_limit_bounds(cleanup):
    cleanup.create()
    assert len(Sandbox.list(query=SandboxQuery(metadata=tag()), limit=100).next_items()) == 1
    with pytest.raises(SandboxException) as e:
        Sandbox.list(limit=101).next_items()
    assert status_of(e.value) == 400, repr(e.value)
    # The SDK drops a falsy limit, so 0 goes over plain HTTP.
    res = raw("GET", "/v2/sandboxes", params={"limit": "0"})
    assert res.status_code == 400, res.text
    res = raw("GET", "/v2/sandboxes", params={"order": "sideways"})
    assert res.status_code == 400, res.text


# ---------------------------------------------------------------------------------------------
# timeouts


def test_set_timeout_moves_end_at_and_refresh_only_extends(cleanup):
    sbx = cleanup.create(timeout=300)
    sbx.set_timeout(60)  # shortening is allowed
    info = sbx.get_info()
    assert_close(info.end_at, now() + timedelta(seconds=60), LEASE_SLACK, "end_at after 60")
    Sandbox.set_timeout(sbx.sandbox_id, 600)
    info = sbx.get_info()
    assert_close(info.end_at, now() + timedelta(seconds=600), LEASE_SLACK, "end_at after 600")
    assert info.started_at == sbx.get_info().started_at

    # Refreshes (no SDK method: plain HTTP) never shorten...
    res = raw("POST", f"/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 30})
    assert res.status_code == 204, res.text
    assert sbx.get_info().end_at == info.end_at
    # ...and do extend.
    res = raw("POST", f"/sandboxes/{sbx.sandbox_id}/refreshes", json={"duration": 900})
    assert res.status_code == 204, res.text
    assert_close(sbx.get_info().end_at, now() + timedelta(seconds=900), LEASE_SLACK, "refreshed")


def test_timeouts_beyond_the_maximum_are_refused(cleanup):
    # The nodes' default maximum lease is 24 h, as on e2b's Pro tier.
    with pytest.raises(SandboxException) as e:
        cleanup.create(timeout=86_401, metadata=tag(role="too-long"))
    assert status_of(e.value) == 400, repr(e.value)
    assert list_all(SandboxQuery(metadata=tag(role="too-long"))) == []
    sbx = cleanup.create(timeout=300)
    with pytest.raises(SandboxException) as e:
        sbx.set_timeout(86_401)
    assert status_of(e.value) == 400, repr(e.value)
    assert lease_seconds(sbx.get_info()) == pytest.approx(300, abs=1)
    sbx.set_timeout(86_400)
    assert lease_seconds(sbx.get_info()) == pytest.approx(86_400, abs=5)


def test_lease_end_removes_running_sandboxes_and_keeps_paused_ones(cleanup):
    running = cleanup.create(timeout=300, metadata=tag(role="expiring"))
    paused = cleanup.create(timeout=2, metadata=tag(role="kept"))
    assert paused.pause() is True
    running.set_timeout(1)
    # A paused sandbox's lease does not run (lifecycle_scenarios.py covers its retention).
    with pytest.raises(SandboxException):
        paused.set_timeout(1)
    query = SandboxQuery(metadata=tag(role="expiring"))
    deadline = time.monotonic() + 30  # generous: the lease is 1 s
    while list_all(query) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list_all(query) == [], "sandboxes still listed 30 s after a 1 s lease"
    with pytest.raises(SandboxNotFoundException):
        running.get_info()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(running.sandbox_id)
    assert running.kill() is False
    assert paused.get_info().state == SandboxState.PAUSED, "kept past its 2 s lease"


def test_set_timeout_of_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout("sb-" + "0" * 16, 60)


# ---------------------------------------------------------------------------------------------
# pause / connect


def filesystem_pause(target):
    """A filesystem-only pause, in whichever spelling this SDK has."""
    if HAS_PAUSE_MODE:
        return target.pause(mode="filesystem")
    return target.pause(keep_memory=False)  # 2.50.0 has no `mode`


def test_pause_and_connect_resume(cleanup):
    sbx = cleanup.create(timeout=300)

    # A filesystem-only pause keeps the sandbox (same id) with its files; GET says so.
    assert filesystem_pause(sbx) is True
    assert sbx.get_info().state == SandboxState.PAUSED
    assert raw("GET", f"/sandboxes/{sbx.sandbox_id}").json()["pauseMode"] == "filesystem"
    assert filesystem_pause(sbx) is False  # 409: already paused
    assert Sandbox.connect(sbx.sandbox_id, timeout=60).sandbox_id == sbx.sandbox_id
    assert sbx.get_info().state == SandboxState.RUNNING
    assert "pauseMode" not in raw("GET", f"/sandboxes/{sbx.sandbox_id}").json()

    assert sbx.pause() is True
    assert raw("GET", f"/sandboxes/{sbx.sandbox_id}").json()["pauseMode"] == "full"
    info = sbx.get_info()
    assert info.state == SandboxState.PAUSED
    assert ids(list_all(SandboxQuery(metadata=tag(), state=[SandboxState.PAUSED]))) == [
        sbx.sandbox_id
    ]
    assert sbx.pause() is False  # 409: already paused
    assert Sandbox.pause(sbx.sandbox_id) is False

    # connect resumes a paused sandbox.
    same = Sandbox.connect(sbx.sandbox_id, timeout=60)
    assert same.sandbox_id == sbx.sandbox_id
    assert same.sandbox_domain == "localhost"
    after = sbx.get_info()
    assert after.state == SandboxState.RUNNING
    assert after.end_at >= info.end_at, "connect must not shorten the lease"
    assert ids(list_all(SandboxQuery(metadata=tag(), state=[SandboxState.RUNNING]))) == [
        sbx.sandbox_id
    ]

    # Pausing works again after a resume, and so does the instance connect.
    assert Sandbox.pause(sbx.sandbox_id) is True
    assert sbx.connect() is sbx
    assert sbx.get_info().state == SandboxState.RUNNING

    # Resuming a full pause by rebooting from its files (memory: false) works too.
    assert sbx.pause() is True
    if _has_param(Sandbox.connect, "on_resume"):
        Sandbox.connect(sbx.sandbox_id, timeout=60, on_resume="reboot")
    else:  # 2.50.0 cannot say it: the raw route
        r = raw("POST", f"/sandboxes/{sbx.sandbox_id}/resume", json={"memory": False})
        assert r.status_code == 201, r.text
    assert sbx.get_info().state == SandboxState.RUNNING


def test_connect_only_extends_the_lease(cleanup):
    sbx = cleanup.create(timeout=600)
    before = sbx.get_info()
    got = Sandbox.connect(sbx.sandbox_id, timeout=60)  # running: nothing to resume
    assert got.sandbox_id == sbx.sandbox_id
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert abs(info.end_at - before.end_at) <= timedelta(seconds=1), (
        f"connect(timeout=60) moved end_at from {before.end_at} to {info.end_at}"
    )
    Sandbox.connect(sbx.sandbox_id, timeout=900)
    assert_close(sbx.get_info().end_at, now() + timedelta(seconds=900), LEASE_SLACK, "end_at")


def test_connect_status_codes(cleanup):
    """201 when connect resumed the sandbox, 200 when it was running (hidden by the SDK)."""
    sbx = cleanup.create(timeout=300)
    routes = ["/v2/sandboxes/{id}/connect", "/sandboxes/{id}/connect"]
    for route in routes:
        path = route.format(id=sbx.sandbox_id)
        res = raw("POST", path, json={"timeout": 60})
        assert res.status_code == 200, (path, res.status_code, res.text)
        assert res.json()["sandboxID"] == sbx.sandbox_id
        assert sbx.pause() is True
        res = raw("POST", path, json={"timeout": 60})
        assert res.status_code == 201, (path, res.status_code, res.text)
        assert res.json()["sandboxID"] == sbx.sandbox_id
        assert sbx.get_info().state == SandboxState.RUNNING


def test_connect_to_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("sb-" + "0" * 16)


# ---------------------------------------------------------------------------------------------
# fork


def test_fork(cleanup):
    src = cleanup.create(timeout=300, metadata=tag(role="source"))
    children = src.fork(count=2, timeout=120)
    for c in children:
        if isinstance(c, Sandbox):
            cleanup.sandbox(c)
    assert len(children) == 2, children
    errors = [c for c in children if not isinstance(c, Sandbox)]
    assert not errors, f"fork children failed: {errors!r}"
    child_ids = ids(children)
    assert len(set(child_ids)) == 2 and src.sandbox_id not in child_ids
    for c in children:
        assert SANDBOX_ID.match(c.sandbox_id), c.sandbox_id
        assert c.sandbox_domain == "localhost"
        info = c.get_info()
        assert info.state == SandboxState.RUNNING
        assert info.cpu_count == 1 and info.memory_mb == 512
        assert lease_seconds(info) == pytest.approx(120, abs=1)

    # The source keeps running, untouched.
    assert src.get_info().state == SandboxState.RUNNING
    # The children belong to the same tenant: listed for it, invisible to the other. (The whole
    # tenant is listed: whether children inherit the source's metadata is not asserted.)
    listed = ids(list_all())
    assert set(child_ids) <= set(listed), (child_ids, listed)
    other = ids(list_all(api_key=KEY_B))
    assert not set(child_ids) & set(other)
    for cid in child_ids:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(cid, api_key=KEY_B)

    # The static variant.
    more = Sandbox.fork(src.sandbox_id, count=1, timeout=60)
    for c in more:
        if isinstance(c, Sandbox):
            cleanup.sandbox(c)
    assert len(more) == 1 and isinstance(more[0], Sandbox), more
    assert lease_seconds(more[0].get_info()) == pytest.approx(60, abs=1)

    # Without a timeout: the API's documented fork default of 15 s (2.51+ leaves it out), or the
    # 300 s that 2.50 sends itself.
    dflt = src.fork()
    for c in dflt:
        if isinstance(c, Sandbox):
            cleanup.sandbox(c)
    assert len(dflt) == 1 and isinstance(dflt[0], Sandbox), dflt
    expected = 15 if USES_V2_ROUTES else 300
    assert lease_seconds(dflt[0].get_info()) == pytest.approx(expected, abs=1)

    for c in children:
        assert c.kill() is True
    assert src.get_info().state == SandboxState.RUNNING


def test_fork_count_bounds(cleanup):
    src = cleanup.create(metadata=tag(role="fork-bounds"))
    # 17 passes both SDKs' own checks (2.63: 1..20; 2.50: >= 1); the gateway allows 1..16.
    with pytest.raises(SandboxException) as e:
        got = src.fork(count=17, timeout=30)
        for c in got:  # should not happen; clean up if it did
            if isinstance(c, Sandbox):
                cleanup.sandbox(c)
    assert status_of(e.value) == 400, repr(e.value)
    # The SDKs refuse 0 themselves, so it goes over plain HTTP.
    with pytest.raises(InvalidArgumentException):
        src.fork(count=0)
    for count in [0, -1]:
        res = raw("POST", f"/sandboxes/{src.sandbox_id}/fork", json={"count": count})
        assert res.status_code == 400, (count, res.status_code, res.text)
    # Nothing but the source was started.
    assert ids(list_all(SandboxQuery(metadata=tag()))) == [src.sandbox_id]


def test_fork_of_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork("sb-" + "0" * 16, count=1)


# ---------------------------------------------------------------------------------------------
# snapshots


def test_snapshot_lifecycle(cleanup):
    src = cleanup.create(metadata=tag(role="snapshot-source"))
    other_src = cleanup.create(metadata=tag(role="unrelated"))
    name = f"snap-{RUN}"
    snap = src.create_snapshot(name=name)
    cleanup.snapshot(snap.snapshot_id)
    assert SNAPSHOT_ID.match(snap.snapshot_id), snap
    assert snap.names == [name]
    assert src.get_info().state == SandboxState.RUNNING

    # Listed, with the name as given (no namespace prefix).
    everything = list_snapshots_all()
    mine = [s for s in everything if s.snapshot_id == snap.snapshot_id]
    assert len(mine) == 1, snapshot_ids(everything)
    assert mine[0].names == [name]
    for s in everything:
        for n in s.names:
            assert not n.startswith(NAMESPACE_A + "/"), f"namespace leaked in {s!r}"

    # Filtered by source sandbox (static and instance variants) and by name.
    assert snapshot_ids(list_snapshots_all(sandbox_id=src.sandbox_id)) == [snap.snapshot_id]
    assert snapshot_ids(src.list_snapshots().next_items()) == [snap.snapshot_id]
    assert list_snapshots_all(sandbox_id=other_src.sandbox_id) == []
    assert snapshot_ids(list_snapshots_all(name=name)) == [snap.snapshot_id]
    assert list_snapshots_all(name=name + "-nope") == []

    # A second snapshot: newest first, one per page, no token on the last page.
    snap2 = Sandbox.create_snapshot(src.sandbox_id, name=name + "-2")
    cleanup.snapshot(snap2.snapshot_id)
    assert snap2.snapshot_id != snap.snapshot_id and snap2.names == [name + "-2"]
    pager = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=1)
    page1 = snapshot_ids(pager.next_items())
    assert pager.has_next
    page2 = snapshot_ids(pager.next_items())
    assert not pager.has_next, "X-Next-Token must be absent on the last page"
    assert page1 + page2 == [snap2.snapshot_id, snap.snapshot_id]

    # A sandbox branched from the snapshot.
    child = cleanup.create(template=snap.snapshot_id, metadata=tag(role="from-snapshot"))
    assert SANDBOX_ID.match(child.sandbox_id)
    assert child.sandbox_id not in (src.sandbox_id, other_src.sandbox_id)
    cinfo = child.get_info()
    assert cinfo.state == SandboxState.RUNNING
    assert cinfo.template_id == snap.snapshot_id
    assert cinfo.metadata == tag(role="from-snapshot")
    assert child.sandbox_id in ids(list_all(SandboxQuery(template=snap.snapshot_id)))
    assert child.kill() is True

    # Delete: True, then False.
    assert Sandbox.delete_snapshot(snap.snapshot_id) is True
    assert Sandbox.delete_snapshot(snap.snapshot_id) is False
    assert snap.snapshot_id not in snapshot_ids(list_snapshots_all())
    assert snapshot_ids(list_snapshots_all(sandbox_id=src.sandbox_id)) == [snap2.snapshot_id]
    assert Sandbox.delete_snapshot(snap2.snapshot_id) is True
    # A deleted snapshot cannot be branched from.
    with pytest.raises(SandboxException):
        cleanup.create(template=snap.snapshot_id)


def test_snapshot_name_filter_takes_an_id(cleanup):
    """The `name` filter is "name or ID", as both SDKs and the API's parameter description say."""
    src = cleanup.create(metadata=tag(role="snapshot-by-id"))
    snap = src.create_snapshot(name=f"byid-{RUN}")
    cleanup.snapshot(snap.snapshot_id)
    assert snapshot_ids(list_snapshots_all(name=f"byid-{RUN}")) == [snap.snapshot_id]
    assert snapshot_ids(list_snapshots_all(name=snap.snapshot_id)) == [snap.snapshot_id], (
        f"GET /snapshots?name={snap.snapshot_id} must find that snapshot"
    )


def test_snapshot_name_length_in_namespace(cleanup):
    src = cleanup.create(metadata=tag(role="snapshot-names"))
    room = MAX_CHECKPOINT_NAME - len(NAMESPACE_A) - 1
    prefix = f"n{RUN}-"
    longest = (prefix + "x" * room)[:room]
    snap = src.create_snapshot(name=longest)
    cleanup.snapshot(snap.snapshot_id)
    assert snap.names == [longest]
    with pytest.raises(SandboxException) as e:
        src.create_snapshot(name=longest + "y")
    assert status_of(e.value) == 400, repr(e.value)
    assert snapshot_ids(list_snapshots_all(sandbox_id=src.sandbox_id)) == [snap.snapshot_id]


def test_snapshot_of_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot("sb-" + "0" * 16, name="x")


# ---------------------------------------------------------------------------------------------
# metrics


def test_metrics(cleanup):
    sbx = cleanup.create()
    for metrics in [sbx.get_metrics(), Sandbox.get_metrics(sbx.sandbox_id)]:
        assert len(metrics) == 1, metrics
        m = metrics[0]
        assert m.cpu_count == 1
        assert m.mem_used > 0
        assert m.mem_total == 512 * MIB
        assert m.disk_used > 0
        assert m.disk_total >= m.disk_used
        assert 0 <= m.cpu_used_pct
        assert_close(m.timestamp, now(), CLOCK_SLACK, "metrics timestamp")


def test_metrics_time_range(cleanup):
    sbx = cleanup.create()
    # From a second before the start (the API takes whole seconds) until after now.
    started = sbx.get_info().started_at - timedelta(seconds=1)
    got = sbx.get_metrics(start=started, end=now() + timedelta(minutes=1))
    assert len(got) == 1, got
    assert got[0].mem_total == 512 * MIB
    # A window wholly in the future holds no sample.
    assert sbx.get_metrics(start=now() + timedelta(hours=1), end=now() + timedelta(hours=2)) == []


def test_metrics_of_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("sb-" + "0" * 16)


# ---------------------------------------------------------------------------------------------
# kill


def test_kill(cleanup):
    sbx = cleanup.create()
    paused = cleanup.create()
    assert paused.pause() is True
    assert sbx.kill() is True
    assert sbx.kill() is False  # 404
    assert Sandbox.kill(paused.sandbox_id) is True  # a paused sandbox can be killed
    assert Sandbox.kill(paused.sandbox_id) is False
    for s in (sbx, paused):
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(s.sandbox_id)
    assert list_all(SandboxQuery(metadata=tag())) == []


# ---------------------------------------------------------------------------------------------
# tenancy and authentication


def test_tenants_are_isolated(cleanup):
    a = cleanup.create(metadata=tag(tenant="a"))
    snap = a.create_snapshot(name=f"iso-{RUN}")
    cleanup.snapshot(snap.snapshot_id)
    b = cleanup.create(key=KEY_B, metadata=tag(tenant="b"))
    a_id, b_id = a.sandbox_id, b.sandbox_id

    # B cannot see or touch A's sandbox...
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(a_id, api_key=KEY_B)
    assert Sandbox.kill(a_id, api_key=KEY_B) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(a_id, 30, api_key=KEY_B)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(a_id, api_key=KEY_B)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(a_id, api_key=KEY_B)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(a_id, count=1, api_key=KEY_B)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(a_id, api_key=KEY_B)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(a_id, name="steal", api_key=KEY_B)
    b_listing = ids(list_all(api_key=KEY_B))
    assert a_id not in b_listing and b_id in b_listing
    assert ids(list_all(SandboxQuery(metadata=tag()), api_key=KEY_B)) == [b_id]

    # ...nor A's snapshots.
    assert snap.snapshot_id not in snapshot_ids(list_snapshots_all(api_key=KEY_B))
    assert list_snapshots_all(sandbox_id=a_id, api_key=KEY_B) == []
    assert list_snapshots_all(name=f"iso-{RUN}", api_key=KEY_B) == []
    assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=KEY_B) is False
    with pytest.raises(SandboxException):
        cleanup.create(key=KEY_B, template=snap.snapshot_id, metadata=tag(tenant="b-steal"))

    # And the same the other way round.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(b_id)
    assert Sandbox.kill(b_id) is False
    assert b_id not in ids(list_all())

    # All of it survived.
    info = Sandbox.get_info(a_id)
    assert info.state == SandboxState.RUNNING
    assert info.metadata == tag(tenant="a")
    assert_close(info.end_at, info.started_at + timedelta(seconds=300), LEASE_SLACK, "A's lease")
    assert Sandbox.get_info(b_id, api_key=KEY_B).state == SandboxState.RUNNING
    assert snapshot_ids(list_snapshots_all(sandbox_id=a_id)) == [snap.snapshot_id]


def test_wrong_key_is_refused(cleanup):
    sbx = cleanup.create()
    bad = wrong_key()
    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key=bad, metadata=tag(role="wrong-key"))
    with pytest.raises(AuthenticationException):
        Sandbox.list(api_key=bad).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.get_info(sbx.sandbox_id, api_key=bad)
    with pytest.raises(AuthenticationException):
        Sandbox.kill(sbx.sandbox_id, api_key=bad)
    with pytest.raises(AuthenticationException):
        Sandbox.list_snapshots(api_key=bad).next_items()
    assert sbx.get_info().state == SandboxState.RUNNING
    assert ids(list_all(SandboxQuery(metadata=tag()))) == [sbx.sandbox_id]


# ---------------------------------------------------------------------------------------------
# idempotent create (SDK 2.51+)


@pytest.mark.skipif(
    not HAS_IDEMPOTENCY_KEY,
    reason=f"e2b {SDK_VERSION} has no idempotency_key on Sandbox.create",
)
def test_idempotent_create(cleanup):
    key = uuid.uuid4().hex
    first = cleanup.create(idempotency_key=key, metadata=tag(role="idem"))
    second = cleanup.create(idempotency_key=key, metadata=tag(role="idem"))
    assert second.sandbox_id == first.sandbox_id
    assert ids(list_all(SandboxQuery(metadata=tag(role="idem")))) == [first.sandbox_id]
