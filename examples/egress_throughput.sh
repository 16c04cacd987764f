#!/usr/bin/env bash
# Egress proxy throughput: a 100 MiB download over HTTPS and over HTTP from inside a sandbox,
# through the node's egress proxy (a policy that allows the server by name), intercepted by it
# (a rule that sets a header: TLS is terminated and the request forwarded), and directly (no
# policy: slirp4netns carries it), in one run, side by side; and the time of a small request
# on each path (the latency the proxy adds). Nothing leaves the machine:
# the script re-runs itself in a network namespace of its own, where the server listens on a
# documentation address of the namespace's loopback. Needs root, curl, openssl, python3 and
# a release build (`cargo build --release`); prints a Markdown table for PERFORMANCE.md.
#
#   examples/egress_throughput.sh [ROUNDS]     (default 5 rounds of each, median reported)
#   RUNTIME=gvisor examples/egress_throughput.sh   (the sandboxes on gVisor; default builtin)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-5}
if [ -z "${EGRESS_BENCH_INSIDE:-}" ]; then
    exec env EGRESS_BENCH_INSIDE=1 unshare -n "$0" "$@"
fi

SERVER=198.51.100.7
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; sleep 1; rm -rf "$WORK"' EXIT
ip link set lo up
ip addr add "$SERVER/32" dev lo

# The server: 100 MiB of zeros (or 2 bytes at /small), on :80 in the clear and :443 with a
# certificate from a CA made here, which the node trusts for intercepted requests.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$WORK/ca.key" -out "$WORK/ca.pem" \
    -days 1 -subj "/CN=bench-ca" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout "$WORK/key.pem" -out "$WORK/cert.csr" \
    -subj "/CN=big.test" 2>/dev/null
printf 'subjectAltName=DNS:big.test\nbasicConstraints=CA:FALSE\n' > "$WORK/ext"
openssl x509 -req -in "$WORK/cert.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
    -CAcreateserial -days 1 -extfile "$WORK/ext" -out "$WORK/cert.pem" 2>/dev/null
python3 - "$SERVER" "$WORK" <<'PY' &
import http.server, ssl, sys, threading
addr, work = sys.argv[1], sys.argv[2]
BODY = bytes(100 << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"ok" if self.path == "/small" else BODY
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        view = memoryview(body)
        for i in range(0, len(body), 1 << 20):
            self.wfile.write(view[i:i + (1 << 20)])
    def log_message(self, *a):
        pass
plain = http.server.ThreadingHTTPServer((addr, 80), H)
tls = http.server.ThreadingHTTPServer((addr, 443), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(f"{work}/cert.pem", f"{work}/key.pem")
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls.serve_forever()
PY

printf 'e2b_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa bench\n' > "$WORK/keys"
# The tests' templates when they are built (else the gateway builds `base` first, a minute).
[ -d target/test-templates/base ] && export SANDBOX_GATEWAY_TEMPLATES_DIR=$PWD/target/test-templates
target/release/sandbox-gateway serve --e2b-listen 127.0.0.1:18099 --kube-listen 127.0.0.1:0 \
    --runtime "${RUNTIME:-builtin}" \
    --data-dir "$WORK/data" --api-keys "$WORK/keys" --pool base/egress=2 \
    --sandbox-reachable 198.51.100.0/24 --egress-host "big.test=$SERVER" \
    --egress-ca-file "$WORK/ca.pem" \
    > "$WORK/gateway.log" 2>&1 &
up=
for _ in $(seq 1 600); do
    curl -sf http://127.0.0.1:18099/health >/dev/null && { up=1; break; }
    sleep 0.5
done
[ -n "$up" ] || { tail -20 "$WORK/gateway.log" >&2; exit 1; }

VENV=target/e2b-sdk/py-2.63.0/bin/python
[ -x "$VENV" ] || { echo "run tests/e2b/setup.sh first (the e2b SDK drives the sandboxes)" >&2; exit 1; }
E2B_API_URL=http://127.0.0.1:18099 E2B_SANDBOX_URL=http://127.0.0.1:18099 \
E2B_API_KEY=e2b_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa "$VENV" - "$SERVER" "$ROUNDS" <<'PY'
import statistics, sys
from e2b import Sandbox
server, rounds = sys.argv[1], int(sys.argv[2])
direct = Sandbox.create(timeout=600)
proxied = Sandbox.create(timeout=600, network={"allow_out": ["big.test"], "deny_out": ["0.0.0.0/0"]})
intercepted = Sandbox.create(
    timeout=600, network={"rules": {"big.test": [{"transform": {"headers": {"X-Bench": "1"}}}]}}
)
def fetch(sbx, scheme, path="/"):
    # The sandbox names the server itself (--resolve): its own resolver does not know big.test.
    port = 443 if scheme == "https" else 80
    cmd = (f"curl -sk -o /dev/null -w '%{{time_total}} %{{speed_download}}' "
           f"--resolve big.test:{port}:{server} {scheme}://big.test{path}")
    out = sbx.commands.run(cmd, timeout=300).stdout.split()
    return float(out[0]), float(out[1])
paths = [("direct (slirp4netns)", direct), ("through the egress proxy", proxied),
         ("intercepted by the egress proxy", intercepted)]
rows, small = [], []
try:
    for scheme in ["https", "http"]:
        for label, sbx in paths:
            fetch(sbx, scheme)  # warm-up
            runs = [fetch(sbx, scheme) for _ in range(rounds)]
            secs = statistics.median(r[0] for r in runs)
            mibs = statistics.median(r[1] for r in runs) / (1 << 20)
            rows.append((scheme, label, secs, mibs))
            # A new connection and a 2-byte answer, many times: what the path adds.
            ms = [fetch(sbx, scheme, "/small")[0] * 1000 for _ in range(rounds * 10)]
            small.append((scheme, label, statistics.median(ms)))
finally:
    for _, sbx in paths:
        sbx.kill()
print("| download (100 MiB) | path | median time | median throughput | vs direct |")
print("|---|---|---|---|---|")
for scheme, label, secs, mibs in rows:
    base = next(r[3] for r in rows if r[0] == scheme and r[1].startswith("direct"))
    print(f"| {scheme.upper()} | {label} | {secs * 1000:.0f} ms | {mibs:.0f} MiB/s | {mibs / base * 100:.0f} % |")
print()
print("| small request (new connection, 2 bytes) | path | median time | added vs direct |")
print("|---|---|---|---|")
for scheme, label, ms in small:
    base = next(m for s, l, m in small if s == scheme and l.startswith("direct"))
    print(f"| {scheme.upper()} | {label} | {ms:.2f} ms | {ms - base:+.2f} ms |")
PY
