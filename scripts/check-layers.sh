#!/usr/bin/env bash
# Checks that the control server's modules form layers: every `crate::X`
# a module names (outside tests and comments) is a module below it in
# LAYERS, so no arrow points up and no two modules need each other. A new
# top-level module must be given its place here; one that reaches up fails
# with the arrow it drew.
#
#   bottom: the clock, the store and what it is built on
#   middle: blobs, PKI, the hub, rollout decisions, the controller
#   top:    `context` (what handlers and tasks share), the APIs and the
#           replica tasks that take it, and `server`, which wires them
#
# Usage: bash scripts/check-layers.sh   (needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - control-server/src <<'EOF'
import os, re, sys

# Bottom first. A module may name only modules before it.
LAYERS = """
    clock ratelimit
    store
    clustercache
    hub admission blobs pki tracker rollout
    metrics authz peers releases kube
    packages tlsaccept controller
    context
    replicas migrate rebalance api
    server
""".split()

src = sys.argv[1]
mods = {}
for entry in sorted(os.listdir(src)):
    path = os.path.join(src, entry)
    if entry.endswith(".rs") and entry not in ("lib.rs", "main.rs"):
        mods.setdefault(entry[:-3], []).append(path)
    elif os.path.isdir(path):
        for d, _, files in os.walk(path):
            mods.setdefault(entry, []).extend(os.path.join(d, f) for f in files if f.endswith(".rs"))

problems = []
for m in sorted(mods):
    if m not in LAYERS:
        problems.append(f"module {m} has no place in LAYERS (scripts/check-layers.sh): add it where it belongs")
rank = {m: i for i, m in enumerate(LAYERS)}
for m, files in sorted(mods.items()):
    for f in files:
        if re.search(r"(^|/)tests(/|\.rs$)", f) or "/conformance" in f:
            continue
        text = open(f).read()
        # Unit tests at the end of a file, and comments, do not count.
        text = re.sub(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))? )?mod tests \{.*", "", text, flags=re.S)
        text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))
        for used in sorted(set(re.findall(r"\bcrate::(\w+)", text))):
            if used == m or used not in mods or m not in rank or used not in rank:
                continue
            if rank[used] > rank[m]:
                problems.append(f"{f}: {m} uses crate::{used}, a module above it")

for p in problems:
    print(f"check-layers: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-layers: {len(mods)} modules of control-server/src in layers, no arrow up")
EOF
