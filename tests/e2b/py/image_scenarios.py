"""Template builds `from_image` with the unmodified e2b Python SDK (e2b 2.63.0) against the
gateway, pulling from real registries (Debian's docker-registry) that the test pushed an
image to with skopeo: anonymously over plain HTTP, with a password behind TLS, through a
mirror that stands in for Docker Hub (`from_debian_image`), from a Dockerfile, and the ones a
node must refuse.

Run by tests/e2b_templates.rs; the registries come in the environment:

    IMAGE_PLAIN=127.0.0.1:<port>/team/img:1           (anonymous, plain HTTP)
    IMAGE_AUTH=localhost:<port>/team/img:1            (TLS and a password)
    REGISTRY_USER=... REGISTRY_PASSWORD=...
    IMAGE_PRIVATE=<an image on a loopback registry the operator did not name>
"""

from __future__ import annotations

import os
import time
import uuid

import pytest

from e2b import BuildException, Sandbox, Template

PLAIN = os.environ["IMAGE_PLAIN"]
AUTH = os.environ["IMAGE_AUTH"]
USER = os.environ["REGISTRY_USER"]
PASSWORD = os.environ["REGISTRY_PASSWORD"]
PRIVATE = os.environ["IMAGE_PRIVATE"]
OTHER_KEY = os.environ["E2B_OTHER_API_KEY"]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(sbx: Sandbox, cmd: str, user: str | None = None) -> str:
    return sbx.commands.run(cmd, user=user).stdout.strip()


def refused(msg: str) -> bool:
    return "401" in msg or "not authorized" in msg.lower() or "unauthorized" in msg.lower()


def failed_at_base(t: Template, **opts) -> str:
    info = Template.build_in_background(t, unique("no-image"), **opts)
    status = Template.get_build_status(info, **{k: v for k, v in opts.items() if k == "api_key"})
    deadline = time.time() + 120
    while status.status.value in ("building", "waiting") and time.time() < deadline:
        time.sleep(0.2)
        status = Template.get_build_status(
            info, **{k: v for k, v in opts.items() if k == "api_key"}
        )
    assert status.status.value == "error", status
    assert status.reason.step == "base", status.reason
    return status.reason.message


def test_a_pulled_image_is_the_base_of_the_build():
    name = unique("from-image")
    t = Template().from_image(PLAIN).run_cmd(
        "echo $IMPORTED > /home/user/imported && id -un > /home/user/builder"
    )
    logs = []
    Template.build(t, name, on_build_logs=logs.append)
    messages = [e.message for e in logs]
    assert any(m.startswith("[base] FROM " + PLAIN) for m in messages), messages
    sbx = Sandbox.create(name, timeout=60)
    try:
        # The image's files with its second layer's whiteouts, its ENV during the build, the
        # e2b user (added, with passwordless sudo) by default, and its home as the workdir.
        assert run(sbx, "ls /opt; ls /opt/a") == "a\nnew.txt"
        assert run(sbx, "cat /home/user/imported /home/user/builder") == "yes\nuser"
        assert run(sbx, "id -un; pwd") == "user\n/home/user"
        assert run(sbx, "sudo -n id -u") == "0"
    finally:
        sbx.kill()

    # Built again: the image comes from the team's cache, nothing is pulled.
    logs.clear()
    Template.build(t, name, on_build_logs=logs.append)
    messages = [e.message for e in logs]
    assert any(m.startswith("CACHED [base] FROM " + PLAIN) for m in messages), messages
    assert not any(m.startswith("pulling") for m in messages), messages
    # skip_cache pulls it again.
    logs.clear()
    Template.build(t, name, skip_cache=True, on_build_logs=logs.append)
    assert any(e.message.startswith("pulling") for e in logs)


def test_a_registry_with_a_password_needs_it():
    name = unique("from-auth")
    t = Template().from_image(AUTH, username=USER, password=PASSWORD).run_cmd(
        "echo $IMPORTED > /home/user/imported"
    )
    Template.build(t, name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert run(sbx, "cat /home/user/imported") == "yes"
    finally:
        sbx.kill()
    # The team's cache has the image now (upstream keys it by name alone); pulled again, a
    # wrong password or none is refused by the registry.
    wrong = failed_at_base(
        Template().from_image(AUTH, username=USER, password="wrong"), skip_cache=True
    )
    assert "pulling" in wrong and refused(wrong), wrong
    anonymous = failed_at_base(Template().from_image(AUTH), skip_cache=True)
    assert refused(anonymous), anonymous
    # Another team gets nothing from this team's pull: it pulls with its own (no) password.
    other = failed_at_base(Template().from_image(AUTH), api_key=OTHER_KEY)
    assert refused(other), other


def test_a_mirror_stands_in_for_docker_hub():
    name = unique("from-debian")
    Template.build(Template().from_debian_image("stable").run_cmd("true"), name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert run(sbx, "cat /opt/a/new.txt") == "new"
    finally:
        sbx.kill()


def test_a_dockerfile_becomes_the_build():
    name = unique("from-dockerfile")
    dockerfile = f"""FROM {PLAIN}
ENV GREETING=hello
WORKDIR /srv/app
RUN echo "$GREETING from $IMPORTED" > made && id -un > who
USER user
"""
    Template.build(Template().from_dockerfile(dockerfile), name)
    sbx = Sandbox.create(name, timeout=60)
    try:
        assert run(sbx, "pwd; cat made who; id -un") == "/srv/app\nhello from yes\nroot\nuser"
    finally:
        sbx.kill()


def test_registries_a_node_must_not_reach_or_cannot_find():
    # A tenant's image reference must not become a request into the node's own network.
    msg = failed_at_base(Template().from_image(PRIVATE))
    assert "private address" in msg, msg
    msg = failed_at_base(Template().from_image("169.254.169.254/latest/meta-data:1"))
    assert "private address" in msg, msg
    msg = failed_at_base(Template().from_image(PLAIN.rsplit(":", 1)[0] + ":missing"))
    assert "pulling" in msg, msg
    msg = failed_at_base(Template().from_image("Not A Reference"))
    assert "not an image reference" in msg, msg


def test_credentials_it_cannot_use_are_refused_at_once():
    t = Template().from_aws_registry(PLAIN, "AKIA", "secret", "us-east-1")
    with pytest.raises(Exception) as e:
        Template.build(t, unique("aws"))
    assert "not supported" in str(e.value)
