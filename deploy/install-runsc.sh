#!/usr/bin/env bash
# Installs the gVisor runtime (runsc) a gvisor node wants: Debian trixie's build of upstream
# 20240729 (statically linked, no dependencies), taken from trixie with apt pinned so that
# nothing else of the system moves to trixie. Its systrap platform runs on hosts without KVM,
# and it checkpoints sandboxes with network connections and epoll-watched sockets, which
# bookworm's build (2022-12-19) cannot. When trixie cannot be reached, bookworm's runsc is
# installed instead; the node works with it too, with the limits README.md lists.
# Usage: deploy/install-runsc.sh   (as root, on Debian bookworm or later)
set -euo pipefail

WANT="0.0~20240729"
export DEBIAN_FRONTEND=noninteractive

have() { command -v runsc >/dev/null && runsc --version 2>/dev/null | sed -n 1p | grep -q "version $WANT"; }
if have; then
    runsc --version | sed -n 1p
    exit 0
fi

if [ ! -e /etc/apt/sources.list.d/trixie-runsc.sources ]; then
    cat > /etc/apt/sources.list.d/trixie-runsc.sources <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    # Only runsc comes from trixie; everything else stays where it is.
    cat > /etc/apt/preferences.d/trixie-runsc <<'EOF'
Package: *
Pin: release n=trixie
Pin-Priority: 100

Package: runsc
Pin: release n=trixie
Pin-Priority: 990
EOF
fi
if apt-get update -qq && apt-get install -y -qq --no-install-recommends runsc >/dev/null && have; then
    runsc --version | sed -n 1p
    exit 0
fi

echo "runsc $WANT could not be installed from trixie; installing the release's own runsc" >&2
rm -f /etc/apt/sources.list.d/trixie-runsc.sources /etc/apt/preferences.d/trixie-runsc
apt-get update -qq
apt-get install -y -qq --no-install-recommends --allow-downgrades runsc >/dev/null
runsc --version | sed -n 1p
