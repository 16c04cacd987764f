"""A resolver override for the domain-mode tests, inside the test process only: with
`E2B_TEST_RESOLVE=<domain>=<ip>` every name under the domain resolves to the gateway's address
(the machine's DNS is never touched). Loaded as a pytest plugin (`-p resolve_override`).

Two resolvers need it: Python's own (httpx, for the plain HTTP calls of the tests) and the
SDK's transport (pyqwest, a Rust client with its own resolver), which is given explicit
addresses per host name, since its overrides are by exact name.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

SPEC = os.environ.get("E2B_TEST_RESOLVE", "")
DOMAIN, _, ADDRESS = SPEC.partition("=")


def _ours(host: str | None) -> bool:
    return bool(DOMAIN) and bool(host) and (host == DOMAIN or host.endswith("." + DOMAIN))


if DOMAIN and ADDRESS:
    _getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if isinstance(host, str) and _ours(host):
            host = ADDRESS
        return _getaddrinfo(host, port, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo

    import e2b.api.client_sync as _sync

    _Real = _sync.SyncHTTPTransport
    _CA = open(os.environ["SSL_CERT_FILE"], "rb").read() if os.environ.get("SSL_CERT_FILE") else None

    class ResolvingTransport:
        """One reqwest pool per host name under the domain, each told the gateway's address."""

        def __init__(self, **kwargs):
            self._kwargs = kwargs
            self._pools = {}

        def _pool(self, host):
            key = host if _ours(host) else None
            if key not in self._pools:
                kw = dict(self._kwargs)
                if _CA is not None:
                    kw["tls_ca_cert"] = _CA
                if key is not None:
                    kw["dns_overrides"] = {host: [ADDRESS]}
                self._pools[key] = _Real(**kw)
            return self._pools[key]

        def execute_sync(self, request):
            return self._pool(urlparse(request.url).hostname).execute_sync(request)

        def close(self):
            for p in self._pools.values():
                p.close()

    _sync.SyncHTTPTransport = ResolvingTransport
