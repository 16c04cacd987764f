#!/usr/bin/env python3
"""Turns the figure lines a reliability run printed into RELIABILITY.md's generated blocks,
and splices a block into the file. Called by tests/reliability.sh, which runs the tests; this
only reads their output, so every number in a block is one a test measured.

    figures.py render PART LOG [key=value ...]   prints PART's block (markers included)
    figures.py splice FILE NAME SECTION          replaces the NAME block of FILE with SECTION

A figure line is `{kind}-figure key=value ...` anywhere in a line (libtest may print a test's
name before it), values with spaces quoted as Rust's `{:?}` writes them. A render fails when a
figure it needs is missing (a skipped test prints none), so a block is never half-filled.
"""

import datetime
import os
import re
import shlex
import subprocess
import sys


class Missing(Exception):
    pass


def figures(log, kind):
    """Every `{kind}-figure` line of the log, as dicts, in order."""
    out = []
    pattern = re.compile(r"(?:^|\s)" + re.escape(kind) + r"-figure\s(.*)$")
    with open(log, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = pattern.search(line.rstrip("\n"))
            if not m:
                continue
            fields = {}
            for word in shlex.split(m.group(1)):
                key, _, value = word.partition("=")
                fields[key] = value
            out.append(fields)
    return out


def one(rows, **match):
    """The one row whose fields include `match`."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise Missing(f"expected one figure with {match}, found {len(found)}")
    return found[0]


def cell(text):
    """Text that is safe inside a Markdown table cell."""
    return str(text).replace("|", "/").replace("\n", " ")


def run_of():
    """When, on how many cores, on which commit (saying so when the tested code was not
    committed; RELIABILITY.md itself does not count, since the script writes it)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", ".", ":(exclude)RELIABILITY.md"]
    ).returncode
    changes = " with uncommitted changes" if dirty else ""
    return (
        f"Run of {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} on {os.cpu_count()} "
        f"cores, commit {commit}{changes}"
    )


def load():
    """The machine's load: latencies on a shared machine are only comparable with it."""
    with open("/proc/loadavg", encoding="utf-8") as f:
        return f.read().split()[0]


def run_line(meta, command):
    return (
        f"{run_of()}: `{command}`, {meta['secs']} s in all (including cargo's build check); "
        f"load average {meta.get('load', '?')} at the start, {load()} at the end."
    )


def render_disk_full(log, meta):
    rows = figures(log, "disk-full")
    fill = one(rows, case="fill")
    snap = one(rows, case="snapshot")
    warm = one(rows, case="create-warm")
    boot = one(rows, case="create-boot")
    nxt = one(rows, case="next-node")
    running = one(rows, case="running")
    write = one(rows, case="sandbox-write")
    freed = one(rows, case="space-freed")
    end = one(rows, case="end")
    kib = lambda b: f"{int(b) / 1024:.1f} KiB"
    mib = lambda b: f"{int(b) / 1048576:.0f} MiB"
    lines = [
        "<!-- disk-full:figures:begin (written by tests/reliability.sh disk-full) -->",
        run_line(meta, "tests/reliability.sh disk-full"),
        "",
        f"| on a full node ({mib(fill['tmpfs_bytes'])} tmpfs, {kib(fill['free_bytes'])} free) "
        "| answer | left behind |",
        "|---|---|---|",
        f"| snapshot (`POST /sandboxes/{{id}}/snapshots`) | {snap['status']} in {snap['ms']} ms, "
        f"Retry-After: {snap['retry_after']}; \"{cell(snap['message'])}\" | "
        f"{snap['listed']} snapshots listed, {snap['checkpoint_entries']} entries under "
        "`checkpoints/` |",
        f"| create that gets a warm sandbox | {warm['status']} in {warm['ms']} ms | — |",
        f"| create that needs a boot (warm pool used up), one node | {boot['status']} in "
        f"{boot['ms']} ms, Retry-After: {boot['retry_after']}; \"{cell(boot['message'])}\" | "
        f"instance directories beyond the {boot['claimed_dirs']} claimed sandboxes': "
        + (
            "none when it answered"
            if boot["extra_dirs_at_answer"] == "0"
            else f"{boot['extra_dirs_at_answer']} when it answered (a refill's), none "
            f"{boot['extra_dirs_gone_secs']} s later"
        )
        + f"; instance cgroups: {boot['cgroups']}, for {boot['claimed_dirs']} claimed sandboxes "
        "(counted, not asserted) |",
        f"| create that needs a boot, a second node with room | {nxt['created_on_roomy']} of "
        f"{nxt['creates']} answered 201 from the node with room, slowest {nxt['max_ms']} ms | "
        f"on the full node: {nxt['full_instance_dirs']} instance directories, "
        f"{nxt['full_cgroups']} instance cgroups |",
        f"| the running sandboxes, through the failed snapshot | "
        f"{running['commands_on_full_disk']} commands exited 0 with their output; pause "
        f"{running['pause']}, resume {running['resume']} | — |",
        f"| a sandbox writing 8 MiB to its own disk | `dd`: \"{cell(write['dd'])}\"; `sync` "
        f"exit {write['sync']}; reading it back exit {write['read']} | on the host: see below |",
        f"| space freed | snapshot {freed['snapshot_status']} in {freed['snapshot_ms']} ms, "
        f"{freed['listed']} listed; warm sandboxes just before the filler was removed: "
        f"{freed['warm_while_full']}; the pool full (1) {freed['refill_secs']} s after | — |",
        f"| everything deleted, the gateway stopped | — | {end['processes']} processes, "
        f"{end['instance_dirs']} instance directories, {end['checkpoint_entries']} entries "
        f"under `checkpoints/`, {end['cgroups']} instance cgroups, "
        f"{end['loop_devices_and_mounts']} loop devices or mounts |",
        "<!-- disk-full:figures:end -->",
    ]
    return "\n".join(lines) + "\n"


def render_apiserver_outage(log, meta):
    rows = figures(log, "apiserver-outage")
    run = one(rows, what="run")
    out_rec = one(rows, what="recovery", phase="outage")
    ref_rec = one(rows, what="recovery", phase="refused")
    out_seen = one(rows, what="nodes-seen", phase="outage")
    ref_seen = one(rows, what="nodes-seen", phase="refused")
    end = one(rows, what="end")
    ops = {"create": "creates", "get": "reads (`GET /sandboxes/{id}`)", "delete": "deletes",
           "list": "lists (`GET /v2/sandboxes`)"}

    def answers(phase, label):
        got = [r for r in rows if r.get("what") == "answers" and r.get("phase") == phase]
        if not got:
            raise Missing(f"no answers figures for {phase}")
        out = []
        for op, name in ops.items():
            mine = [r for r in got if r["op"] == op]
            if not mine:
                continue
            total = sum(int(r["count"]) for r in mine)
            statuses = ", ".join(f"{r['count']} answered {r['status']}" for r in mine)
            of = f"{total}: " if len(mine) > 1 else ""
            slowest = max(float(r["max_ms"]) for r in mine)
            out.append(f"| {label}: {name} | {of}{statuses}, slowest {slowest:.1f} ms |")
        return out

    requests = [r for r in rows if r.get("what") == "apiserver-requests"]
    who = {"node-sa": "nodes", "gateway-sa": "gateways"}
    if len(requests) != 2:
        raise Missing("apiserver-requests figures")
    reqs = ", ".join(
        f"{who.get(r['token'], r['token'])} {r['count']} ({r['answered_503']} answered 503)"
        for r in requests
    )
    warnings = [r for r in rows if r.get("what") == "warnings"]
    if not warnings:
        raise Missing("warnings figures")
    warned = ", ".join(f"{r['process']} {r['lines']}" for r in warnings)
    outage = f"503 for {run['outage_secs']} s"
    refused = f"refused for {run['refused_secs']} s"
    lines = [
        "<!-- apiserver-outage:figures:begin (written by tests/reliability.sh apiserver-outage) -->",
        run_line(meta, "tests/reliability.sh apiserver-outage"),
        f"{run['nodes']} nodes and {run['gateways']} gateway replicas (staleness bound "
        f"{run['stale_secs']} s), {run['sandboxes_before']} sandboxes made before; the "
        f"apiserver answers 503 for {run['outage_secs']} s, then refuses connections for "
        f"{run['refused_secs']} s.",
        "",
        "| | measured |",
        "|---|---|",
        *answers("outage", outage),
        f"| {outage}: nodes known / up to each replica, fewest at any round | "
        f"{out_seen['known_min']} / {out_seen['up_min']} |",
        f"| {outage}: requests that reached the apiserver | {reqs} |",
        f"| {outage}: warnings logged (publish or list+watch failures) | {warned} |",
        f"| after it answered again | every node republished in {out_rec['republished_secs']} s; "
        f"the node started during the outage discovered by both replicas in "
        f"{out_rec['n3_discovered_secs']} s; a node started after it discovered "
        f"{out_rec['n4_discovered_secs']} s after it started; all {out_rec['sandboxes_listed']} sandboxes listed "
        f"by both replicas {out_rec['all_listed_secs']} s after |",
        *answers("refused", f"connections {refused}"),
        f"| connections {refused}: nodes known to each replica, fewest | "
        f"{ref_seen['known_min']} |",
        f"| after it accepted connections again | every node republished and all "
        f"{ref_rec['sandboxes_listed']} sandboxes listed by both replicas in "
        f"{ref_rec['all_listed_secs']} s |",
        f"| at the end | {end['get_200']} of {end['sandboxes']} sandboxes answered GET 200; "
        f"\"node left the fleet\" logged {end['node_left_lines']} times; {end['panics']} "
        f"panics; after deleting them and stopping everything: {end['processes']} processes, "
        f"{end['instance_dirs']} instance directories |",
        "<!-- apiserver-outage:figures:end -->",
    ]
    return "\n".join(lines) + "\n"


def render_fuzz(log, meta):
    rows = figures(log, "fuzz")
    props = [r for r in rows if not r["target"].startswith("schemathesis/")]
    schema = [r for r in rows if r["target"].startswith("schemathesis/")]
    if not props or not schema:
        raise Missing("fuzz figures")
    lines = [
        "<!-- hostile-input:figures:begin (written by tests/reliability.sh fuzz) -->",
        f"{run_of()}:",
        f"`FUZZ_CASES={meta['cases']} SCHEMA_FUZZ_SECONDS={meta['seconds']} "
        f"SCHEMA_FUZZ_STATEFUL_SECONDS={meta['stateful']} "
        f"SCHEMA_FUZZ_EXAMPLES={meta['examples']} tests/reliability.sh fuzz`.",
        "",
        "| Target | Cases | Time (s) |",
        "|---|---:|---:|",
        *(f"| `{r['target']}` | {r['cases']} | {r['secs']} |" for r in props),
        "",
        "| schemathesis run | Summary | Time (s) |",
        "|---|---|---:|",
        *(f"| `{r['target'].removeprefix('schemathesis/')}` | {cell(r['summary'])} | {r['secs']} |"
          for r in schema),
        "",
        f"Wall time: properties {meta['parsers_secs']} s, schemathesis {meta['schema_secs']} s "
        "(each including cargo's build check and, for the HTTP suites, starting the gateway). "
        "Every property held and schemathesis saw no 5xx beyond the one documented exclusion.",
        "<!-- hostile-input:figures:end -->",
    ]
    return "\n".join(lines) + "\n"


RENDER = {
    "disk-full": render_disk_full,
    "apiserver-outage": render_apiserver_outage,
    "fuzz": render_fuzz,
}


def splice(path, name, section_path):
    """Replaces the block between `<!-- NAME:begin…` and `<!-- NAME:end -->` with the
    section (which carries its own markers)."""
    new = open(section_path, encoding="utf-8").read().rstrip("\n")
    if not new:
        sys.exit(f"{section_path} is empty")
    text = open(path, encoding="utf-8").read()
    pattern = re.compile(
        r"<!-- " + re.escape(name) + r":begin.*?<!-- " + re.escape(name) + r":end -->", re.S
    )
    if len(pattern.findall(text)) != 1:
        sys.exit(f"{path} needs exactly one block between the {name}:begin and {name}:end markers")
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(pattern.sub(lambda _: new, text))
    os.replace(tmp, path)


def main(argv):
    if len(argv) >= 3 and argv[0] == "render" and argv[1] in RENDER:
        meta = dict(a.partition("=")[::2] for a in argv[3:])
        try:
            sys.stdout.write(RENDER[argv[1]](argv[2], meta))
        except (Missing, KeyError) as e:
            sys.exit(f"{argv[1]}: a figure is missing from {argv[2]}: {e}")
    elif len(argv) == 4 and argv[0] == "splice":
        splice(argv[1], argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
