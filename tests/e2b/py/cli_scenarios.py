"""The unmodified e2b CLI (@e2b/cli 2.19.0, installed in tests/e2b/js) against the gateway:
listing, inspecting, logs (one-shot and followed), pause, resume and kill, and listing and
deleting templates built with the SDK, and building one from a Dockerfile (`template create`).

Needs E2B_API_URL and E2B_API_KEY (the CLI reads both) and E2B_CLI, the CLI's executable.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import pytest
from e2b import Sandbox, Template

CLI = os.environ["E2B_CLI"]


def run_cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CLI, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "NO_COLOR": "1"},
    )


def cli(*args: str, timeout: float = 60) -> str:
    r = run_cli(*args, timeout=timeout)
    assert r.returncode == 0, f"e2b {' '.join(args)}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def kill_quietly(s: Sandbox) -> None:
    try:
        s.kill()
    except Exception:  # already gone: a test may have killed it through the CLI
        pass


def listed(*args: str) -> dict[str, dict]:
    return {s["sandboxId"]: s for s in json.loads(cli("sandbox", "list", "--format", "json", *args))}


def test_the_cli_lists_inspects_pauses_resumes_and_kills():
    s = Sandbox.create(metadata={"who": "cli-test"}, timeout=300)
    other = Sandbox.create(timeout=300)
    try:
        running = listed()
        assert s.sandbox_id in running and other.sandbox_id in running, running
        assert running[s.sandbox_id]["metadata"] == {"who": "cli-test"}
        only = listed("--metadata", "who=cli-test")
        assert list(only) == [s.sandbox_id], only
        assert s.sandbox_id in cli("sandbox", "info", s.sandbox_id)

        cli("sandbox", "pause", s.sandbox_id)
        assert s.sandbox_id not in listed()
        assert listed("--state", "paused")[s.sandbox_id]["state"] == "paused"
        cli("sandbox", "resume", s.sandbox_id)
        assert listed()[s.sandbox_id]["state"] == "running"
        assert s.commands.run("echo back").stdout == "back\n"

        cli("sandbox", "kill", s.sandbox_id, other.sandbox_id)
        left = listed("--state", "running,paused")
        assert s.sandbox_id not in left and other.sandbox_id not in left, left
    finally:
        for x in (s, other):
            kill_quietly(x)


def test_the_cli_shows_and_follows_a_sandboxes_logs():
    s = Sandbox.create(timeout=300)
    try:
        s.commands.run("echo to-the-log")
        # Every line the gateway keeps is one the CLI can read (it parses each as JSON and
        # stopped at the first that was not).
        shown = cli("sandbox", "logs", s.sandbox_id, "--format", "json", "--level", "debug")
        lines = [json.loads(l) for l in shown.splitlines() if l.strip()]
        messages = [l.get("message", "") for l in lines]
        assert any(m.startswith("claimed") for m in messages), shown
        assert any("process exited" in m for m in messages), shown
        assert all(l["logger"] in ("node", "agent") for l in lines), shown
        pretty = cli("sandbox", "logs", s.sandbox_id)
        assert "claimed" in pretty and "INFO" in pretty, pretty
        only_node = cli("sandbox", "logs", s.sandbox_id, "--loggers", "node", "--format", "json")
        assert only_node.strip() and all(
            json.loads(l)["logger"] == "node" for l in only_node.splitlines() if l.strip()
        ), only_node

        # Followed: a line logged later shows up, and the CLI ends when the sandbox does.
        follow = subprocess.Popen(
            [CLI, "sandbox", "logs", s.sandbox_id, "--follow", "--format", "json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "NO_COLOR": "1"},
        )
        try:
            time.sleep(1.5)
            try:
                s.commands.run("exit 4")
            except Exception:  # the SDK raises on a non-zero exit
                pass
            time.sleep(1.5)
            s.kill()
            out, err = follow.communicate(timeout=30)
        finally:
            if follow.poll() is None:
                follow.kill()
        assert follow.returncode == 0, (out, err)
        later = [json.loads(l) for l in out.splitlines() if l.strip().startswith("{")]
        assert any("exit_code=4" in l.get("message", "") for l in later), out
    finally:
        kill_quietly(s)


def test_the_cli_execs_measures_and_snapshots():
    s = Sandbox.create(timeout=300)
    try:
        r = run_cli("sandbox", "exec", s.sandbox_id, "--", "sh", "-c", "echo out-$((6*7)); echo err >&2; exit 3")
        assert r.returncode == 3, r
        assert "out-42" in r.stdout and "err" in r.stderr, r
        r = run_cli("sandbox", "exec", s.sandbox_id, "--", "cat", stdin="piped in\n")
        assert r.returncode == 0 and r.stdout == "piped in\n", r

        assert "Memory:" in cli("sandbox", "metrics", s.sandbox_id)

        s.files.write("/home/user/state", "kept")
        made = cli("sandbox", "snapshot", "create", s.sandbox_id)
        snap = made.split("snapshot ")[1].split()[0]
        assert snap in cli("sandbox", "snapshot", "list")
        child = Sandbox.create(snap, timeout=120)
        try:
            assert child.files.read("/home/user/state") == "kept"
        finally:
            child.kill()
        cli("sandbox", "snapshot", "delete", snap)
        assert snap not in cli("sandbox", "snapshot", "list")

        assert "base" in cli("template", "list")
    finally:
        s.kill()


def test_the_cli_creates_and_connects_a_terminal_and_kills_all():
    made = cli("sandbox", "create", "base", "--detach", "--timeout", "120").strip().splitlines()[-1]
    assert made in listed(), made
    # The interactive terminal, through the gateway's pty, driven through a real pty.
    typed = "echo typed-$((6*7)) && exit\n"
    r = subprocess.run(
        ["script", "-qfec", f"{CLI} sandbox connect {made}", "/dev/null"],
        input=f"{typed}",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert "typed-42" in r.stdout, r
    assert made in listed(), "leaving the terminal leaves the sandbox running"
    # Created attached: the terminal opens at once, and leaving it ends the sandbox (the CLI
    # sets a one-second timeout as it goes).
    before = set(listed())
    r = subprocess.run(
        ["script", "-qfec", f"{CLI} sandbox create base", "/dev/null"],
        input="echo inside-$((6*7)) && exit\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert "inside-42" in r.stdout, r
    deadline = time.time() + 15
    while set(listed()) - before and time.time() < deadline:
        time.sleep(0.5)
    assert not set(listed()) - before, "the attached sandbox ended with its terminal"
    other = Sandbox.create(timeout=120)
    cli("sandbox", "kill", "--all")
    left = listed("--state", "running,paused")
    assert made not in left and other.sandbox_id not in left, left


def test_the_cli_lists_and_deletes_a_template_the_sdk_built():
    name = f"cli-del-{uuid.uuid4().hex[:8]}"
    t = Template().from_template("base").run_cmd("echo built > /home/user/built")
    info = Template.build(t, name)
    listed_templates = cli("template", "list")
    assert name in listed_templates or info.template_id in listed_templates, listed_templates
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert sbx.files.read("/home/user/built").strip() == "built"
    finally:
        sbx.kill()
    cli("template", "delete", info.template_id, "--yes")
    after = cli("template", "list")
    assert name not in after and info.template_id not in after, after
    with pytest.raises(Exception):
        Sandbox.create(name, timeout=60)
    # Deleting it again says so and fails.
    again = run_cli("template", "delete", info.template_id, "--yes")
    assert again.returncode != 0, again


def test_the_cli_builds_a_template_from_a_dockerfile(tmp_path):
    # `FROM e2bdev/base`, as e2b's own docs write it: Docker Hub is the gateway's to reach, here
    # through its mirror (a registry on loopback holding the test image under that name).
    (tmp_path / "greeting.txt").write_text("hello from the context\n")
    (tmp_path / "e2b.Dockerfile").write_text(
        "FROM e2bdev/base\n"
        "ENV GREETING=dockerfile\n"
        "RUN echo built-by-the-cli > /home/user/built.txt\n"
        "COPY greeting.txt /home/user/greeting.txt\n"
        "WORKDIR /home/user\n"
    )
    name = f"cli-dockerfile-{uuid.uuid4().hex[:8]}"
    out = cli(
        "template", "create", name, "--path", str(tmp_path),
        "--cmd", "echo started > /tmp/started; sleep infinity", "--ready-cmd", "test -f /tmp/started",
        timeout=600,
    )
    assert "e2b.Dockerfile" in out, out
    assert name in cli("template", "list")
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert sbx.files.read("/home/user/built.txt").strip() == "built-by-the-cli"
        assert sbx.files.read("/home/user/greeting.txt").strip() == "hello from the context"
        r = sbx.commands.run("echo $GREETING; pwd; cat /tmp/started; cat /etc/os-release | head -1")
        lines = r.stdout.splitlines()
        assert lines[:3] == ["dockerfile", "/home/user", "started"], lines
    finally:
        sbx.kill()
    # `template list --format json` shows it; deleting it by its id takes it away.
    mine = [t for t in json.loads(cli("template", "list", "--format", "json")) if name in (t.get("aliases") or [])]
    assert len(mine) == 1, mine
    tid = mine[0]["templateID"]
    assert mine[0]["public"] is False

    def public() -> bool:
        return [t for t in json.loads(cli("template", "list", "--format", "json")) if t["templateID"] == tid][0][
            "public"
        ]

    cli("template", "publish", tid, "--yes")
    assert public() is True
    cli("template", "unpublish", tid, "--yes")
    assert public() is False
    cli("template", "delete", tid, "--yes")
    assert name not in cli("template", "list")
    # A Dockerfile whose step fails: the CLI fails and says which step.
    (tmp_path / "bad.Dockerfile").write_text("FROM e2bdev/base\nRUN exit 7\n")
    bad = run_cli(
        "template", "create", f"{name}-bad", "--path", str(tmp_path), "--dockerfile", "bad.Dockerfile",
        timeout=600,
    )
    assert bad.returncode != 0, bad
    assert "exit 7" in bad.stdout + bad.stderr, bad
