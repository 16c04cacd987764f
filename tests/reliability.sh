#!/usr/bin/env bash
# Every figure of RELIABILITY.md from one command. Each part runs its driver, and its generated
# block in RELIABILITY.md is rewritten only if the driver passed and printed every figure the
# block needs. A part that fails leaves its block as it was, and the script then exits 1 once
# the other parts have run. The prose around the blocks is hand-written.
#
#   tests/reliability.sh [--out FILE] [PART ...]
#
# PART is one of these (default: all four, in this order):
#   fuzz              the hostile-input figures: tests/fuzz_parsers.rs and the continue-token
#                     property of tests/hostile_http.rs with FUZZ_CASES cases each (default
#                     4096), tests/schema_fuzz.rs for SCHEMA_FUZZ_SECONDS per document (default
#                     180), SCHEMA_FUZZ_STATEFUL_SECONDS of stateful sequences (default 180)
#                     and SCHEMA_FUZZ_EXAMPLES per operation (default 100)
#   soak              churn and the fault matrix: the release build of examples/soak, with
#                     SOAK_CYCLES cycles (default 10000) at concurrency SOAK_CONCURRENCY
#                     (default 32)
#   disk-full         tests/disk_full.rs
#   apiserver-outage  apiserver_unavailable_for_a_minute in tests/cluster.rs (its outage lasts
#                     APISERVER_OUTAGE_SECONDS, default 60)
#
# --out FILE writes the blocks into FILE instead of RELIABILITY.md (copied from RELIABILITY.md
# first if it does not exist), e.g. for a short trial run. Each part's full output is kept in
# target/reliability/PART.log. CI runs the short variants of the same tests through
# `cargo test --locked`.
set -euo pipefail

out=RELIABILITY.md
parts=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out)
            [[ $# -ge 2 ]] || { echo "--out needs a file" >&2; exit 2; }
            # Relative to where the script was called from, before it changes directory.
            out="$(realpath -m -- "$2")"
            shift 2
            ;;
        fuzz | soak | disk-full | apiserver-outage)
            parts+=("$1")
            shift
            ;;
        -h | --help)
            sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
            exit 0
            ;;
        *)
            echo "unknown part or option: $1 (see --help)" >&2
            exit 2
            ;;
    esac
done
[[ ${#parts[@]} -gt 0 ]] || parts=(fuzz soak disk-full apiserver-outage)

cd "$(dirname "$0")/.."
[[ -e $out ]] || cp RELIABILITY.md "$out"
logs=target/reliability
mkdir -p "$logs"

figures() { python3 tests/reliability/figures.py "$@"; }

# Seconds since `started` was set.
elapsed() { echo $(($(date +%s) - started)); }

run_fuzz() {
    local log=$1 parsers_secs schema_secs
    export FUZZ_CASES="${FUZZ_CASES:-4096}"
    export SCHEMA_FUZZ_SECONDS="${SCHEMA_FUZZ_SECONDS:-180}"
    export SCHEMA_FUZZ_STATEFUL_SECONDS="${SCHEMA_FUZZ_STATEFUL_SECONDS:-180}"
    export SCHEMA_FUZZ_EXAMPLES="${SCHEMA_FUZZ_EXAMPLES:-100}"
    bash tests/e2b/setup.sh >"$log" 2>&1 || return 1
    started=$(date +%s)
    cargo test --locked --test fuzz_parsers --test hostile_http -- --nocapture --test-threads=1 \
        >>"$log" 2>&1 || return 1
    parsers_secs=$(elapsed)
    started=$(date +%s)
    cargo test --locked --test schema_fuzz -- --nocapture >>"$log" 2>&1 || return 1
    schema_secs=$(elapsed)
    figures render fuzz "$log" cases="$FUZZ_CASES" seconds="$SCHEMA_FUZZ_SECONDS" \
        stateful="$SCHEMA_FUZZ_STATEFUL_SECONDS" examples="$SCHEMA_FUZZ_EXAMPLES" parsers_secs="$parsers_secs" schema_secs="$schema_secs"
}

run_soak() {
    local log=$1
    cargo build --release --locked --bins --examples >"$log" 2>&1 || return 1
    # The driver prints its section (markers included) when it has no --out, so the block is
    # spliced here, and only if the driver passed: with --out it would write a failed run's
    # report into the file too.
    target/release/examples/soak --cycles "${SOAK_CYCLES:-10000}" \
        --concurrency "${SOAK_CONCURRENCY:-32}" 2>>"$log"
}

run_disk_full() {
    local log=$1
    started=$(date +%s)
    cargo test --locked --test disk_full -- --nocapture >"$log" 2>&1 || return 1
    figures render disk-full "$log" secs="$(elapsed)" load="$load"
}

run_apiserver_outage() {
    local log=$1
    started=$(date +%s)
    cargo test --locked --test cluster -- --exact apiserver_unavailable_for_a_minute --nocapture \
        >"$log" 2>&1 || return 1
    figures render apiserver-outage "$log" secs="$(elapsed)" load="$load"
}

failed=()
for part in "${parts[@]}"; do
    log="$logs/$part.log"
    section="$logs/$part.md"
    case $part in
        fuzz) block=hostile-input:figures ;;
        soak) block=soak ;;
        *) block=$part:figures ;;
    esac
    echo "reliability: $part (log: $log)" >&2
    part_started=$(date +%s)
    # The one-minute load average as the part starts, which its figures report.
    load=$(cut -d' ' -f1 /proc/loadavg)
    if "run_${part//-/_}" "$log" >"$section" && figures splice "$out" "$block" "$section"; then
        echo "reliability: $part done in $(($(date +%s) - part_started)) s; $out: $block block updated" >&2
    else
        grep -E "panicked|FAILED|^error(\[|:)|^Error|test result" "$log" | tail -20 >&2 || true
        echo "reliability: $part FAILED after $(($(date +%s) - part_started)) s; its block in $out is unchanged (full output: $log)" >&2
        failed+=("$part")
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "reliability: failed: ${failed[*]}" >&2
    exit 1
fi
