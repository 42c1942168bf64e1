#!/usr/bin/env bash
# Checks that the modules of each crate (all but the generated lks-wire and
# the tests' lks-e2e) form layers: every `crate::X` a module names (outside
# tests and comments) is a module below it in that crate's LAYERS, so no
# arrow points up and no two modules need each other. A new top-level
# module must be given its place here; one that reaches up fails with the
# arrow it drew. The crates share the checking code below and differ only
# in their LAYERS lists.
#
# The crate root counts too. `crate::X` for an item X that lib.rs or
# main.rs re-exports from a module (`pub use m::X`, `use m::*`) is an arrow
# to that module; for one the root itself defines it is an arrow to the
# root, which declares every module and so sits above them all: it fails
# (move X into a module below its users), except in the store crates and
# lks-blobs (ROOT_BASE), whose lib.rs holds the base every module builds on. In a
# top-level module's file `super::X` is `crate::X`, and a glob of the root
# (`use super::*`) fails.
#
# It also checks that the code maps say what the code is:
# - each crate's module map, the table in its README (MAPS below) after a
#   line `<!-- module map of SRC ... -->`, with the columns
#   `module | what it owns | what it may import`: every top-level module (a
#   file or directory in SRC, a `mod` in lib.rs or main.rs) has a row and
#   every row names a module that exists; the rows come in LAYERS order,
#   bottom first, a row of submodules (`apply/cache`, `api/agent/`) right
#   after its module's; and "what it may import" is what LAYERS allows, in
#   one form: `—` for the first module, the modules before it by name when
#   they are at most four, else "the modules above (`FIRST` … `LAST`)";
#   "as `X`" for submodules of X; for main.rs "the library", or "every
#   module (the crate root)" in a crate without lib.rs;
# - the crate map in README.md ("Layout", after `<!-- crate map of the
#   workspace ... -->`): a row per workspace member, `PATH/` and package
#   name, below the crates it links, whose "what it may import" is the
#   workspace crates in its Cargo.toml's [dependencies].
#
# And that the workspace stays in crates by concern (issue [shape-3]): no
# crate holds more than a quarter of the workspace's library lines — the
# lines of the .rs files under each member's src/, tests aside (the
# end-to-end crate lks-e2e, `tests/` directories, `tests.rs` and
# `*_tests.rs` files). It prints each crate's share, largest first.
# Adding a module is one LAYERS entry and one row: write the row's module
# and what it owns, and `--write` fills in what it may import.
#
# Usage: bash scripts/check-layers.sh           check (CI)
#        bash scripts/check-layers.sh --write   rewrite the "what it may
#                                               import" column of every map
# (needs python3)
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - "$@" <<'EOF'
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
        reboots
        clusters nodes bundles releases rollouts events blobrecs plans
        dump
        conformance
    """,
    "control-server/store-sqlite/src": """
        schema
        tokens audit deltas reboots clusters nodes bundles desired releases rollouts status events blobrecs plans
        dump snapshot
    """,
    # etcd: key limits, names and reads; the documents (a rollout's in
    # `rolloutdocs`); the aggregates on them, and the handles of what the
    # replicas share (identity, registry and election, load board, blob
    # chunks, peer ledger); the watch-fed view copy (`cache`); what reads
    # rollouts through it, and the prefix as keys (`import`, `archive`); a
    # rollout's start.
    "control-server/store-etcd/src": """
        limits name smallmap reads
        docs rolloutdocs
        tokens audit deltas events releases
        identity replicas load chunks swarm
        clusters bundles bundledocs blobrecs seen status reboots
        cache
        desired nodes import archive rollouts plans
        start
        testing tests
    """,
    # bottom: the clock, the store (re-exported from the store crates) and
    #         what it is built on
    # middle: the hub, the controller (blobs are lks-blobs')
    # top:    `context` (what handlers and tasks share), the replica tasks
    #         that take it, `ops` (the use cases: no tonic, no `api`), the
    #         APIs that call them, and `server`, which wires them
    "control-server/src": """
        clock ratelimit
        store
        clustercache
        hub admission
        metrics authz peers releases
        rebootgates
        reboots
        packages tlsaccept controller fleetlock
        context
        replicas migrate backup rebalance ops plans api
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
    # manifest (and `served`, what a publish of it must carry); at the top
    # the two ways in (protobuf, bundle.toml)
    "proto/bundle/src": """
        digest duration elf limits rate
        arch chunks names path
        rule certs
        manifest served
        canonical sign release
        convert authoring
    """,
    # lks-pki: keys sealed at rest, the server's own CA, then the tenant
    # cluster CAs (which seal their keys and share the serials).
    "control-server/pki/src": """
        seal server
        clusterca
    """,
    # lks-rollout: the policy a start asks for (typed once, with its
    # defaults and checks); what a step decides over, how long rollouts are in
    # their states; a draining node's turn; the phases of a step and the
    # operator verbs (lib.rs runs the phases); the unit tests.
    "control-server/rollout/src": """
        policy
        decision ages
        gates
        drain reboot
        settle canary batch complete verbs fleetlock
        plan
        tests
    """,
    # lks-blobs: lib.rs holds the base (BlobStore, BlobError, Blobs); the
    # local copies, then the stores that fetch into them (etcd chunks, S3);
    # the collector and its claim, the delta maker that claims its patches;
    # the conformance suite over all of them.
    "control-server/blobs/src": """
        local
        etcd s3
        gc
        delta
        conformance
    """,
    # lks-tracker: the ledger the replicas share, under the tracker
    # (lib.rs); its unit tests.
    "control-server/tracker/src": """
        ledger
        tests
    """,
    # lks-kube: the kubeconfig's checks, a Node's state and the sealing,
    # then a client per tenant and the drain against it, then the
    # controller's tasks that run them.
    "control-server/kube/src": """
        config nodes secret
        tenant drain
        work
    """,
    # Beside the server, crates that link lks-proto and not the server.
    # lksctl (a library; main.rs only parses and dispatches): the output,
    # the shared flag checks and the admin API client, then the verbs, a
    # release before the rollout that may name one; the console over the
    # verbs.
    "control-server/lksctl/src": """
        output flags client mirror cloudinit
        audit bundle cluster event node reboot token
        release
        rollout
        plan
        console
    """,
    # lks-loadgen: the command line, the report, one simulated agent, then
    # the modes that run many.
    "control-server/loadgen/src": """
        args report sim
        baseline plan rollout storm
    """,
    # lks-kube-controller: the custom resources and the pieces under the
    # reconcilers, what the reconcilers share, the server-to-resource
    # mapping, the reconcilers, the poll of the server, what runs while
    # this copy leads.
    "control-server/kube-controller/src": """
        crd policy conditions lease admin
        context object
        mirror settings
        clusters rollouts plans nodes
        poll
        run
    """,
    # lks-proto's own modules (the rest is lks-wire and lks-bundle,
    # re-exported): plumbing; identities, tokens, labels and windows;
    # admin.conf, written with fsutil.
    "proto/src": """
        report sync backoff fsutil delta tls wire
        identity token labels windows
        adminconf
    """,
}


# The crates whose lib.rs holds the base every module builds on (the
# store type, its error, the helpers its aggregates share), so a module may
# name the root's own items; in every other crate the root is the top.
ROOT_BASE = {
    "control-server/store/src",
    "control-server/store-sqlite/src",
    "control-server/store-etcd/src",
    # lks-blobs: the BlobStore trait, BlobError and Blobs (the local copies
    # joined to the store) are what every backend, the collector and the
    # delta maker build on.
    "control-server/blobs/src",
}


# Where each crate's module map is: the README holding its table.
MAPS = {
    "control-server/store/src": "control-server/store/README.md",
    "control-server/store-sqlite/src": "control-server/store-sqlite/README.md",
    "control-server/store-etcd/src": "control-server/store-etcd/README.md",
    "control-server/src": "control-server/README.md",
    "control-server/pki/src": "control-server/pki/README.md",
    "control-server/rollout/src": "control-server/rollout/README.md",
    "control-server/kube/src": "control-server/kube/README.md",
    "control-server/tracker/src": "control-server/tracker/README.md",
    "control-server/blobs/src": "control-server/blobs/README.md",
    "lksadmin-agent/src": "lksadmin-agent/README.md",
    "proto/bundle/src": "proto/README.md",
    "proto/src": "proto/README.md",
    "control-server/lksctl/src": "control-server/README.md",
    "control-server/loadgen/src": "control-server/README.md",
    "control-server/kube-controller/src": "control-server/README.md",
}
HEADER = ["module", "what it owns", "what it may import"]


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
    # A `mod` the crate root declares inline (`mod x { … }`) is a module too;
    # the unit tests' `mod tests { … }` is not.
    for root in ("lib.rs", "main.rs"):
        path = os.path.join(src, root)
        if os.path.exists(path):
            for m in re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*[;{]", open(path).read(), re.M):
                if m != "tests" or os.path.exists(os.path.join(src, "tests.rs")):
                    mods.setdefault(m, [])
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


def strip(text):
    """A file without its unit tests at the end and its comments."""
    text = re.sub(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))? )?mod tests \{.*", "", text, flags=re.S)
    return "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("//"))


def root_names(src, mods):
    """The names the crate root holds: name -> ("mod", m) for an item it
    re-exports from module m, ("ext", c) for one from crate c, ("item",
    root) for one it defines itself (lib.rs, or main.rs without a lib.rs)."""
    root = "lib.rs" if os.path.exists(os.path.join(src, "lib.rs")) else "main.rs"
    path = os.path.join(src, root)
    names = {}
    if not os.path.exists(path):
        return names
    text = strip(open(path).read())
    item = r"(?:async\s+)?(?:fn|struct|enum|const|static|type|trait|union)\s+(\w+)"
    for m in re.finditer(rf"^(?:pub(?:\([a-z]+\))?\s+)?{item}|^\s*macro_rules!\s*(\w+)", text, re.M):
        names[m.group(1) or m.group(2)] = ("item", root)
    for u in re.finditer(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?use\s+([^;]+);", text, re.M):
        body = re.sub(r"^(?:::)?(?:crate|self)::", "", re.sub(r"\s+", " ", u.group(1)).strip())
        first = re.match(r"(?:::)?(\w+)", body).group(1)
        kind = ("mod", first) if first in mods else ("ext", first)
        if body.endswith("::*"):
            for f in mods.get(first, []) if kind[0] == "mod" else []:
                for n in re.findall(rf"^\s*pub(?:\([a-z]+\))?\s+{item}", open(f).read(), re.M):
                    names.setdefault(n, kind)
            continue
        for leaf in re.split(r"[{},]", body):
            name = leaf.strip().rstrip(":").split(" as ")[-1].split("::")[-1].strip()
            if name and name != "self":
                names.setdefault(name, kind)
    return names


def check(src, layers):
    layers = layers.split()
    mods = modules(src)
    problems = []
    for m in sorted(mods):
        if m not in layers:
            problems.append(f"{src}: module {m} has no place in LAYERS (scripts/check-layers.sh): add it where it belongs")
    rank = {m: i for i, m in enumerate(layers)}
    roots = root_names(src, mods)
    for m, files in sorted(mods.items()):
        for f in files:
            if re.search(r"(^|/)tests(/|\.rs$)", f) or "/conformance" in f:
                continue
            # Unit tests at the end of a file, and comments, do not count.
            text = strip(open(f).read())
            # In a top-level module's own file, `super` is the crate root.
            # (Not followed in ROOT_BASE: lks-store's `events` and the
            # aggregates it records name each other through `super::`.)
            top = os.path.dirname(f) == src or f == os.path.join(src, m, "mod.rs")
            if top and src not in ROOT_BASE:
                text = re.sub(r"\bsuper::", "crate::", text)
            if re.search(r"\bcrate::\*", text):
                problems.append(f"{f}: {m} imports every name of the crate root (`use super::*`, `crate::*`), which sits above every module: import what it uses from the modules that own it")
            for used in sorted(named(text)):
                via = ""
                if used not in mods:
                    kind, where = roots.get(used, ("ext", ""))
                    if kind == "item" and not (where == "lib.rs" and src in ROOT_BASE):
                        problems.append(f"{f}: {m} uses crate::{used}, an item of the crate root {where}, which sits above every module: move it into a module below {m}")
                    if kind != "mod":
                        continue
                    used, via = where, f" (crate::{used}, re-exported by the crate root)"
                if used == m or m not in rank or used not in rank:
                    continue
                if rank[used] > rank[m]:
                    problems.append(f"{f}: {m} uses crate::{used}{via}, a module above it")
    return len(mods), problems


def may_import(layers, m):
    """What LAYERS lets top-level module `m` import, in the maps' fixed form."""
    below = layers[: layers.index(m)]
    if not below:
        return "—"
    if len(below) <= 4:
        return ", ".join(f"`{b}`" for b in below)
    # No count: a module added to LAYERS changes only its own row and the
    # row after it.
    return f"the modules above (`{below[0]}` … `{below[-1]}`)"


def split_row(line):
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def map_rows(readme, src, lines):
    """(line number, cells) of each row of `src`'s map, or a problem."""
    marks = [i for i, l in enumerate(lines) if re.match(rf"<!-- module map of {re.escape(src)}\b", l)]
    if len(marks) != 1:
        return None, f"{readme}: {len(marks)} lines `<!-- module map of {src} -->` (want one, before the table of {src}'s modules)"
    i = marks[0] + 1
    while i < len(lines) and not lines[i].strip():
        i += 1
    if i + 1 >= len(lines) or split_row(lines[i]) != HEADER or not re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
        return None, f"{readme}:{i + 1}: the map of {src} must start with the header | {' | '.join(HEADER)} |"
    rows = []
    for j in range(i + 2, len(lines)):
        if not lines[j].lstrip().startswith("|"):
            break
        rows.append((j, split_row(lines[j])))
    return rows, None


def check_map(src, layers, readme, write):
    """Problems of `src`'s module map, and its rows rewritten when `write`."""
    layers = layers.split()
    mods = modules(src)
    if not os.path.exists(readme):
        return [f"{readme}: missing; it holds the module map of {src} (MAPS in scripts/check-layers.sh)"], 0
    lines = open(readme).read().split("\n")
    rows, problem = map_rows(readme, src, lines)
    if problem:
        return [problem], 0
    problems, seen, current, rewritten = [], set(), None, 0
    for j, cells in rows:
        at = f"{readme}:{j + 1}"
        if len(cells) != 3:
            problems.append(f"{at}: a row of the map of {src} has {len(cells)} cells, not 3")
            continue
        names = re.findall(r"`([^`]+)`", cells[0])
        if not names or re.sub(r"`[^`]+`", "", cells[0]).strip(" ,"):
            problems.append(f"{at}: the module cell {cells[0]!r} must be module names in backticks (`x`, `x/`, `x.rs`, `x/y`)")
            continue
        names = [re.sub(r"(\.rs|/)$", "", n) for n in names]
        parents = {n.split("/")[0] for n in names}
        if names == ["main"]:
            if not os.path.exists(os.path.join(src, "main.rs")):
                problems.append(f"{at}: row `main.rs`: {src} has no main.rs")
            lib = os.path.exists(os.path.join(src, "lib.rs"))
            want, current = ("the library" if lib else "every module (the crate root)"), "main.rs"
        elif len(parents) != 1:
            problems.append(f"{at}: row {cells[0]}: one top-level module per row ({', '.join(sorted(parents))} are several)")
            continue
        elif "/" not in names[0]:
            m = names[0]
            if len(names) != 1:
                problems.append(f"{at}: row {cells[0]}: one top-level module per row")
                continue
            if m not in mods:
                problems.append(f"{at}: row `{m}`: {src} has no module {m} (no {m}.rs, no {m}/, no `mod {m}`)")
                continue
            if m not in layers:
                problems.append(f"{at}: row `{m}`: {m} has no place in LAYERS of {src} (scripts/check-layers.sh)")
                continue
            if m in seen:
                problems.append(f"{at}: row `{m}`: a second row for {m}")
            if current == "main.rs" or (current in layers and layers.index(current) > layers.index(m)):
                problems.append(f"{at}: row `{m}` comes after `{current}`, but LAYERS (bottom first) has {m} before it: move the row up")
            seen.add(m)
            want, current = may_import(layers, m), m
        else:
            (parent,) = parents
            missing = [n for n in names if not (os.path.exists(os.path.join(src, n + ".rs")) or os.path.isdir(os.path.join(src, n)))]
            if missing:
                problems.append(f"{at}: row {cells[0]}: {src} has no module {', '.join(missing)} (no .rs file, no directory)")
                continue
            if parent != current:
                problems.append(f"{at}: row {cells[0]}: a row of {parent}'s submodules belongs right after the row of `{parent}`")
            want = f"as `{parent}`"
        if cells[2] != want:
            if write:
                lines[j] = "| " + " | ".join(cells[:2] + [want]) + " |"
                rewritten += 1
            else:
                problems.append(f"{at}: row {cells[0]}: \"what it may import\" says {cells[2]!r}, LAYERS says {want!r} (bash scripts/check-layers.sh --write)")
    for m in sorted(set(mods) - seen):
        problems.append(f"{readme}: the map of {src} has no row for module `{m}`: add | `{m}` | what it owns | | where LAYERS puts it, then run bash scripts/check-layers.sh --write")
    if write and rewritten:
        open(readme, "w").write("\n".join(lines))
    return problems, rewritten


def workspace():
    """Workspace member -> (package name, the members in its [dependencies])."""
    members = re.findall(r'"([^"]+)"', re.search(r"^members\s*=\s*\[(.*?)\]", open("Cargo.toml").read(), re.M | re.S).group(1))
    toml = {m: open(os.path.join(m, "Cargo.toml")).read() for m in members}
    names = {m: re.search(r'^name\s*=\s*"([^"]+)"', t, re.M).group(1) for m, t in toml.items()}
    by_name = {n: m for m, n in names.items()}
    crates = {}
    for m, t in toml.items():
        deps = re.search(r"^\[dependencies\]\n(.*?)(?=^\[|\Z)", t, re.M | re.S)
        used = re.findall(r"^([\w-]+)\s*[.=]", deps.group(1), re.M) if deps else []
        crates[m] = (names[m], [by_name[u] for u in used if u in by_name])
    return crates


def check_crates(readme, write):
    """Problems of the workspace's crate map in `readme`, and rows rewritten."""
    crates = workspace()
    lines = open(readme).read().split("\n")
    marks = [i for i, l in enumerate(lines) if l.startswith("<!-- crate map of the workspace")]
    if len(marks) != 1:
        return [f"{readme}: {len(marks)} lines `<!-- crate map of the workspace -->` (want one, before the table of the crates)"], 0
    i = marks[0] + 1
    if i + 1 >= len(lines) or split_row(lines[i]) != ["crate"] + HEADER[1:] or not re.match(r"^\|[-:| ]+\|$", lines[i + 1].strip()):
        return [f"{readme}:{i + 1}: the crate map must start with the header | crate | {' | '.join(HEADER[1:])} |"], 0
    problems, order, rewritten = [], [], 0
    for j in range(i + 2, len(lines)):
        if not lines[j].lstrip().startswith("|"):
            break
        at, cells = f"{readme}:{j + 1}", split_row(lines[j])
        names = re.findall(r"`([^`]+)`", cells[0])
        if len(cells) != 3 or len(names) < 2:
            problems.append(f"{at}: a row of the crate map must be | `PATH/` `PACKAGE` | what it owns | what it may import |")
            continue
        path, name = names[0].rstrip("/") or ".", names[1]
        if path not in crates:
            problems.append(f"{at}: row `{names[0]}`: no workspace member {path} (members in Cargo.toml)")
            continue
        if crates[path][0] != name:
            problems.append(f"{at}: row `{names[0]}`: its package is `{crates[path][0]}`, not `{name}`")
        if path in order:
            problems.append(f"{at}: row `{names[0]}`: a second row for {path}")
        for dep in crates[path][1]:
            if dep not in order:
                problems.append(f"{at}: row `{names[0]}`: it links {crates[dep][0]}, whose row must come above it")
        order.append(path)
        deps = sorted(crates[path][1], key=lambda d: order.index(d) if d in order else len(order))
        want = ", ".join(f"`{crates[d][0]}`" for d in deps) or "—"
        if cells[2] != want:
            if write:
                lines[j] = "| " + " | ".join(cells[:2] + [want]) + " |"
                rewritten += 1
            else:
                problems.append(f"{at}: row `{names[0]}`: \"what it may import\" says {cells[2]!r}, its [dependencies] say {want!r} (bash scripts/check-layers.sh --write)")
    for m in sorted(set(crates) - set(order)):
        problems.append(f"{readme}: the crate map has no row for workspace member {m} (`{crates[m][0]}`): add | `{m}/` `{crates[m][0]}` | what it owns | | below the crates it links")
    if write and rewritten:
        open(readme, "w").write("\n".join(lines))
    return problems, rewritten


ETCD_STORE = "control-server/store-etcd"
# Raw access to etcd, crate-private in the store: a public method that takes
# a key as text (`rest: &str`, the store's name for a key below the prefix)
# or a fn that hands out an etcd client or lease id.
RAW = (r"^\s*pub\s+(?:async\s+)?fn\s+(\w+)[^{;]*?(?:\(&self,\s*rest\s*:\s*&str|->\s*(?:etcd_client::)?(?:Client|KvClient|WatchClient|LeaseClient)\b)"
       r"|^\s*pub\s+fn\s+(lease_id|set_lease|kv_of|watch_of)\b")


def check_etcd_layout():
    """The etcd layout is lks-store-etcd's: no other crate links etcd-client
    or names `etcd_client::`, the store's raw access (a key from text, the
    client, bytes at a key) is not public, and no code that holds an
    `EtcdStore` outside the store spells a key of the layout (a family of
    the table in store-etcd's lib.rs, `"nodes/…"`, or the single keys
    `"identity"`, `"leader"`). The code that needs etcd itself does not
    exist outside the store: the server and the tracker call its handles
    (`replicas()`, `load_board()`, `blob_chunks()`, `swarm()`,
    `identity()`, `archive()`). Not scanned: tests/, whose end-to-end
    tests check the stored layout from outside (tests/src/etcd.rs counts
    keys over etcd's HTTP gateway, not through the client) — that is the
    contract they prove unchanged. Not a key: the associated data sealed
    CA keys and kubeconfigs are bound to (lks-pki's
    `clusterca::keys`, lks-kube's `secret`: `{prefix}clusters/NAME#ca_key`,
    `{prefix}clusterkube/NAME#kubeconfig`, with the prefix "" on SQLite);
    it names the key but is never read or written as one."""
    problems = []
    for member, _ in workspace().items():
        deps = re.search(r"^\[dependencies\]\n(.*?)(?=^\[|\Z)", open(os.path.join(member, "Cargo.toml")).read(), re.M | re.S)
        if member != ETCD_STORE and deps and re.search(r"^etcd-client\s*[.=]", deps.group(1), re.M):
            problems.append(f"{member}/Cargo.toml: links etcd-client; only {ETCD_STORE} talks to etcd (add a typed method there)")
    lib = open(os.path.join(ETCD_STORE, "src/lib.rs")).read()
    families = set(re.findall(r"^//! \| `([a-z]+)", lib, re.M))
    if len(families) < 10:
        problems.append(f"{ETCD_STORE}/src/lib.rs: the key table in the crate doc (`//! | `family/...` | what |`) lists {len(families)} families")
    literal = re.compile(r'"(?:(?:' + "|".join(sorted(families)) + r')[/#]|identity"|leader")')
    for top in ("control-server", "lksadmin-agent", "proto"):
        for d, _, files in os.walk(top):
            for f in files:
                path = os.path.join(d, f)
                if not f.endswith(".rs") or path.startswith(ETCD_STORE + "/") or "/target/" in path:
                    continue
                # Comments blanked, not dropped: the line numbers stay.
                raw = re.sub(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))? )?mod tests \{.*", "", open(path).read(), flags=re.S)
                text = "\n".join("" if l.lstrip().startswith("//") else l for l in raw.split("\n"))
                if "etcd_client::" in text or re.search(r"\buse\s+etcd_client\b", text):
                    problems.append(f"{path}: names etcd_client; only {ETCD_STORE} talks to etcd (add a typed method there)")
                if re.search(r"\b(EtcdStore|lks_store_etcd|store::etcd)\b", text):
                    for m in literal.finditer(text):
                        line = text[: m.start()].count("\n") + 1
                        problems.append(f"{path}:{line}: spells the etcd key {m.group(0)}…; the layout is {ETCD_STORE}'s (add a typed method there)")
    for d, _, files in os.walk(os.path.join(ETCD_STORE, "src")):
        for f in files:
            path = os.path.join(d, f)
            for m in re.finditer(RAW, strip(open(path).read()), re.M):
                problems.append(f"{path}: `pub fn {m.group(1) or m.group(2)}` gives raw access to etcd outside the store: make it pub(crate)")
    return problems, 0


# The end-to-end tests' crate: all of it is tests.
TESTS_CRATE = "tests"
MAX_SHARE = 0.25


def library_lines(member):
    """Lines of the .rs files under `member`/src, tests aside: none in a
    `tests/` directory, no `tests.rs` or `*_tests.rs`."""
    n = 0
    for d, _, files in os.walk(os.path.join(member, "src")):
        if "tests" in os.path.relpath(d, member).split(os.sep):
            continue
        for f in files:
            if f.endswith(".rs") and f != "tests.rs" and not f.endswith("_tests.rs"):
                with open(os.path.join(d, f), "rb") as fh:
                    n += fh.read().count(b"\n")
    return n


def check_shares():
    """No workspace member holds more than MAX_SHARE of the library lines."""
    crates = workspace()
    lines = {m: library_lines(m) for m in crates if m != TESTS_CRATE}
    total = sum(lines.values())
    problems = []
    for m, n in sorted(lines.items(), key=lambda kv: -kv[1]):
        share = n / total if total else 0
        print(f"check-layers: {crates[m][0]:<22} {n:>6} of {total} library lines ({share:.1%})")
        if share > MAX_SHARE:
            problems.append(f"{m}: {crates[m][0]} holds {n} of the workspace's {total} library lines ({share:.1%}), more than {MAX_SHARE:.0%}: move a concern into a crate of its own (issue [shape-3])")
    return problems, 0


write = sys.argv[1:] == ["--write"]
if sys.argv[1:] not in ([], ["--write"]):
    sys.exit("usage: bash scripts/check-layers.sh [--write]")
def report(result, rewrote, ok):
    """Prints a map check's problems (True: it failed), or what it rewrote
    (`rewrote` with the row count), or that it holds (`ok`)."""
    problems, rewritten = result
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if not problems:
        print(f"check-layers: {rewrote.format(rewritten) if rewritten else ok}")
    return bool(problems)

failed = False
for src, layers in CRATES.items():
    count, problems = check(src, layers)
    for p in problems:
        print(f"check-layers: {p}", file=sys.stderr)
    if problems:
        failed = True
    else:
        print(f"check-layers: {count} modules of {src} in layers, no arrow up")
    if src not in MAPS:
        print(f"check-layers: {src} has no module map (MAPS in scripts/check-layers.sh)", file=sys.stderr)
        failed = True
        continue
    failed |= report(check_map(src, layers, MAPS[src], write),
                     f"{MAPS[src]}: rewrote \"what it may import\" in {{}} rows of the map of {src}",
                     f"{MAPS[src]}: the map of {src} has a row per module, in layers")
failed |= report(check_crates("README.md", write),
                 "README.md: rewrote \"what it may import\" in {} rows of the crate map",
                 "README.md: the crate map has a row per workspace member, each under the crates it links")
failed |= report(check_etcd_layout(), "", f"{ETCD_STORE}: the only crate that links etcd-client, names a key or reaches the client")
failed |= report(check_shares(), "", f"no crate holds more than {MAX_SHARE:.0%} of the workspace's library lines")
sys.exit(1 if failed else 0)
EOF
