"""Template builds with the unmodified e2b Python SDK (e2b 2.63.0, `Template` and
`AsyncTemplate`) against the gateway: builds from `base` with every instruction and helper,
sandboxes made from the result, start and ready commands, failing builds and the step they
point at, the cache, background builds, names, tags and tenancy.

Run by tests/e2b_templates.rs against a gateway whose node builds on the built-in runtime:

    E2B_API_URL=... E2B_API_KEY=... E2B_OTHER_API_KEY=<another team's key>
    python -m pytest tests/e2b/py/template_scenarios.py
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
import uuid

import pytest

from e2b import (
    AsyncTemplate,
    BuildException,
    Sandbox,
    Template,
    wait_for_file,
    wait_for_port,
    wait_for_process,
    wait_for_timeout,
    wait_for_url,
)

OTHER = {"api_key": os.environ["E2B_OTHER_API_KEY"]}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(sbx: Sandbox, cmd: str, user: str | None = None) -> str:
    return sbx.commands.run(cmd, user=user).stdout.strip()


def attrs(fmt: str, path: str) -> str:
    """A command printing attributes of `path` (find's -printf: the runsc build Debian ships
    fails coreutils' statx with EINVAL, and the scenarios run on gVisor too)."""
    return f"find {path} -maxdepth 0 -printf '{fmt}'"


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    d = tmp_path_factory.mktemp("context")
    (d / "app" / "sub").mkdir(parents=True)
    (d / "app" / "hello.txt").write_text("hello from the context\n")
    (d / "app" / "sub" / "deep.txt").write_text("deep\n")
    (d / "app" / "link").symlink_to("hello.txt")
    (d / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    (d / "notes").mkdir()
    (d / "notes" / "a.md").write_text("a\n")
    (d / "notes" / "b.md").write_text("b\n")
    return d


def test_a_build_with_every_instruction_makes_the_sandboxes_it_describes(context):
    logs = []
    t = (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("app", "/home/user/app")
        .copy("tool.sh", "/opt/bin/tool", user="root", mode=0o755)
        .copy("notes/*.md", "/srv/notes/")
        .run_cmd("echo $(whoami) > /home/user/built-as; echo visible-output")
        .run_cmd("id -u > /made-by-root", user="root")
        .set_envs({"GREETING": "hello", "EMPTY": ""})
        # Expanded as upstream: against a root login shell, not earlier ENV values; command
        # substitution is never run.
        .set_envs({"EXPANDED": "$HOME/x:${GREETING:-unset}", "LITERAL": "$(id -u) \\$HOME"})
        .run_cmd('echo "$GREETING" > /home/user/greeting')
        .make_dir("/home/user/data/deep", mode=0o700)
        .make_symlink("/home/user/app/hello.txt", "/home/user/hello-link")
        .run_cmd("echo gone > /home/user/old && echo kept > /home/user/moving")
        .remove("/home/user/old")
        .rename("/home/user/moving", "/home/user/moved")
        .set_user("root")
        .run_cmd("whoami > /tmp-whoami && mv /tmp-whoami /whoami-after-set-user")
        .set_user("user")
        .set_workdir("/home/user/work")
    )
    info = Template.build(t, unique("every"), on_build_logs=logs.append)
    messages = [e.message for e in logs]
    assert any(m.startswith("Build finished") for m in messages), messages
    assert any(m.endswith("[stdout]: visible-output") for m in messages), messages
    assert any(m.startswith("[builder 4/") and "RUN echo" in m for m in messages), messages

    sbx = Sandbox.create(info.name, timeout=120)
    try:
        assert run(sbx, "cat /home/user/app/hello.txt") == "hello from the context"
        assert run(sbx, "cat /home/user/app/sub/deep.txt") == "deep"
        assert run(sbx, "readlink /home/user/app/link") == "hello.txt"
        assert run(sbx, attrs("%u:%g", "/home/user/app/hello.txt")) == "user:user"
        assert run(sbx, attrs("%u:%m", "/opt/bin/tool")) == "root:755"
        assert run(sbx, "/opt/bin/tool") == "tool ran"
        assert run(sbx, "find /srv/notes -mindepth 1 -printf '%f\\n' | sort") == "a.md\nb.md"
        assert run(sbx, "cat /home/user/built-as") == "user"
        assert run(sbx, "cat /made-by-root") == "0"
        assert run(sbx, "cat /home/user/greeting") == "hello"
        assert run(sbx, attrs("%m", "/home/user/data/deep")) == "700"
        assert run(sbx, "readlink /home/user/hello-link") == "/home/user/app/hello.txt"
        assert run(sbx, "[ -e /home/user/old ] || echo missing") == "missing"
        assert run(sbx, "cat /home/user/moved") == "kept"
        assert run(sbx, "cat /whoami-after-set-user") == "root"
        # The final context: user, working directory and (a gateway extension) environment.
        assert run(sbx, "whoami") == "user"
        assert run(sbx, "pwd") == "/home/user/work"
        assert run(sbx, attrs("%u", "/home/user/work")) == "user"
        assert run(sbx, "echo $GREETING") == "hello"
        assert run(sbx, 'echo "$EXPANDED|$LITERAL"') == "/root/x:unset|$(id -u) $HOME"
        # Finalize's configuration, as upstream.
        assert "TEMPLATE_ID=" + info.template_id in run(sbx, "cat /.e2b")
        assert run(sbx, attrs("%m", "/code")) == "777"
    finally:
        sbx.kill()


def test_start_and_ready_commands_run_before_the_sandbox_is_handed_out(context):
    t = (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("app", "/home/user/site")
        .set_workdir("/home/user/site")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )
    info = Template.build(t, unique("server"))
    sbx = Sandbox.create(info.name, timeout=120)
    try:
        # No waiting: the server answers as soon as the create returns.
        page = run(sbx, "curl -s --max-time 5 http://127.0.0.1:8000/hello.txt")
        assert page == "hello from the context"
        assert run(sbx, "pgrep -f 'http.server 8000' >/dev/null && echo up") == "up"
    finally:
        sbx.kill()


@pytest.mark.parametrize(
    "ready",
    [
        wait_for_url("http://127.0.0.1:8001/", 200),
        wait_for_process("python3"),
        wait_for_file("/tmp/started"),
        wait_for_timeout(1000),
    ],
    ids=["url", "process", "file", "timeout"],
)
def test_each_ready_helper(ready):
    t = (
        Template()
        .from_template("base")
        .set_start_cmd("touch /tmp/started && python3 -m http.server 8001", ready)
    )
    info = Template.build(t, unique("ready"))
    sbx = Sandbox.create(info.name, timeout=60)
    try:
        assert run(sbx, "test -f /tmp/started && echo yes") == "yes"
    finally:
        sbx.kill()


def test_a_failing_step_fails_the_build_and_names_its_step():
    t = Template().from_template("base").run_cmd("echo fine").run_cmd("echo oops >&2; exit 3")
    with pytest.raises(BuildException) as e:
        Template.build(t, unique("fails"))
    assert "exit status 3" in str(e.value)
    # The traceback points at the builder call that failed (reason.step = "2").
    tb = "".join(__import__("traceback").format_tb(e.value.__traceback__))
    assert 'run_cmd("echo oops >&2; exit 3")' in tb, tb

    info = Template.build_in_background(t, unique("fails-bg"))
    status = Template.get_build_status(info)
    deadline = time.time() + 60
    while status.status.value in ("building", "waiting") and time.time() < deadline:
        time.sleep(0.2)
        status = Template.get_build_status(info)
    assert status.status.value == "error"
    assert status.reason.step == "2" and "exit status 3" in status.reason.message


def test_a_failing_ready_command_fails_at_finalize():
    t = Template().from_template("base").set_start_cmd("sleep 1; exit 7", "exit 1")
    info = Template.build_in_background(t, unique("never-ready"))
    deadline = time.time() + 900
    status = Template.get_build_status(info)
    while status.status.value in ("building", "waiting") and time.time() < deadline:
        time.sleep(0.5)
        status = Template.get_build_status(info)
    assert status.status.value == "error", status
    assert status.reason.step == "finalize"


def test_an_unknown_parent_fails_at_base():
    t = Template().from_template(unique("nothing-here")).run_cmd("true")
    with pytest.raises(BuildException) as e:
        Template.build(t, unique("orphan"))
    assert "not found" in str(e.value)


def test_an_unchanged_rebuild_comes_from_the_cache(context):
    name = unique("cached")
    t = (
        Template(file_context_path=str(context))
        .from_template("base")
        .copy("app", "/home/user/app")
        .run_cmd("sleep 2 && echo slow > /home/user/slow")
        .set_envs({"A": "1"})
        .run_cmd("echo $A > /home/user/a")
        .set_workdir("/home/user/app")
    )
    first = Template.build(t, name)
    logs = []
    again = Template.build(t, name, on_build_logs=logs.append)
    messages = [e.message for e in logs]
    assert again.template_id == first.template_id
    # Every step comes from the cache: none of them is announced as run (how long a rebuild
    # takes is measured by the bench, not asserted here; on gVisor the build also makes the
    # template's copy for boots before it says ready).
    assert sum(m.startswith("CACHED") for m in messages) >= 5, messages
    assert any("already cached" in m for m in messages), messages
    ran = [m for m in messages if "[builder " in m and not m.startswith("CACHED")]
    assert ran == [], messages
    # skip_cache runs every step again.
    logs.clear()
    Template.build(t, name, skip_cache=True, on_build_logs=logs.append)
    assert not any(e.message.startswith("CACHED") for e in logs)
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert run(sbx, "cat /home/user/a /home/user/slow") == "1\nslow"
    finally:
        sbx.kill()


def test_a_template_built_on_a_built_template_stacks_on_it(context):
    parent = Template.build(
        Template().from_template("base").run_cmd("echo parent > /home/user/p"),
        unique("parent"),
    )
    child = Template.build(
        Template().from_template(parent.name).run_cmd("rm /home/user/p && echo child > /home/user/c"),
        unique("child"),
    )
    sbx = Sandbox.create(child.name, timeout=60)
    try:
        assert run(sbx, "cat /home/user/c; [ -e /home/user/p ] || echo gone") == "child\ngone"
    finally:
        sbx.kill()


def test_background_builds_report_building_then_ready():
    t = Template().from_template("base").run_cmd("sleep 1")
    info = Template.build_in_background(t, unique("bg"))
    assert Template.get_build_status(info).status.value == "building"
    deadline = time.time() + 120
    while Template.get_build_status(info).status.value == "building" and time.time() < deadline:
        time.sleep(0.2)
    assert Template.get_build_status(info).status.value == "ready"
    assert Template.exists(info.name)


def test_names_exist_for_their_team_only():
    assert Template.exists("base")
    assert not Template.exists(unique("missing"))
    name = unique("mine")
    info = Template.build(Template().from_template("base").run_cmd("true"), name)
    assert Template.exists(name)
    # Another team sees that the name is taken (403 → True) but cannot start or build on it.
    assert Template.exists(name, **OTHER)
    with pytest.raises(Exception):
        Sandbox.create(name, timeout=30, **OTHER)
    with pytest.raises(Exception):
        Sandbox.create(info.template_id, timeout=30, **OTHER)
    with pytest.raises(BuildException):
        Template.build(Template().from_template(name).run_cmd("true"), unique("theirs"), **OTHER)
    # Its own template of the same name is another template.
    theirs = Template.build(Template().from_template("base").run_cmd("true"), name, **OTHER)
    assert theirs.template_id != info.template_id


def test_the_async_template():
    async def main():
        info = await AsyncTemplate.build(
            AsyncTemplate().from_template("base").run_cmd("echo async > /home/user/x"),
            unique("async"),
        )
        assert await AsyncTemplate.exists(info.name)
        return info

    info = asyncio.run(main())
    sbx = Sandbox.create(info.name, timeout=60)
    try:
        assert run(sbx, "cat /home/user/x") == "async"
    finally:
        sbx.kill()


def api(method: str, path: str, key: str | None = None, **kw):
    import httpx

    return httpx.request(
        method,
        os.environ["E2B_API_URL"].rstrip("/") + path,
        headers={"X-API-KEY": key or os.environ["E2B_API_KEY"]},
        timeout=60,
        **kw,
    )


def test_tags_listing_publishing_and_deletion():
    name = unique("tagged")
    v1 = Template.build(Template().from_template("base").run_cmd("echo v1 > /home/user/v"), name)
    assigned = Template.assign_tags(f"{name}:default", ["stable"])
    assert str(assigned.build_id) == v1.build_id and assigned.tags == ["stable"]
    v2 = Template.build(
        Template().from_template("base").run_cmd("echo v2 > /home/user/v"), f"{name}:v2"
    )
    assert v2.template_id == v1.template_id
    tags = {t.tag: str(t.build_id) for t in Template.get_tags(name)}
    assert tags == {"default": v1.build_id, "stable": v1.build_id, "v2": v2.build_id}, tags
    for asked, want in [(name, "v1"), (f"{name}:stable", "v1"), (f"{name}:v2", "v2")]:
        sbx = Sandbox.create(asked, timeout=60)
        try:
            assert run(sbx, "cat /home/user/v") == want, asked
        finally:
            sbx.kill()
    Template.remove_tags(name, ["stable"])
    with pytest.raises(Exception):
        Sandbox.create(f"{name}:stable", timeout=30)
    for bad in [":x", "name:"]:
        with pytest.raises(Exception):
            Template.assign_tags(bad, ["t"])
    assert api("DELETE", "/templates/tags", json={"name": name, "tags": ["default"]}).status_code == 400

    # Listed for its team only, with its builds.
    mine = {t["templateID"]: t for t in api("GET", "/templates").json()}
    assert mine[v1.template_id]["aliases"] == [name], mine[v1.template_id]
    assert mine[v1.template_id]["buildStatus"] == "ready"
    assert "base" in mine
    theirs = {t["templateID"] for t in api("GET", "/templates", OTHER["api_key"]).json()}
    assert v1.template_id not in theirs
    got = api("GET", f"/templates/{v1.template_id}").json()
    assert [b["buildID"] for b in got["builds"]] == [v1.build_id, v2.build_id], got
    assert api("GET", f"/templates/{v1.template_id}", OTHER["api_key"]).status_code == 403

    # Published, another team may start it; unpublished, not.
    r = api("PATCH", f"/v2/templates/{v1.template_id}", json={"public": True})
    assert r.status_code == 200 and r.json()["names"] == [f"team-a/{name}"], r.text
    sbx = Sandbox.create(name, timeout=60, **OTHER)
    try:
        assert run(sbx, "cat /home/user/v") == "v1"
    finally:
        sbx.kill()
    assert api("PATCH", f"/templates/{v1.template_id}", json={"public": False}).status_code == 200
    with pytest.raises(Exception):
        Sandbox.create(name, timeout=30, **OTHER)

    # Deleted: not while a sandbox uses it, then gone.
    sbx = Sandbox.create(name, timeout=60)
    try:
        r = api("DELETE", f"/templates/{v1.template_id}")
        assert r.status_code == 400 and "running sandboxes" in r.json()["message"], r.text
    finally:
        sbx.kill()
    assert api("DELETE", f"/templates/{v1.template_id}", OTHER["api_key"]).status_code in (403, 404)
    assert api("DELETE", f"/templates/{v1.template_id}").status_code == 204
    assert not Template.exists(name)
    with pytest.raises(Exception):
        Sandbox.create(name, timeout=30)
    assert api("DELETE", f"/templates/{v1.template_id}").status_code == 404


def test_apt_install_from_a_local_package_source(tmp_path):
    # A package made here, in a flat repository the build copies in; Debian's own sources go
    # first, so no step needs the internet.
    pkg = tmp_path / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "usr" / "bin").mkdir(parents=True)
    control = (
        "Package: sgw-hello\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: tests <tests@example.invalid>\nDescription: says hello\n"
    )
    (pkg / "DEBIAN" / "control").write_text(control)
    tool = pkg / "usr" / "bin" / "sgw-hello"
    tool.write_text("#!/bin/sh\necho hello from a package\n")
    tool.chmod(0o755)
    repo = tmp_path / "ctx" / "repo"
    repo.mkdir(parents=True)
    deb_path = repo / "sgw-hello_1.0_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(pkg), str(deb_path)],
        check=True,
        capture_output=True,
    )
    deb = deb_path.read_bytes()
    packages = (
        control
        + f"Filename: ./{deb_path.name}\nSize: {len(deb)}\nSHA256: {hashlib.sha256(deb).hexdigest()}\n\n"
    ).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Release").write_text(
        "Origin: tests\nLabel: tests\nSuite: local\nCodename: local\n"
        "Date: Thu, 01 Jan 2026 00:00:00 UTC\nArchitectures: all amd64\nSHA256:\n"
        f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
    )
    t = (
        Template(file_context_path=str(tmp_path / "ctx"))
        .from_template("base")
        .copy("repo", "/opt/repo", user="root")
        .run_cmd(
            "rm -f /etc/apt/sources.list /etc/apt/sources.list.d/* && "
            "echo 'deb [trusted=yes] file:/opt/repo ./' > /etc/apt/sources.list.d/local.list",
            user="root",
        )
        .apt_install(["sgw-hello"], no_install_recommends=True)
    )
    name = unique("apt")
    Template.build(t, name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert run(sbx, "sgw-hello") == "hello from a package"
        assert run(sbx, "dpkg-query -W -f '${Version}' sgw-hello") == "1.0"
    finally:
        sbx.kill()
