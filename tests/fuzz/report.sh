#!/usr/bin/env bash
# The hostile-input figures of RELIABILITY.md from one command: runs the parser properties
# (tests/fuzz_parsers.rs) and the continue-token property over HTTP (tests/hostile_http.rs)
# with FUZZ_CASES cases each, and schemathesis (tests/schema_fuzz.rs) for SCHEMA_FUZZ_SECONDS
# per document and SCHEMA_FUZZ_STATEFUL_SECONDS of stateful sequences, then rewrites the section
# between the `hostile-input:figures` markers in RELIABILITY.md with what they printed.
# CI runs the same tests with their short defaults through `cargo test --locked`.
#   FUZZ_CASES=4096 SCHEMA_FUZZ_SECONDS=180 SCHEMA_FUZZ_STATEFUL_SECONDS=180 SCHEMA_FUZZ_EXAMPLES=100 tests/fuzz/report.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

export FUZZ_CASES="${FUZZ_CASES:-4096}"
export SCHEMA_FUZZ_SECONDS="${SCHEMA_FUZZ_SECONDS:-180}"
export SCHEMA_FUZZ_STATEFUL_SECONDS="${SCHEMA_FUZZ_STATEFUL_SECONDS:-180}"
export SCHEMA_FUZZ_EXAMPLES="${SCHEMA_FUZZ_EXAMPLES:-100}"

bash tests/e2b/setup.sh
# Kept after the run, for the full output behind the figures.
log=target/fuzz-report.log
mkdir -p target

status=0
started=$(date +%s)
cargo test --locked --test fuzz_parsers --test hostile_http -- --nocapture --test-threads=1 >"$log" 2>&1 || status=1
parsers_secs=$(($(date +%s) - started))
started=$(date +%s)
cargo test --locked --test schema_fuzz -- --nocapture >>"$log" 2>&1 || status=1
schema_secs=$(($(date +%s) - started))
if [[ $status -ne 0 ]]; then
    grep -E "panicked|FAILED|failed|Error" "$log" | head -40 >&2 || true
    echo "report.sh: a fuzz target failed; RELIABILITY.md left unchanged (full output: $log)" >&2
    exit 1
fi

figures="$(mktemp)"
{
    echo "<!-- hostile-input:figures:begin (written by tests/fuzz/report.sh) -->"
    echo "Run of $(date -u +%Y-%m-%d) on $(nproc) cores, commit $(git rev-parse --short HEAD):"
    echo "\`FUZZ_CASES=$FUZZ_CASES SCHEMA_FUZZ_SECONDS=$SCHEMA_FUZZ_SECONDS SCHEMA_FUZZ_STATEFUL_SECONDS=$SCHEMA_FUZZ_STATEFUL_SECONDS SCHEMA_FUZZ_EXAMPLES=$SCHEMA_FUZZ_EXAMPLES tests/fuzz/report.sh\`."
    echo
    echo "| Target | Cases | Time (s) |"
    echo "|---|---:|---:|"
    # libtest may print a test's name on the same line, so the figure is matched anywhere.
    sed -n 's/.*fuzz-figure target=\([^ ]*\) cases=\([0-9]*\) secs=\([0-9.]*\).*/| `\1` | \2 | \3 |/p' "$log"
    echo
    echo "| schemathesis run | Summary | Time (s) |"
    echo "|---|---|---:|"
    sed -n 's/.*fuzz-figure target=schemathesis\/\([^ ]*\) secs=\([0-9.]*\) summary="\(.*\)" exit=.*/| `\1` | \3 | \2 |/p' "$log"
    echo
    echo "Wall time: properties ${parsers_secs} s, schemathesis ${schema_secs} s (each including cargo's build check and, for the HTTP suites, starting the gateway). Every property held and schemathesis saw no 5xx beyond the one documented exclusion."
    echo "<!-- hostile-input:figures:end -->"
} >"$figures"

python3 - "$figures" <<'PY'
import re, sys
new = open(sys.argv[1]).read().rstrip("\n")
path = "RELIABILITY.md"
text = open(path).read()
pattern = re.compile(r"<!-- hostile-input:figures:begin.*?<!-- hostile-input:figures:end -->", re.S)
if not pattern.search(text):
    sys.exit("RELIABILITY.md has no hostile-input:figures markers")
open(path, "w").write(pattern.sub(lambda _: new, text))
PY
rm -f "$figures"
echo "RELIABILITY.md: hostile-input figures updated"
