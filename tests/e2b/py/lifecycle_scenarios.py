"""Sandbox lifecycle with the unmodified e2b Python SDK: `lifecycle={"on_timeout": "pause"}`
pauses at the end of the timeout instead of killing, with the processes' memory kept;
`auto_resume` wakes a paused sandbox when its data plane is reached; time spent paused does
not consume the timeout, a paused sandbox is kept until the node's paused retention ends, and
connect grants a fresh timeout. Run by tests/e2b_lifecycle.rs against a gateway whose node
keeps paused sandboxes for PAUSED_RETENTION seconds.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

import pytest

from e2b import CommandExitException, Sandbox, SandboxException, SandboxQuery, SandboxState
from e2b.exceptions import InvalidArgumentException, NotFoundException, ServiceBusyException


RETENTION = int(os.environ["PAUSED_RETENTION"])

# A counter that lives only in the process's memory; the file shows it and the pid.
COUNTER = (
    "python3 -c \"import os, time\n"
    "n = 0\n"
    "while True:\n"
    "    n += 1\n"
    "    open('/tmp/n.tmp', 'w').write(f'{os.getpid()} {n}')\n"
    "    os.replace('/tmp/n.tmp', '/tmp/n')\n"
    "    time.sleep(0.1)\n\""
)


def counter(sbx: Sandbox) -> tuple[int, int]:
    pid, n = sbx.commands.run("cat /tmp/n").stdout.split()
    return int(pid), int(n)


def wait_state(sandbox_id: str, state: str, within: float):
    deadline = time.monotonic() + within
    while True:
        info = Sandbox.get_info(sandbox_id)
        if info.state.value == state:
            return info
        assert time.monotonic() < deadline, f"{sandbox_id} stayed {info.state.value}"
        time.sleep(0.25)


def wait_gone(sandbox_id: str, within: float, why: str):
    deadline = time.monotonic() + within
    while True:
        try:
            Sandbox.get_info(sandbox_id)
        except NotFoundException:
            return
        assert time.monotonic() < deadline, why
        time.sleep(0.25)


def paused_until(sandbox_id: str) -> datetime:
    """The gateway's `pausedUntil` (beyond e2b's fields) from the SDK's generated client."""
    from e2b.api import ApiClient
    from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id
    from e2b.connection_config import ConnectionConfig

    got = get_sandboxes_sandbox_id.sync_detailed(sandbox_id, client=ApiClient(ConnectionConfig()))
    assert got.status_code == 200, got.content
    return datetime.fromisoformat(got.parsed.additional_properties["pausedUntil"])


def seconds_until(t: datetime) -> float:
    return (t - datetime.now(timezone.utc)).total_seconds()


def start_counter(sbx: Sandbox) -> tuple[int, int]:
    sbx.commands.run(COUNTER, background=True)
    deadline = time.monotonic() + 10
    while sbx.commands.run("test -s /tmp/n || echo no").stdout.strip() == "no":
        assert time.monotonic() < deadline, "the counter never started"
        time.sleep(0.1)
    return counter(sbx)


def test_timeout_pauses_and_traffic_resumes_with_memory():
    sbx = Sandbox.create(timeout=8, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        pid, n1 = start_counter(sbx)
        wait_state(sbx.sandbox_id, "paused", within=20)
        # Paused, it is kept until the retention ends, not until its old deadline.
        assert RETENTION - 5 < seconds_until(paused_until(sbx.sandbox_id)) <= RETENTION + 1
        frozen = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in frozen]
        time.sleep(1.5)
        # Reaching the data plane wakes it: the same process, still counting from its memory.
        pid2, n2 = counter(sbx)
        assert pid2 == pid and n2 > n1, (pid, n1, pid2, n2)
        running = Sandbox.get_info(sbx.sandbox_id)
        assert running.state.value == "running"
        # Resuming granted the timeout again.
        assert 2 < seconds_until(running.end_at) <= 9
        time.sleep(0.5)
        assert counter(sbx)[1] > n2
        # And it pauses again at the end of the new lease.
        wait_state(sbx.sandbox_id, "paused", within=20)
    finally:
        sbx.kill()


def test_paused_time_does_not_consume_the_timeout():
    sbx = Sandbox.create(timeout=3)
    try:
        pid, n1 = start_counter(sbx)
        sbx.pause()
        # Well past the deadline it had when it was paused: still there, still paused.
        time.sleep(5)
        assert Sandbox.get_info(sbx.sandbox_id).state.value == "paused"
        # Its lease does not run, so there is none to set (409, as on e2b).
        with pytest.raises(SandboxException):
            Sandbox.set_timeout(sbx.sandbox_id, 30)
        # Without auto_resume the data plane does not wake it.
        with pytest.raises(SandboxException):
            sbx.commands.run("true", request_timeout=10)
        again = Sandbox.connect(sbx.sandbox_id, timeout=30)
        pid2, n2 = counter(again)
        assert pid2 == pid and n2 >= n1
        assert 20 < seconds_until(Sandbox.get_info(sbx.sandbox_id).end_at) <= 31
    finally:
        sbx.kill()


def test_timeout_pause_without_auto_resume_waits_for_connect():
    sbx = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause"})
    try:
        assert Sandbox.get_info(sbx.sandbox_id).lifecycle == {
            "on_timeout": "pause",
            "auto_resume": False,
        }
        sbx.commands.run("echo kept > /tmp/kept")
        wait_state(sbx.sandbox_id, "paused", within=20)
        with pytest.raises(SandboxException):
            sbx.commands.run("true", request_timeout=10)
        again = Sandbox.connect(sbx.sandbox_id)
        assert again.commands.run("cat /tmp/kept").stdout.strip() == "kept"
    finally:
        sbx.kill()


def test_a_timeout_of_zero_ends_the_sandbox_now_with_its_on_timeout_action():
    # As upstream's test_keep_memory_none_defaults_to_full_memory: set_timeout(0) pauses a
    # sandbox that asked to be paused, with its memory (the boot id stays the same).
    sbx = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    boot = sbx.commands.run("cat /proc/sys/kernel/random/boot_id").stdout
    pid, n1 = start_counter(sbx)
    sbx.set_timeout(0)
    wait_state(sbx.sandbox_id, "paused", 15)
    assert not sbx.is_running()
    again = Sandbox.connect(sbx.sandbox_id, timeout=30)
    try:
        assert again.commands.run("cat /proc/sys/kernel/random/boot_id").stdout == boot
        time.sleep(0.3)
        pid2, n2 = counter(again)
        assert pid2 == pid and n2 > n1, (pid, n1, pid2, n2)
    finally:
        again.kill()
    # One that asked to be killed is gone.
    doomed = Sandbox.create(timeout=60)
    Sandbox.set_timeout(doomed.sandbox_id, 0)
    wait_gone(doomed.sandbox_id, 15, "set_timeout(0) left the sandbox running")


def test_a_paused_sandbox_is_released_when_its_retention_ends():
    sbx = Sandbox.create(timeout=60)
    sbx.pause()
    wait_gone(sbx.sandbox_id, RETENTION + 15, "the paused sandbox outlived its retention")
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_kill_is_the_default_and_options_the_gateway_cannot_keep_are_refused():
    sbx = Sandbox.create(timeout=2)
    assert Sandbox.get_info(sbx.sandbox_id).lifecycle == {
        "on_timeout": "kill",
        "auto_resume": False,
    }
    wait_gone(sbx.sandbox_id, 20, "the sandbox outlived its timeout")
    # e2b's own rule: a filesystem-only auto-pause cannot be combined with auto_resume.
    before = len(Sandbox.list().next_items())
    with pytest.raises((SandboxException, InvalidArgumentException)):
        Sandbox.create(
            timeout=30,
            lifecycle={
                "on_timeout": {"action": "pause", "mode": "filesystem"},
                "auto_resume": True,
            },
        )
    assert len(Sandbox.list().next_items()) == before


def test_logs_show_the_lifecycle_and_each_command():
    # The SDKs ship generated clients for both log routes (the CLI uses them); drive those.
    from e2b.api import ApiClient
    from e2b.api.client.api.sandboxes import (
        get_sandboxes_sandbox_id_logs as logs_v1,
        get_v_2_sandboxes_sandbox_id_logs as logs_v2,
    )
    from e2b.api.client.models import LogLevel, LogsDirection
    from e2b.connection_config import ConnectionConfig

    api = ApiClient(ConnectionConfig())
    sbx = Sandbox.create(timeout=60)
    try:
        sbx.commands.run("echo to-the-log; exit 0")
        with pytest.raises(CommandExitException):
            sbx.commands.run("exit 3")
        sbx.pause()
        Sandbox.connect(sbx.sandbox_id)
        got = logs_v2.sync_detailed(sbx.sandbox_id, client=api)
        assert got.status_code == 200, got.content
        messages = [e.message for e in got.parsed.logs]
        joined = "\n".join(messages)
        # Boot lines (the sandbox's network helper's) may come first; then the claim.
        claimed = [m for m in messages if m.startswith("claimed as team-a/")]
        assert len(claimed) == 1, joined
        assert any("process started" in m and "echo to-the-log" in m for m in messages), joined
        assert any("process exited" in m and "exit_code=3" in m for m in messages), joined
        order = [i for i, m in enumerate(messages) if m.startswith(("paused", "resumed"))]
        assert [messages[i].split(";")[0] for i in order] == ["paused", "resumed"], joined
        # Newest first from a cursor, filtered by level and text.
        newest = logs_v2.sync_detailed(
            sbx.sandbox_id, client=api, direction=LogsDirection.BACKWARD, limit=1
        ).parsed.logs
        assert newest[0].message.startswith("resumed"), newest
        exits = logs_v2.sync_detailed(
            sbx.sandbox_id, client=api, search="process exited", level=LogLevel.INFO
        ).parsed.logs
        assert exits and all("process exited" in e.message for e in exits)
        later = int(got.parsed.logs[-1].timestamp.timestamp() * 1000) + 1
        assert logs_v2.sync_detailed(sbx.sandbox_id, client=api, cursor=later).parsed.logs == []
        # v1: lines and entries from `start` on.
        v1 = logs_v1.sync_detailed(sbx.sandbox_id, client=api, start=0, limit=2)
        assert v1.status_code == 200, v1.content
        # Each v1 line is a JSON object, as e2b's structured logs are (the CLI parses them).
        lines = [json.loads(l.line) for l in v1.parsed.logs]
        assert [l["message"] for l in lines] == messages[:2], lines
        assert all(l["level"] in ("debug", "info", "warn", "error") for l in lines), lines
        assert all(l["logger"] in ("node", "agent") for l in lines), lines
        assert len(v1.parsed.log_entries) == 2
        bad = logs_v2.sync_detailed(sbx.sandbox_id, client=api, limit=0)
        assert bad.status_code == 400, bad.content
        other = ApiClient(ConnectionConfig(api_key=os.environ["E2B_OTHER_API_KEY"]))
        assert logs_v2.sync_detailed(sbx.sandbox_id, client=other).status_code == 404
    finally:
        sbx.kill()
    # A killed sandbox's log stays readable for a while, as on e2b (the CLI reads it to show
    # why a sandbox ended), ending with the line that says so; to its own team only.
    kept = logs_v2.sync_detailed(sbx.sandbox_id, client=api)
    assert kept.status_code == 200, kept.content
    assert kept.parsed.logs[-1].message == "sandbox ended: released", kept.parsed.logs[-1]
    assert logs_v2.sync_detailed(sbx.sandbox_id, client=other).status_code == 404
    # A sandbox that never was: not found.
    never = logs_v2.sync_detailed("sb-0000000000000000", client=api)
    assert never.status_code == 404


# ---------------------------------------------------------------------------------------------
# Filesystem-only pause: the files are kept, the processes are not, the identity is.

PAUSED_DIR = os.environ.get("PAUSED_DIR", "")


def pause_mode(sandbox_id: str):
    """`pauseMode` of GET /sandboxes/{id} (None when absent)."""
    from e2b.api import ApiClient
    from e2b.api.client.api.sandboxes import get_sandboxes_sandbox_id
    from e2b.connection_config import ConnectionConfig

    got = get_sandboxes_sandbox_id.sync_detailed(sandbox_id, client=ApiClient(ConnectionConfig()))
    assert got.status_code == 200, got.content
    parsed = got.parsed
    mode = getattr(parsed, "pause_mode", None)
    if mode is None or type(mode).__name__ == "Unset":
        mode = parsed.additional_properties.get("pauseMode")
    return getattr(mode, "value", mode)


def saved_dirs() -> list:
    return sorted(os.listdir(PAUSED_DIR)) if PAUSED_DIR else []


def init_started(sbx: Sandbox) -> str:
    """When the sandbox's PID 1 started (clock ticks since the host booted): a fresh boot of
    the built-in runtime, which shares the host's kernel and so its boot_id, changes it."""
    return sbx.commands.run("cut -d' ' -f22 /proc/1/stat").stdout.strip()


def counter_running(sbx: Sandbox) -> bool:
    """Whether the counter runs (by its command line: a fresh pid namespace reuses pids)."""
    return sbx.commands.run("pgrep -f 'n[.]tmp' || echo none").stdout.strip() != "none"


def test_a_filesystem_only_pause_keeps_files_and_identity_and_drops_processes():
    sbx = Sandbox.create(timeout=120, envs={"FSP_VAR": "kept-env"})
    try:
        sbx.commands.run("echo kept > $HOME/kept.txt")
        start_counter(sbx)
        assert counter_running(sbx)
        started = init_started(sbx)
        token = sbx._envd_access_token
        assert sbx.pause(mode="filesystem")
        info = Sandbox.get_info(sbx.sandbox_id)
        assert info.state == SandboxState.PAUSED
        assert pause_mode(sbx.sandbox_id) == "filesystem"
        assert not sbx.is_running()
        if PAUSED_DIR:
            assert len(saved_dirs()) == 1, saved_dirs()
        # Pausing a paused sandbox is a conflict (the SDK answers False), whatever the mode.
        assert Sandbox.pause(sbx.sandbox_id) is False

        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.sandbox_id == sbx.sandbox_id
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
        assert pause_mode(sbx.sandbox_id) is None
        assert again.is_running()
        # The same envd access token opens the fresh instance.
        assert again._envd_access_token == token
        assert again.commands.run("cat $HOME/kept.txt").stdout.strip() == "kept"
        assert again.commands.run("echo $FSP_VAR").stdout.strip() == "kept-env"
        assert not counter_running(again)
        assert init_started(again) != started, "the sandbox did not boot afresh"
        if PAUSED_DIR:
            assert saved_dirs() == [], "a resumed sandbox's saved files outlived its boot"

        # Paused on disk again, then killed: nothing of it remains.
        assert again.pause(mode="filesystem")
        again.kill()
        if PAUSED_DIR:
            deadline = time.monotonic() + 10
            while saved_dirs():
                assert time.monotonic() < deadline, f"saved files left: {saved_dirs()}"
                time.sleep(0.2)
    finally:
        try:
            sbx.kill()
        except SandboxException:
            pass


def test_a_filesystem_only_pause_needs_an_agent_that_answers():
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("echo before > $HOME/before.txt")
        # The sandbox's root stops its own envd (the agent that is not its init) a moment
        # after this command has answered.
        sbx.commands.run(
            "(sleep 1; kill -STOP $(pgrep -f ' agent --boot' | grep -vx 1 | head -n 1)) >/dev/null 2>&1 &",
            user="root",
        )
        time.sleep(2)
        with pytest.raises(ServiceBusyException) as e:
            sbx.pause(mode="filesystem")
        assert "503" in str(e.value) and "agent did not answer" in str(e.value), str(e.value)
        # Refused, and nothing of it changed.
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.RUNNING
        assert pause_mode(sbx.sandbox_id) is None
        if PAUSED_DIR:
            assert saved_dirs() == [], saved_dirs()
    finally:
        sbx.kill()


def test_a_filesystem_only_auto_pause_then_connect_boots_fresh():
    sbx = Sandbox.create(
        timeout=60, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}}
    )
    try:
        assert Sandbox.get_info(sbx.sandbox_id).lifecycle["on_timeout"] == "pause"
        sbx.commands.run("echo auto > $HOME/auto.txt")
        start_counter(sbx)
        started = init_started(sbx)
        sbx.set_timeout(0)
        wait_state(sbx.sandbox_id, "paused", 30)
        assert pause_mode(sbx.sandbox_id) == "filesystem"
        assert not sbx.is_running()
        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.commands.run("cat $HOME/auto.txt").stdout.strip() == "auto"
        assert not counter_running(again)
        assert init_started(again) != started
    finally:
        sbx.kill()


def test_connect_with_memory_false_cold_boots_a_full_pause():
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.commands.run("echo full > $HOME/full.txt")
        start_counter(sbx)
        started = init_started(sbx)
        assert sbx.pause()
        assert pause_mode(sbx.sandbox_id) == "full"
        again = Sandbox.connect(sbx.sandbox_id, timeout=60, on_resume="reboot")
        assert again.commands.run("cat $HOME/full.txt").stdout.strip() == "full"
        assert not counter_running(again)
        assert init_started(again) != started
        # A plain full pause and connect still keep the processes (the old counter's file
        # was kept with the files: it goes first).
        again.commands.run("rm -f /tmp/n")
        pid2, n1 = start_counter(again)
        assert again.pause()
        kept = Sandbox.connect(sbx.sandbox_id, timeout=60)
        time.sleep(0.3)
        pid3, n2 = counter(kept)
        assert pid3 == pid2 and n2 > n1
    finally:
        sbx.kill()


def test_traffic_does_not_resume_a_filesystem_only_pause():
    # auto_resume wakes a sandbox paused with its memory; one paused with its files only needs
    # a cold boot, which only connect does (as on e2b).
    sbx = Sandbox.create(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sbx.commands.run("echo woke > $HOME/woke.txt")
        assert sbx.pause(mode="filesystem")
        with pytest.raises(SandboxException):
            sbx.commands.run("true", request_timeout=10)
        assert Sandbox.get_info(sbx.sandbox_id).state == SandboxState.PAUSED
        again = Sandbox.connect(sbx.sandbox_id, timeout=60)
        assert again.commands.run("cat $HOME/woke.txt").stdout.strip() == "woke"
    finally:
        sbx.kill()
