"""Network policies with the unmodified e2b Python SDK: `network={"deny_out", "allow_out"}`,
`allow_internet_access` with exceptions, `update_network` reaching an open connection's next
packets, `allow_public_traffic=False` guarding the sandbox's ports with its traffic access
token, and the options that are refused by name. Run by tests/e2b_network.rs inside a private
network namespace where SERVER_A and SERVER_B are addresses of this machine that the node lets
sandboxes reach (`--sandbox-reachable`); nothing leaves the machine.
"""

from __future__ import annotations

import os
import socket
import socketserver
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from e2b import Sandbox, SandboxException, Secret
from e2b.sandbox.network import ALL_TRAFFIC

A = os.environ["SERVER_A"]
B = os.environ["SERVER_B"]
SANDBOX_URL = os.environ["E2B_SANDBOX_URL"]
RUNTIME = os.environ.get("RUNTIME", "builtin")
HTTP_PORT = 8080
ECHO_PORT = 9000
UDP_PORT = 9001


# Every request a test server answered: (server address, Host, headers), newest last.
SEEN: list = []


class Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        SEEN.append((
            self.server.server_address[0],
            self.headers.get("Host"),
            {k.lower(): v for k, v in self.headers.items()},
        ))
        if self.path == "/ws" and self.headers.get("Upgrade") == "websocket":
            # Switches protocols, then echoes one line: enough to see the pipe both ways.
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            self.wfile.write(b"echo:" + self.rfile.readline())
            self.wfile.flush()
            self.close_connection = True
            return
        body = self.server.server_address[0].encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(64):
            self.request.sendall(data)


class UdpEcho(socketserver.BaseRequestHandler):
    def handle(self):
        data, sock = self.request
        sock.sendto(data, self.client_address)


class ThreadedTCP(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def https(addr: str, cert: str, key: str) -> HTTPServer:
    server = HTTPServer((addr, 443), Hello)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    return server


@pytest.fixture(scope="module", autouse=True)
def servers():
    started = [
        HTTPServer((A, HTTP_PORT), Hello),
        HTTPServer((B, HTTP_PORT), Hello),
        ThreadedTCP((B, ECHO_PORT), Echo),
        # Port 80: where an HTTP request's Host names it to the egress proxy.
        HTTPServer((A, 80), Hello),
        HTTPServer((B, 80), Hello),
        socketserver.UDPServer((B, UDP_PORT), UdpEcho),
        # The "real" hosts of header rules (certificates made by tests/e2b_network.rs).
        https(A, os.environ["TRUSTED_CERT"], os.environ["TRUSTED_KEY"]),
        https(B, os.environ["UNTRUSTED_CERT"], os.environ["UNTRUSTED_KEY"]),
    ]
    for s in started:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield
    for s in started:
        s.shutdown()


def reaches(sbx: Sandbox, addr: str) -> bool:
    """Whether an HTTP request from inside the sandbox to `addr` is answered (by that server)."""
    out = sbx.commands.run(
        f"curl -s -m 3 http://{addr}:{HTTP_PORT}/ || echo unreachable", timeout=30
    ).stdout
    assert out in (addr, "unreachable\n"), out
    return out == addr


def test_with_no_policy_both_servers_are_reachable():
    sbx = Sandbox.create()
    try:
        assert reaches(sbx, A) and reaches(sbx, B)
        info = sbx.get_info()
        assert info.allow_internet_access is True
        assert not info.network, "nothing was asked for, nothing is reported"
    finally:
        sbx.kill()


def test_deny_out_turns_one_destination_away():
    sbx = Sandbox.create(network={"deny_out": [f"{B}/32"]})
    try:
        assert reaches(sbx, A)
        assert not reaches(sbx, B)
        info = sbx.get_info()
        assert info.network["deny_out"] == [f"{B}/32"]
        assert info.network.get("allow_out", []) == []
    finally:
        sbx.kill()


def test_deny_all_with_an_exception_lets_only_the_exception_out():
    sbx = Sandbox.create(network={"deny_out": [ALL_TRAFFIC], "allow_out": [A]})
    try:
        assert reaches(sbx, A)
        assert not reaches(sbx, B)
    finally:
        sbx.kill()


def test_internet_off_with_an_exception():
    sbx = Sandbox.create(allow_internet_access=False, network={"allow_out": [A]})
    try:
        assert reaches(sbx, A)
        assert not reaches(sbx, B)
        info = sbx.get_info()
        assert info.allow_internet_access is False
        assert info.network["allow_out"] == [A]
    finally:
        sbx.kill()


def test_an_update_reaches_open_connections_and_can_be_lifted():
    sbx = Sandbox.create()
    try:
        script = (
            "import os, socket, time\n"
            f"s = socket.create_connection(('{B}', {ECHO_PORT}), timeout=3)\n"
            "s.sendall(b'1'); assert s.recv(1) == b'1'\n"
            "open('/tmp/connected', 'w').write('1')\n"
            "while not os.path.exists('/tmp/go'): time.sleep(0.05)\n"
            "try:\n"
            "    s.sendall(b'2'); print('open' if s.recv(1) == b'2' else 'closed')\n"
            "except OSError as e:\n"
            "    print('blocked', e)\n"
        )
        sbx.files.write("/tmp/probe.py", script)
        handle = sbx.commands.run("python3 /tmp/probe.py", background=True)
        deadline = time.monotonic() + 20
        while not sbx.files.exists("/tmp/connected"):
            assert time.monotonic() < deadline, "the probe never connected"
            time.sleep(0.1)
        sbx.update_network({"deny_out": [B]})
        sbx.files.write("/tmp/go", "")
        result = handle.wait()
        assert result.stdout.startswith("blocked"), result.stdout
        assert not reaches(sbx, B) and reaches(sbx, A)
        assert sbx.get_info().network["deny_out"] == [B]
        # The update replaces the whole egress configuration: an empty one opens everything.
        sbx.update_network({})
        assert reaches(sbx, B)
        assert not sbx.get_info().network
        # And internet access can be turned off and on again.
        sbx.update_network({"allow_internet_access": False})
        assert not reaches(sbx, A) and not reaches(sbx, B)
        assert sbx.get_info().allow_internet_access is False
        sbx.update_network({"allow_internet_access": True})
        assert reaches(sbx, A)
    finally:
        sbx.kill()


def test_an_update_while_paused_holds_after_resume():
    sbx = Sandbox.create()
    try:
        assert reaches(sbx, B)
        assert sbx.pause()
        # A gVisor node readies a paused sandbox's resume (its network among it) once the
        # pause has answered; the update reaches what was made ahead too.
        time.sleep(1)
        sbx.update_network({"deny_out": [B]})
        resumed = Sandbox.connect(sbx.sandbox_id, timeout=300)
        assert not reaches(resumed, B) and reaches(resumed, A)
        assert resumed.get_info().network["deny_out"] == [B]
    finally:
        sbx.kill()


def test_the_sandbox_cannot_route_around_its_policy():
    sbx = Sandbox.create(network={"deny_out": [B]})
    try:
        attempts = ("ip route add 198.51.100.8/32 via 10.0.2.2", "ip route flush table main", "ip link set dev tap0 down")
        for cmd in attempts:
            r = sbx.commands.run(f"{cmd} 2>&1; echo rc=$?", user="root", timeout=30)
            if RUNTIME == "builtin":
                # The namespace belongs to the host: its root may not change it.
                assert "rc=0" not in r.stdout, f"{cmd}: {r.stdout}"
        # gVisor's root may rearrange gVisor's own stack, but the rules sit outside it.
        assert not reaches(sbx, B)
        if RUNTIME == "builtin":
            assert reaches(sbx, A)
    finally:
        sbx.kill()


def test_domain_allow_lists_go_by_the_name_each_connection_carries():
    # The gateway resolves these names itself (--egress-host, tests/e2b_network.rs):
    # allowed.test and x.apps.test are server A, private.test is loopback.
    net = {"allow_out": ["allowed.test", "*.apps.test", "private.test"], "deny_out": [ALL_TRAFFIC]}
    sbx = Sandbox.create(network=net)
    try:
        def get(url, extra=""):
            return sbx.commands.run(f"curl -s -m 5 {extra} {url}; echo \" rc=$?\"", timeout=30).stdout

        # The sandbox says where the name is (B); the proxy dials the name as the node
        # resolves it instead, so A answers.
        assert get("http://allowed.test/", f"--resolve allowed.test:80:{B}").startswith(A + " rc=0")
        assert get("http://x.apps.test/", f"--resolve x.apps.test:80:{B}").startswith(A + " rc=0")
        # No name, a name not allowed, a wildcard's apex: closed without an answer.
        for url, extra in [
            (f"http://{B}/", ""),
            (f"http://{A}/", "-H 'Host: other.test'"),
            ("http://apps.test/", f"--resolve apps.test:80:{A}"),
            # An allowed name that resolves to a private or local address is not dialled.
            ("http://private.test/", f"--resolve private.test:80:{A}"),
            # Other ports carry no name the proxy reads: the address decides.
            (f"http://allowed.test:{HTTP_PORT}/", f"--resolve allowed.test:{HTTP_PORT}:{A}"),
        ]:
            out = get(url, extra)
            assert "rc=0" not in out, (url, out)
        # The proxy's listener is of no use when dialled directly: on the built-in runtime it
        # is on the sandbox's loopback; on gVisor on its gateway, the router, where every
        # connection is the proxy's, so the router's own address is just another address.
        if RUNTIME == "builtin":
            listening = (
                "python3 -c \"print(*[int(l.split()[1].split(':')[1], 16) for l in open('/proc/net/tcp')"
                " if l.split()[3] == '0A' and l.split()[1].startswith('0100007F:')])\""
            )
            port = sbx.commands.run(listening).stdout.strip()
            assert port, "the proxy listens on the sandbox's loopback"
            assert "rc=0" not in get(f"http://127.0.0.1:{port}/", "-H 'Host: allowed.test'")
        else:
            gateway = sbx.commands.run("ip route | awk '/via/ {print $3; exit}'").stdout.strip()
            assert gateway, "the sandbox routes through its router"
            for port in (80, 443, 8080):
                assert "rc=0" not in get(f"http://{gateway}:{port}/")
        # Nothing skips the proxy: raw sockets are refused even to root, and UDP follows the
        # address rules (a denied server never hears it).
        raw = sbx.commands.run(
            "python3 -c \"import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP)\" 2>&1; echo rc=$?",
            user="root",
        ).stdout
        assert "PermissionError" in raw and "rc=1" in raw, raw
        udp_probe = (
            "python3 -c \"import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
            f"s.settimeout(2); s.sendto(b'x', ('{B}', {UDP_PORT})); print(s.recv(9))\" 2>&1; echo rc=$?"
        )
        udp = sbx.commands.run(udp_probe, user="root").stdout
        assert "rc=0" not in udp, udp
        # dns_servers are what names bring along (8.8.8.8 unless given): here, server B.
        sbx.update_network({"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC], "dns_servers": [B]})
        assert "b'x'" in sbx.commands.run(udp_probe, user="root").stdout, "UDP to a named DNS server"
        assert "rc=0" not in get(f"http://{A}/"), "dns_servers open no other address"
        # An update applies at once, by address as well as by name.
        sbx.update_network({"allow_out": ["allowed.test", B], "deny_out": [ALL_TRAFFIC]})
        assert get(f"http://{B}/").startswith(B + " rc=0")
        assert "rc=0" not in get(f"http://{A}/")
        assert "b'x'" in sbx.commands.run(udp_probe, user="root").stdout, "UDP to an allowed address"
        # Without names the proxy steps aside: everything is open again.
        sbx.update_network({})
        assert get(f"http://{A}/").startswith(A + " rc=0")
        assert get(f"http://{B}:{HTTP_PORT}/").startswith(B + " rc=0")
    finally:
        sbx.kill()


def scan_sandbox_memory(marker: str, needles: list) -> tuple:
    """Reads every process of the sandbox that runs `sleep <marker>` (those in its PID
    namespace, found from the host) and says which needles its memory holds. On gVisor the
    sandbox's processes live in its Sentry's memory file: every Sentry's and gofer's memory
    files on this machine are read (no sandbox may hold the secret). Their own address spaces
    are not: reading a Sentry's through /proc/PID/mem leaves that sandbox unable to serve."""
    if RUNTIME == "gvisor":
        return scan_gvisor_memory(needles)
    pids = [p for p in os.listdir("/proc") if p.isdigit()]

    def cmdline(p):
        try:
            return open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            return b""

    [anchor] = [p for p in pids if cmdline(p) == b"sleep\0" + marker.encode() + b"\0"]
    ns = os.readlink(f"/proc/{anchor}/ns/pid")
    found, read = {n: False for n in needles}, 0
    for p in pids:
        try:
            if os.readlink(f"/proc/{p}/ns/pid") != ns:
                continue
            maps = open(f"/proc/{p}/maps").read().splitlines()
            mem = open(f"/proc/{p}/mem", "rb", 0)
        except OSError:
            continue
        with mem:
            for line in maps:
                fields = line.split()
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if "r" not in fields[1] or end - start > 1 << 30:
                    continue
                try:
                    mem.seek(start)
                    chunk = mem.read(end - start)
                except (OSError, ValueError, OverflowError):
                    continue
                read += len(chunk)
                for n in needles:
                    found[n] = found[n] or n in chunk
    return read, found


def scan_gvisor_memory(needles: list) -> tuple:
    found, read = {n: False for n in needles}, 0

    def look(chunk):
        nonlocal read
        read += len(chunk)
        for n in needles:
            found[n] = found[n] or n in chunk

    for p in [p for p in os.listdir("/proc") if p.isdigit()]:
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            continue
        if not (cmd.startswith(b"runsc-sandbox\0") or cmd.startswith(b"runsc-gofer\0")):
            continue
        # Memory files hold the sandbox's pages: only their data is read (they are sparse).
        for fd in os.listdir(f"/proc/{p}/fd"):
            try:
                if "memfd:" not in os.readlink(f"/proc/{p}/fd/{fd}"):
                    continue
                f = os.open(f"/proc/{p}/fd/{fd}", os.O_RDONLY)
            except OSError:
                continue
            try:
                at = 0
                while True:
                    try:
                        start = os.lseek(f, at, os.SEEK_DATA)
                    except OSError:
                        break
                    end = os.lseek(f, start, os.SEEK_HOLE)
                    while start < end:
                        look(os.pread(f, min(end - start, 64 << 20), start))
                        start += 64 << 20
                    at = end
            finally:
                os.close(f)
    return read, found


def seen_since(mark: int, host: str) -> list:
    return [h for (_, hst, h) in SEEN[mark:] if hst == host]


def test_header_rules_fill_secrets_in_without_the_sandbox_ever_holding_them():
    value = f"sk-live-{uuid.uuid4().hex}"
    name = f"upstream-key-{uuid.uuid4().hex[:8]}"
    Secret.create(name, value)
    rules = {
        "api.secure.test": [{"transform": {"headers": {
            "Authorization": "Bearer " + Secret.fill(name), "X-Team": "a"}}}],
        "untrusted.secure.test": [{"transform": {"headers": {"Authorization": Secret.fill(name)}}}],
        "plain.test": [{"transform": {"headers": {"X-Plain": "yes"}}}],
        "loopback.secure.test": [{"transform": {"headers": {"Authorization": Secret.fill(name)}}}],
    }
    try:
        sbx = Sandbox.create(network={"rules": rules})
        try:
            def curl(url, extra=""):
                r = sbx.commands.run(f"curl -sS -m 10 {extra} {url} 2>&1; echo \" rc=$?\"", timeout=30)
                return r.stdout

            # The sandbox points the name at B and sends its own Authorization; the proxy
            # dials the name as the node resolves it (A), verifies A is api.secure.test and
            # replaces the header with the secret, which only the server sees.
            mark = len(SEEN)
            out = curl("https://api.secure.test/v1", f"--resolve api.secure.test:443:{B} -H 'Authorization: mine'")
            assert out.startswith(A + " rc=0"), out
            [got] = seen_since(mark, "api.secure.test")
            assert got["authorization"] == f"Bearer {value}" and got["x-team"] == "a", got
            assert value not in out
            # Python's own TLS stack trusts the sandbox's CA too (it is in the system bundle).
            sbx.commands.run(f"echo '{B} api.secure.test' >> /etc/hosts", user="root")
            py = sbx.commands.run(
                "python3 -c \"import urllib.request as u; "
                "print(u.urlopen('https://api.secure.test/py').read().decode())\"",
                timeout=30,
            ).stdout
            assert py == A + "\n", py
            # A WebSocket's upgrade request gets the headers too, then the pipe carries the
            # protocol both ways.
            mark = len(SEEN)
            ws = sbx.commands.run(
                "python3 -c \"import socket, ssl; "
                "s = ssl.create_default_context().wrap_socket("
                "socket.create_connection(('api.secure.test', 443)), server_hostname='api.secure.test'); "
                "s.sendall(b'GET /ws HTTP/1.1\\r\\nHost: api.secure.test\\r\\nConnection: Upgrade\\r\\n'"
                " b'Upgrade: websocket\\r\\nAuthorization: mine\\r\\n\\r\\n'); "
                "f = s.makefile('rb'); head = f.readline(); "
                "[f.readline() for _ in range(8) if f.peek(2)[:2] != b'\\r\\n']; f.readline(); "
                "s.sendall(b'hello\\n'); print(head.split()[1].decode(), f.readline().decode().strip())\"",
                timeout=30,
            ).stdout
            assert ws.split() == ["101", "echo:hello"], ws
            [got] = seen_since(mark, "api.secure.test")
            assert got["authorization"] == f"Bearer {value}" and got["upgrade"] == "websocket", got

            # A host without a rule is not intercepted: the sandbox sees the real certificate,
            # from a CA it does not trust.
            mark = len(SEEN)
            out = curl("https://bare.secure.test/", f"--resolve bare.secure.test:443:{A}")
            assert "rc=0" not in out and "certificate" in out.lower(), out
            out = curl("https://bare.secure.test/", f"-k -v --resolve bare.secure.test:443:{A}")
            assert "test-upstream-ca" in out and out.rstrip().endswith("rc=0"), out
            assert "authorization" not in seen_since(mark, "bare.secure.test")[0]

            # The real host must prove who it is: a certificate nobody trusts gets no request,
            # and the sandbox a 502 that names the problem.
            mark = len(SEEN)
            out = curl("https://untrusted.secure.test/", f"--resolve untrusted.secure.test:443:{B}")
            assert "could not be reached" in out and "rc=0" in out, out
            assert seen_since(mark, "untrusted.secure.test") == []
            # A rule's host that resolves (on the node) to the node's own loopback is not
            # dialled: no DNS answer turns the proxy against the host.
            out = curl("https://loopback.secure.test/", f"--resolve loopback.secure.test:443:{A}")
            assert "out of every sandbox's reach" in out and value not in out, out

            # Plain HTTP gets the plain headers; a secret is never put in one.
            mark = len(SEEN)
            out = curl("http://plain.test/", f"--resolve plain.test:80:{B}")
            assert out.startswith(A + " rc=0"), out
            assert seen_since(mark, "plain.test")[0]["x-plain"] == "yes"
            sbx.update_network({"rules": {"plain.test": [{"transform": {"headers": {"X-Key": Secret.fill(name)}}}]}})
            mark = len(SEEN)
            out = curl("http://plain.test/", f"--resolve plain.test:80:{B}")
            assert "only sent over HTTPS" in out and value not in out, out
            assert seen_since(mark, "plain.test") == []

            # The secret is nowhere in the sandbox: not its environment, files or memory. The
            # commands carry it reversed, so that only a real leak puts it back together.
            hidden = value[::-1]
            assert value not in sbx.commands.run(
                "env; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'", user="root"
            ).stdout
            grep = sbx.commands.run(
                f"grep -rlF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev \"$(echo {hidden} | rev)\" / 2>/dev/null; echo done",
                user="root", timeout=120,
            ).stdout
            assert grep.strip() == "done", grep
            # Nor in the memory of any of its processes, read from the host (inside, root may
            # not read other processes' memory). A control that must be found proves the scan
            # reads memory at all.
            sbx.commands.run(
                "python3 -c \"import time; kept = ''.join(reversed('lortnoc-yromem')); time.sleep(120)\"",
                background=True,
            )
            sbx.commands.run("sleep 4242.5", background=True)
            time.sleep(1)
            read, found = scan_sandbox_memory("4242.5", [value.encode(), b"memory-control"])
            assert read > 10 << 20, read
            assert found == {value.encode(): False, b"memory-control": True}, found
        finally:
            sbx.kill()

        # Rules given later work at once: the sandbox is made to trust its proxy then.
        later = Sandbox.create()
        try:
            later.update_network({"rules": {"api.secure.test": [{"transform": {"headers": {"X-Later": "1"}}}]}})
            mark = len(SEEN)
            out = later.commands.run(
                f"curl -sS -m 10 --resolve api.secure.test:443:{A} https://api.secure.test/ 2>&1; echo \" rc=$?\"",
                timeout=30,
            ).stdout
            assert out.startswith(A + " rc=0"), out
            assert seen_since(mark, "api.secure.test")[0]["x-later"] == "1"
        finally:
            later.kill()
    finally:
        Secret.destroy(name)


def test_private_ports_need_the_traffic_access_token():
    sbx = Sandbox.create(network={"allow_public_traffic": False})
    try:
        token = sbx.traffic_access_token
        assert token, "a sandbox with private ports gets a traffic access token"
        sbx.files.write("/home/user/site/index.html", "inside")
        sbx.commands.run("cd /home/user/site && python3 -m http.server 8000 >/dev/null 2>&1", background=True)
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8000"}
        deadline = time.monotonic() + 20
        while True:
            r = httpx.get(f"{SANDBOX_URL}/index.html", headers={**headers, "e2b-traffic-access-token": token})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert r.status_code == 200 and r.text == "inside", r.text
        missing = httpx.get(f"{SANDBOX_URL}/index.html", headers=headers)
        assert missing.status_code == 403 and "is missing" in missing.json()["message"], missing.text
        wrong = {**headers, "e2b-traffic-access-token": token[:-1] + ("0" if token[-1] != "0" else "1")}
        invalid = httpx.get(f"{SANDBOX_URL}/index.html", headers=wrong)
        assert invalid.status_code == 403 and "is invalid" in invalid.json()["message"], invalid.text
        # envd is guarded by its own token, not this one: the SDK keeps working.
        assert sbx.commands.run("echo ok").stdout == "ok\n"
        assert sbx.get_info().network["allow_public_traffic"] is False
        # Public by default: no token, no header needed.
        other = Sandbox.create()
        try:
            assert other.traffic_access_token is None
        finally:
            other.kill()
    finally:
        sbx.kill()


# A server that answers each request with the Host and X-Forwarded-Host it was given.
HEADER_ECHO = (
    "python3 -c \"import http.server as h\n"
    "class H(h.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        b = (str(self.headers.get('Host')) + '|' + str(self.headers.get('X-Forwarded-Host'))).encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(b))); self.end_headers(); self.wfile.write(b)\n"
    "h.HTTPServer(('0.0.0.0', 8080), H).serve_forever()\""
)


def first_answer(headers):
    """The first 200 of the sandbox's server (it may take a moment to listen), or the last try."""
    deadline = time.monotonic() + 20
    while True:
        r = httpx.get(f"{SANDBOX_URL}/", headers=headers)
        if r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


def test_mask_request_host_is_the_host_the_sandbox_sees():
    sbx = Sandbox.create(network={"mask_request_host": "custom-host.example.com:${PORT}"})
    try:
        assert sbx.get_info().network["mask_request_host"] == "custom-host.example.com:${PORT}"
        sbx.commands.run(HEADER_ECHO, background=True)
        headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "8080"}
        r = first_answer(headers)
        original = SANDBOX_URL.split("://", 1)[1].rstrip("/")
        assert r.text == f"custom-host.example.com:8080|{original}", r.text
        # envd's own traffic is never masked: the SDK keeps working.
        assert sbx.commands.run("echo ok").stdout == "ok\n"
    finally:
        sbx.kill()
    # Without a mask the sandbox sees the host the request was sent to.
    plain = Sandbox.create()
    try:
        plain.commands.run(HEADER_ECHO, background=True)
        headers = {"E2b-Sandbox-Id": plain.sandbox_id, "E2b-Sandbox-Port": "8080"}
        r = first_answer(headers)
        assert r.text == f"{original}|None", r.text
    finally:
        plain.kill()
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network={"mask_request_host": "bad host:${PORT}"})
    assert "400" in str(e.value) and "maskRequestHost" in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "network, named",
    [
        ({"allow_out": ["example.com"]}, "ALL_TRAFFIC"),
        ({"allow_out": ["exa mple.com"], "deny_out": [ALL_TRAFFIC]}, "not a domain name"),
        ({"deny_out": ["example.com"]}, "domain name"),
        ({"deny_out": ["::/0"]}, "IPv6"),
        ({"deny_out": ["10.0.0.0/33"]}, "not an IPv4"),
        ({"egress_proxy": {"address": "proxy.example.com:1080"}}, "egressProxy"),
        ({"https_ports": [3000]}, "httpsPorts"),
    ],
)
def test_what_cannot_be_enforced_is_refused_by_name(network, named):
    with pytest.raises(SandboxException) as e:
        Sandbox.create(network=network)
    assert "400" in str(e.value) and named in str(e.value), str(e.value)


def test_updates_are_checked_and_a_sandbox_without_network_stays_closed():
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException) as e:
            sbx.update_network({"allow_out": ["example.com"]})
        assert "ALL_TRAFFIC" in str(e.value)
        assert reaches(sbx, B), "a refused update changes nothing"
    finally:
        sbx.kill()
    closed = Sandbox.create(allow_internet_access=False)
    try:
        assert not reaches(closed, A)
        with pytest.raises(SandboxException) as e:
            closed.update_network({"allow_out": [A], "deny_out": [ALL_TRAFFIC]})
        assert "409" in str(e.value) and "without internet access" in str(e.value)
        closed.update_network({"allow_internet_access": False})
    finally:
        closed.kill()
    with pytest.raises(SandboxException) as e:
        Sandbox.update_network("e2b-nosuchsbx", {"deny_out": [B]})
    assert "not found" in str(e.value).lower()
