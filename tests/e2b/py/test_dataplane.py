"""What the gateway's data-plane routing does around envd, driven with the unmodified e2b
Python SDK and plain HTTP: credentials and tenants, paused sandboxes, a sandbox's own HTTP
server and an upgraded (WebSocket-style) connection on another port, malformed and oversize
frames, and /init staying the node's.

Run against a gateway (tests/e2b_dataplane.rs starts one):

    E2B_API_URL=... E2B_API_KEY=<team-a key> E2B_OTHER_API_KEY=<team-b key> \
    E2B_SANDBOX_URL=<gateway URL>        # headers mode, or
    E2B_DOMAIN=<domain>                  # domain mode ({port}-{id}.{domain} on port 443)
    python -m pytest tests/e2b/py/test_dataplane.py
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import ssl
import struct
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest
from packaging.version import Version

from e2b import Sandbox, SandboxException, SandboxNotFoundException

SANDBOX_URL = os.environ.get("E2B_SANDBOX_URL", "").rstrip("/")
DOMAIN = os.environ.get("E2B_DOMAIN", "")
KEY_B = os.environ.get("E2B_OTHER_API_KEY", "")
pytestmark = pytest.mark.skipif(
    not (SANDBOX_URL or DOMAIN) or os.environ.get("E2B_DEBUG"),
    reason="needs a gateway data plane (E2B_SANDBOX_URL or E2B_DOMAIN)",
)
ENVD = 49983


@pytest.fixture(scope="module")
def sbx():
    s = Sandbox.create(timeout=300)
    try:
        yield s
    finally:
        s.kill()


def route(s: Sandbox, port: int):
    """Base URL and headers that reach `port` of `s` through the gateway."""
    if SANDBOX_URL:
        return SANDBOX_URL, {"E2b-Sandbox-Id": s.sandbox_id, "E2b-Sandbox-Port": str(port)}
    return f"https://{s.get_host(port)}", {}


def envd_call(s: Sandbox, method: str, body: bytes = b"{}", token: str | None = None, sandbox_id=None, **kw):
    base, headers = route(s, ENVD)
    if sandbox_id:
        headers["E2b-Sandbox-Id"] = sandbox_id
    if token is not None:
        headers["X-Access-Token"] = token
    headers.setdefault("Content-Type", "application/json")
    headers.update(kw.pop("headers", {}))
    return httpx.post(f"{base}{method}", content=body, headers=headers, timeout=30, **kw)


def test_only_the_sandboxs_own_token_opens_envd(sbx):
    ok = envd_call(sbx, "/process.Process/List", token=sbx._envd_access_token)
    assert ok.status_code == 200, ok.text
    for bad in ["", "not-a-token", sbx._envd_access_token + "x"]:
        r = envd_call(sbx, "/process.Process/List", token=bad)
        assert r.status_code == 401, (bad, r.status_code, r.text)
    assert envd_call(sbx, "/process.Process/List").status_code == 401
    base, headers = route(sbx, ENVD)
    assert httpx.get(f"{base}/envs", headers=headers).status_code == 401
    # Health needs no token, as on e2b.
    assert httpx.get(f"{base}/health", headers=headers).status_code == 204
    # The node's /init is not reachable from outside, whatever the token.
    r = envd_call(sbx, "/init", token=sbx._envd_access_token)
    assert r.status_code == 403, r.text


def test_other_tenants_sandboxes_are_out_of_reach(sbx):
    theirs = Sandbox.create(timeout=120, api_key=KEY_B)
    try:
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(theirs.sandbox_id)
        # Our token, their sandbox: refused by the sandbox's agent; their work is untouched.
        if SANDBOX_URL:
            r = envd_call(sbx, "/process.Process/List", token=sbx._envd_access_token, sandbox_id=theirs.sandbox_id)
            assert r.status_code == 401, r.text
        theirs.commands.run("echo theirs > /tmp/t")
        assert theirs.files.read("/tmp/t") == "theirs\n"
    finally:
        theirs.kill()
    # A sandbox that does not exist answers as e2b's edge does.
    base, headers = route(sbx, ENVD)
    if SANDBOX_URL:
        headers["E2b-Sandbox-Id"] = "sb-0000000000000000"
        r = httpx.get(f"{base}/health", headers=headers)
    else:
        r = httpx.get(f"https://49983-sb-0000000000000000.{DOMAIN}/health")
    assert r.status_code == 502 and "The sandbox was not found" in r.json()["message"]


def test_base_has_python_pip_and_sudo_as_e2bs(sbx):
    got = sbx.commands.run("python --version; pip --version; command -v sudo").stdout
    assert got.startswith("Python 3."), got
    assert "pip " in got and got.rstrip().endswith("/sudo"), got
    # gVisor runs every process with no_new_privs, so setuid sudo cannot work there (README).
    if os.environ.get("SANDBOX_RUNTIME") != "gvisor":
        assert sbx.commands.run("sudo -n whoami", user="user").stdout == "root\n"


def test_a_command_waited_on_when_its_sandbox_is_killed_says_so():
    own = Sandbox.create(timeout=60)
    h = own.commands.run("echo started; sleep 60", background=True)
    time.sleep(0.3)
    threading.Timer(0.5, own.kill).start()
    t0 = time.time()
    with pytest.raises(SandboxException) as e:
        h.wait()
    # The SDK asks envd's /health why the stream ended; a 502 naming the sandbox gone makes
    # it the SDK's "not running" error, promptly, rather than a transport error. SDKs before
    # that probe (2.50) call any broken stream a timeout.
    assert time.time() - t0 < 10
    if Version(importlib.metadata.version("e2b")) >= Version("2.63.0"):
        assert "killed or reached its" in str(e.value), repr(e.value)
    else:
        assert "sandbox timeout" in str(e.value), repr(e.value)
    assert not own.is_running()


def test_a_paused_sandbox_is_not_running_until_connected():
    s = Sandbox.create(timeout=300)
    try:
        s.commands.run("echo kept > /home/user/kept")
        assert s.pause() in (True, None)
        assert s.is_running() is False
        with pytest.raises(SandboxException):
            s.commands.run("true", request_timeout=10)
        s2 = Sandbox.connect(s.sandbox_id)
        assert s2.is_running()
        assert s2.files.read("/home/user/kept") == "kept\n"
        assert s2.commands.run("echo back").stdout == "back\n"
    finally:
        s.kill()


def test_pausing_ends_the_streams_into_the_sandbox():
    # A frozen sandbox answers nothing, so its node cuts the connections into it at the pause
    # (the gateway's own tunnels to its embedded node included): a client following a command
    # sees the stream end at once instead of waiting on it for good.
    s = Sandbox.create(timeout=300)
    try:
        h = s.commands.run("sleep 600", background=True)
        assert s.commands.run("echo ready").stdout == "ready\n"
        ended: list[BaseException | None] = []

        def follow():
            try:
                h.wait()
                ended.append(None)
            except BaseException as e:  # the stream's end, as the SDK reports it
                ended.append(e)

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), "the command is still running"
        t0 = time.time()
        assert s.pause() in (True, None)
        t.join(15)
        assert not t.is_alive(), "the stream into the paused sandbox was left open"
        assert time.time() - t0 < 15
        assert ended and ended[0] is not None, "a cut stream is an error, not an exit"
    finally:
        s.kill()


def test_a_server_inside_is_reachable_on_its_port(sbx):
    sbx.files.write("/home/user/site/index.html", "<h1>inside</h1>")
    sbx.commands.run("cd /home/user/site && python3 -m http.server 8000 >/dev/null 2>&1", background=True)
    base, headers = route(sbx, 8000)
    deadline = time.time() + 20
    while True:
        r = httpx.get(f"{base}/index.html", headers=headers)
        if r.status_code == 200 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200 and r.text == "<h1>inside</h1>", r.text
    # Streaming both ways: a large body up and down through a server of our own.
    sbx.files.write("/home/user/site/big.bin", os.urandom(8 << 20))
    got = httpx.get(f"{base}/big.bin", headers=headers)
    assert len(got.content) == 8 << 20
    # A port nobody listens on.
    base, headers = route(sbx, 8001)
    r = httpx.get(f"{base}/", headers=headers)
    assert r.status_code == 502
    assert "port is not open" in r.json()["message"]


ECHO = r"""
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8002)); s.listen()
def serve(c):
    head = b""
    while b"\r\n\r\n" not in head:
        head += c.recv(1024)
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
    rest = head.split(b"\r\n\r\n", 1)[1]
    if rest: c.sendall(rest)
    while True:
        d = c.recv(65536)
        if not d: break
        c.sendall(d.upper())
    c.close()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
"""


def _connect(url: str):
    u = urlparse(url)
    port = u.port or (443 if u.scheme == "https" else 80)
    raw = socket.create_connection((u.hostname, port), timeout=20)
    if u.scheme == "https":
        ctx = ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE"))
        ctx.set_alpn_protocols(["http/1.1"])
        raw = ctx.wrap_socket(raw, server_hostname=u.hostname)
    return raw


def test_upgraded_connections_are_spliced(sbx):
    sbx.files.write("/home/user/echo.py", ECHO)
    sbx.commands.run("python3 /home/user/echo.py", background=True)
    base, headers = route(sbx, 8002)
    host = urlparse(base).hostname
    # A WebSocket handshake; after the 101 the proxy splices bytes, whatever they are.
    lines = [
        "GET /ws HTTP/1.1",
        f"Host: {host}",
        "Connection: Upgrade",
        "Upgrade: websocket",
        "Sec-WebSocket-Version: 13",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode()
    deadline = time.time() + 20
    while True:
        c = _connect(base)
        c.sendall(request)
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = c.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.startswith(b"HTTP/1.1 101") or time.time() > deadline:
            break
        c.close()
        time.sleep(0.2)
    assert head.startswith(b"HTTP/1.1 101"), head
    for msg in [b"hello", b"x" * 100_000]:
        c.sendall(msg)
        got = b""
        while len(got) < len(msg):
            got += c.recv(65536)
        assert got == msg.upper()
    c.close()


def _envelope(payload: bytes, declared: int | None = None) -> bytes:
    return struct.pack(">BI", 0, len(payload) if declared is None else declared) + payload


def test_malformed_and_oversize_frames_get_errors_and_harm_nothing(sbx):
    connect = {"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}
    start = b'{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]}}'
    cases = [
        _envelope(start, declared=len(start) + 50),  # shorter than it says
        _envelope(b"{not json"),
        _envelope(b"x" * 16, declared=256 << 20),  # claims 256 MiB
        b"\x00\x00",  # not even a header
    ]
    for body in cases:
        r = envd_call(sbx, "/process.Process/Start", body, token=sbx._envd_access_token, headers=connect)
        text = r.content
        assert r.status_code != 200 or b'"error"' in text, (body[:20], r.status_code, text[:200])
    r = envd_call(sbx, "/filesystem.Filesystem/Stat", b"[[[", token=sbx._envd_access_token)
    assert r.status_code == 400, r.text
    # The sandbox is fine.
    assert sbx.commands.run("echo still fine").stdout == "still fine\n"
