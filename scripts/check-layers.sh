#!/usr/bin/env bash
# Checks that the modules of the control server, the agent and the bundle
# rules form layers: every `crate::X` a module names (outside tests and
# comments) is a module below it in that crate's LAYERS, so no arrow points
# up and no two modules need each other. A new top-level module must be
# given its place here; one that reaches up fails with the arrow it drew.
# The crates share the checking code below and differ only in their
# LAYERS lists.
#
# Usage: bash scripts/check-layers.sh   (needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - <<'EOF'
import os, re, sys

# Bottom first. A module may name only modules before it.
CRATES = {
    # The store crates (Cargo keeps lks-store below its two backends and
    # both below the server): inside each, rows and rules (or their
    # persistence) by aggregate, then what reads across aggregates (the
    # dump, the conformance suite).
    "control-server/store/src": """
        clock
        tokens audit deltas
        clusters nodes bundles releases rollouts events blobrecs
        dump
        conformance
    """,
    "control-server/store-sqlite/src": """
        schema
        tokens audit deltas clusters nodes bundles desired releases rollouts status events blobrecs
        dump snapshot
    """,
    # etcd: key limits, names and reads; the documents (a rollout's in
    # `rolloutdocs`); the aggregates on them; the watch-fed view copy
    # (`cache`); what reads rollouts through it; a rollout's start.
    "control-server/store-etcd/src": """
        limits name smallmap reads
        docs rolloutdocs
        tokens audit deltas events releases
        clusters bundles bundledocs blobrecs seen status
        cache
        desired nodes import rollouts
        start
        testing tests
    """,
    # bottom: the clock, the store (re-exported from the store crates) and
    #         what it is built on
    # middle: blobs, PKI, the hub, rollout decisions, the controller
    # top:    `context` (what handlers and tasks share), the APIs and the
    #         replica tasks that take it, and `server`, which wires them
    "control-server/src": """
        clock ratelimit
        store
        clustercache
        hub admission blobs pki tracker rollout
        metrics authz peers releases kube
        packages tlsaccept controller
        context
        replicas migrate backup rebalance api
        server
    """,
    # bottom: time, fault points, the state dir and agent.toml
    # node:   what this machine is (facts, the keys and certificates it
    #         makes and the CertIssuer port, systemd notify, memory)
    # apply:  the engine, its journal, cache and state, with the ports it
    #         fetches through (apply/source.rs: BlobSource, PieceSource)
    # link:   the server stream and channels, implementing those ports
    # top:    the `status` command, logging, `join`, the daemon (`run`) and
    #         the settings file that feeds it
    "lksadmin-agent/src": """
        clock fault config
        node
        apply
        link
        status logging join
        run
        settings
    """,
    # bottom: digests, durations, ELF headers, limits, rates, then what rests on
    # them; `rule` (ManifestError) below `certs` and `manifest`, which both
    # check rules; the canonical encoding, signatures and releases over the
    # manifest; at the top the two ways in (protobuf, bundle.toml)
    "proto/bundle/src": """
        digest duration elf limits rate
        arch chunks names path
        rule certs
        manifest
        canonical sign release
        convert authoring
    """,
}


def modules(src):
    """Top-level module -> its files (a directory counts as one module)."""
    mods = {}
    for entry in sorted(os.listdir(src)):
        path = os.path.join(src, entry)
        if entry.endswith(".rs") and entry not in ("lib.rs", "main.rs"):
            mods.setdefault(entry[:-3], []).append(path)
        elif os.path.isdir(path):
            for d, _, files in os.walk(path):
                mods.setdefault(entry, []).extend(os.path.join(d, f) for f in files if f.endswith(".rs"))
    return mods


def named(text):
    """The top-level modules a file names as `crate::x` or `crate::{x, y::z}`."""
    used = set(re.findall(r"\bcrate::(\w+)", text))
    for group in re.finditer(r"\bcrate::\{", text):
        depth, i, start = 1, group.end(), group.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 1 and text[i] == ",":
                used.update(re.findall(r"^\s*(\w+)", text[start:i]))
                start = i + 1
            i += 1
        used.update(re.findall(r"^\s*(\w+)", text[start : i - 1]))
    return used


def check(src, layers):
    layers = layers.split()
    mods = modules(src)
    problems = []
    for m in sorted(mods):
        if m not in layers:
            problems.append(f"{src}: module {m} has no place in LAYERS (scripts/check-layers.sh): add it where it belongs")
    rank = {m: i for i, m in enumerate(layers)}
    for m, files in sorted(mods.items()):
        for f in files:
            if re.search(r"(^|/)tests(/|\.rs$)", f) or "/conformance" in f:
                continue
            text = open(f).read()
            # Unit tests at the end of a file, and comments, do not count.
            text = re.sub(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))? )?mod tests \{.*", "", text, flags=re.S)
            text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))
            for used in sorted(named(text)):
                if used == m or used not in mods or m not in rank or used not in rank:
                    continue
                if rank[used] > rank[m]:
                    problems.append(f"{f}: {m} uses crate::{used}, a module above it")
    return len(mods), problems


failed = False
for src, layers in CRATES.items():
    count, problems = check(src, layers)
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        failed = True
    else:
        print(f"check-layers: {count} modules of {src} in layers, no arrow up")
sys.exit(1 if failed else 0)
EOF
