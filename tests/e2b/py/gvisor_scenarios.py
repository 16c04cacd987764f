"""Memory that survives the e2b verbs on the gvisor runtime, driven with the unmodified e2b
Python SDK: a process holding a counter only in its memory keeps counting, with the same pid,
after pause and connect, and in a sandbox created from a full snapshot. Filesystem-only
snapshots and sandboxes with internet access are refused or kept in memory as the README
says. Run by tests/gvisor.rs against `serve --runtime gvisor`.
"""

from __future__ import annotations

import time

import pytest

from e2b import Sandbox, SandboxException

COUNTER = (
    "import os, time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open('/tmp/c.tmp', 'w').write('%d %d' % (n, os.getpid()))\n"
    "    os.replace('/tmp/c.tmp', '/tmp/c')\n"
    "    time.sleep(0.02)\n"
)


def start_counter(sbx: Sandbox) -> tuple[int, int]:
    sbx.files.write("/tmp/counter.py", COUNTER)
    sbx.commands.run("python3 /tmp/counter.py", background=True)
    for _ in range(200):
        if sbx.files.exists("/tmp/c"):
            return read(sbx)
        time.sleep(0.05)
    raise AssertionError("the counter did not start")


def read(sbx: Sandbox) -> tuple[int, int]:
    n, pid = sbx.files.read("/tmp/c").split()
    return int(n), int(pid)


def keeps_counting(sbx: Sandbox, at_least: int, pid: int) -> int:
    n1, p1 = read(sbx)
    assert p1 == pid, "the same process goes on"
    assert n1 >= at_least, f"the count goes on from {at_least}, not from zero: {n1}"
    time.sleep(0.3)
    n2, _ = read(sbx)
    assert n2 > n1, "still counting"
    return n2


@pytest.fixture
def sbx():
    s = Sandbox.create(timeout=300, allow_internet_access=False)
    yield s
    s.kill()


def test_pause_and_connect_keep_memory(sbx):
    n, pid = start_counter(sbx)
    assert sbx.pause()
    time.sleep(0.5)
    resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
    keeps_counting(resumed, n, pid)


def test_a_sandbox_from_a_full_snapshot_has_the_memory(sbx):
    n, pid = start_counter(sbx)
    snap = sbx.create_snapshot(mode="full")
    n = keeps_counting(sbx, n, pid)
    child = Sandbox.create(snap.snapshot_id, timeout=300, allow_internet_access=False)
    try:
        assert child.sandbox_id != sbx.sandbox_id
        keeps_counting(child, 1, pid)
        child.files.write("/tmp/only-in-child", "x")
        assert not sbx.files.exists("/tmp/only-in-child")
    finally:
        child.kill()
        Sandbox.delete_snapshot(snap.snapshot_id)


def test_internet_sandboxes_pause_in_memory_and_refuse_snapshots():
    s = Sandbox.create(timeout=300)
    try:
        n, pid = start_counter(s)
        with pytest.raises(SandboxException) as e:
            s.create_snapshot()
        assert "internet access" in str(e.value)
        assert s.pause()
        resumed = Sandbox.connect(s.sandbox_id, timeout=300)
        keeps_counting(resumed, n, pid)
    finally:
        s.kill()


def test_a_filesystem_only_pause_is_refused_and_the_sandbox_runs_on(sbx):
    # runsc keeps a sandbox's file writes in its in-memory root overlay, which cannot be saved
    # apart from its processes: 400 naming that, and nothing changes.
    n, pid = start_counter(sbx)
    with pytest.raises(SandboxException) as e:
        sbx.pause(mode="filesystem")
    assert "400" in str(e.value) and "gvisor" in str(e.value), str(e.value)
    assert Sandbox.get_info(sbx.sandbox_id).state.value == "running"
    keeps_counting(sbx, n, pid)


def test_volume_mounts_are_refused_by_name():
    import os
    import uuid

    os.environ.setdefault("E2B_VOLUME_API_URL", os.environ["E2B_API_URL"])
    from e2b import Volume

    vol = Volume.create(f"gvisor-{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(SandboxException) as e:
            Sandbox.create(volume_mounts={"/mnt/v": vol})
        assert "400" in str(e.value) and "built-in runtime" in str(e.value), str(e.value)
    finally:
        Volume.destroy(vol.volume_id)
