#!/usr/bin/env bash
# Checks the dependency tree Cargo.lock pins, offline (cargo-deny's
# `bans`, `sources` and `licenses` checks, with the rules written here):
#
#   sources   every package comes from crates.io or is a path in this
#             repository: a workspace member, or a vendored crate under
#             third_party/ that has its lksadmin.patch (scripts/check-vendor.sh
#             proves the tree is the published crate plus that patch). No git
#             dependency, no other registry, no path outside the repository.
#   bans      no OpenSSL (openssl, openssl-sys, native-tls), no aws-lc
#             (aws-lc-sys needs cmake and slows every cold build; ring is the
#             crypto provider everywhere), and rustls, tokio-rustls and
#             rustls-webpki only as published on crates.io (never a fork).
#   licenses  every package's SPDX expression is satisfied by the licences
#             allowed below (permissive ones that the Debian packages may
#             ship); "A/B" is read as "A OR B", as crates.io did.
#
#   yanked    no locked crates.io version is yanked (cargo-deny's
#             `advisories.yanked`): a yank is how a maintainer withdraws a
#             broken or vulnerable release. Read from the crates.io sparse
#             index (https://index.crates.io), one request per crate;
#             `--offline` skips this part, and says so.
#
# Not checked here: the RustSec advisory database. `cargo deny check
# advisories` and `cargo audit` read it from GitHub, which this project's
# build machines cannot reach (only the package registries are); run either
# where GitHub is reachable.
#
# Usage: bash scripts/check-deps.sh [--offline]   (needs cargo and python3)
set -euo pipefail
cd "$(dirname "$0")/.."
offline=0
case "${1:-}" in
  "") ;;
  --offline) offline=1 ;;
  *) echo "usage: bash scripts/check-deps.sh [--offline]" >&2; exit 2 ;;
esac

cargo metadata --format-version 1 --locked --all-features >"${TMPDIR:-/tmp}/lks-deps.$$.json"
trap 'rm -f "${TMPDIR:-/tmp}/lks-deps.$$.json"' EXIT

python3 - "${TMPDIR:-/tmp}/lks-deps.$$.json" "$PWD" "$offline" <<'EOF'
import concurrent.futures, json, os, re, sys, time, urllib.error, urllib.request

meta = json.load(open(sys.argv[1]))
root = os.path.realpath(sys.argv[2]) + "/"
CRATES_IO = "registry+https://github.com/rust-lang/crates.io-index"
BANNED = {
    "openssl": "OpenSSL: rustls with the ring provider is the TLS stack",
    "openssl-sys": "OpenSSL: rustls with the ring provider is the TLS stack",
    "native-tls": "OpenSSL through native-tls: rustls is the TLS stack",
    "aws-lc-sys": "aws-lc needs cmake and slows every cold build: use the ring provider",
    "aws-lc-rs": "aws-lc needs cmake and slows every cold build: use the ring provider",
}
FROM_CRATES_IO_ONLY = {"rustls", "tokio-rustls", "rustls-webpki"}
ALLOWED_LICENSES = {
    "MIT", "Apache-2.0", "BSD-1-Clause", "BSD-2-Clause", "BSD-3-Clause", "0BSD",
    "ISC", "Zlib", "Unicode-3.0", "Unlicense", "BSL-1.0", "CC0-1.0",
    "CDLA-Permissive-2.0",
    # bzip2's own licence (libbz2-rs-sys, through qbsdiff's bzip2 for
    # binary deltas): BSD-style, permissive, no advertising clause.
    "bzip2-1.0.6",
}
members = set(meta["workspace_members"])

def license_ok(expr):
    """Evaluates an SPDX expression (OR, AND, WITH, parentheses) against
    ALLOWED_LICENSES; a WITH exception only widens what its licence allows."""
    toks = re.findall(r"\(|\)|[^\s()]+", expr.replace("/", " OR "))
    pos = 0
    def primary():
        nonlocal pos
        if pos >= len(toks):
            raise ValueError("unexpected end")
        t = toks[pos]; pos += 1
        if t == "(":
            v = disjunction()
            if pos >= len(toks) or toks[pos] != ")":
                raise ValueError("unbalanced parenthesis")
            pos += 1
            return v
        ok = t.rstrip("+") in ALLOWED_LICENSES
        if pos < len(toks) and toks[pos] == "WITH":
            pos += 2
        return ok
    def conjunction():
        nonlocal pos
        v = primary()
        while pos < len(toks) and toks[pos] == "AND":
            pos += 1
            v = primary() and v
        return v
    def disjunction():
        nonlocal pos
        v = conjunction()
        while pos < len(toks) and toks[pos] == "OR":
            pos += 1
            v = conjunction() or v
        return v
    v = disjunction()
    if pos != len(toks):
        raise ValueError("trailing tokens")
    return v

problems = []
for p in meta["packages"]:
    name, ver, src = p["name"], p["version"], p["source"]
    who = f"{name} {ver}"
    if src is None:
        path = os.path.realpath(os.path.dirname(p["manifest_path"])) + "/"
        if not path.startswith(root):
            problems.append(f"sources: {who} is a path outside the repository ({path})")
        elif p["id"] not in members:
            rel = path[len(root):]
            if not (re.fullmatch(r"third_party/[^/]+/", rel) and os.path.exists(path + "lksadmin.patch")):
                problems.append(f"sources: {who} is a path dependency ({rel}) that is neither a workspace member nor a vendored crate with its lksadmin.patch")
    elif src != CRATES_IO:
        problems.append(f"sources: {who} comes from {src}, not crates.io")
    if name in BANNED:
        problems.append(f"bans: {who} is in the tree: {BANNED[name]}")
    if name in FROM_CRATES_IO_ONLY and src != CRATES_IO:
        problems.append(f"bans: {who} is not the crates.io release (a fork of the TLS stack)")
    lic = p.get("license")
    if p["id"] in members:
        continue
    if not lic:
        problems.append(f"licenses: {who} declares no SPDX licence (license-file only)")
        continue
    try:
        if not license_ok(lic):
            problems.append(f"licenses: {who} is under {lic!r}, which none of the allowed licences satisfies")
    except ValueError as e:
        problems.append(f"licenses: {who} has an unreadable licence expression {lic!r}: {e}")

def index_path(name):
    """Where the sparse index keeps a crate (the registry's layout rules)."""
    n = name.lower()
    if len(n) <= 2:
        return f"{len(n)}/{n}"
    if len(n) == 3:
        return f"3/{n[0]}/{n}"
    return f"{n[:2]}/{n[2:4]}/{n}"

def yanked(name, version):
    """True if crates.io lists `name` `version` as yanked; raises when the
    index cannot be read or does not know the version."""
    url = f"https://index.crates.io/{index_path(name)}"
    req = urllib.request.Request(url, headers={"User-Agent": "lksadmin check-deps"})
    # A failed lookup or connection is tried again (4 tries, 1 s, 2 s, 4 s
    # apart): 16 requests at once now and then meet a resolver that
    # briefly answers "temporary failure"; an answer is never retried.
    for attempt in range(4):
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                body = r.read().decode()
            break
        except urllib.error.HTTPError:
            raise
        except (urllib.error.URLError, OSError):
            if attempt == 3:
                raise
            time.sleep(2 ** attempt)
    for line in body.splitlines():
        if line.strip():
            e = json.loads(line)
            if e.get("vers") == version:
                return bool(e.get("yanked"))
    raise LookupError(f"{url} does not list version {version}")

from_index = sorted({(p["name"], p["version"]) for p in meta["packages"] if p["source"] == CRATES_IO})
checked = "not checked (--offline)"
if sys.argv[3] != "1":
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        futures = {pool.submit(yanked, n, v): (n, v) for n, v in from_index}
        unread = []
        for f in concurrent.futures.as_completed(futures):
            n, v = futures[f]
            try:
                if f.result():
                    problems.append(f"yanked: {n} {v} is yanked on crates.io: `cargo update -p {n}` to a release that is not")
            except (urllib.error.URLError, OSError, LookupError, ValueError) as e:
                unread.append(f"{n} {v}: {e}")
        if unread:
            problems.append(f"yanked: could not read the crates.io index for {len(unread)} crates (first: {unread[0]}); "
                            "run with --offline to skip this part")
    checked = f"{len(from_index)} crates.io versions not yanked"

for line in problems:
    print(f"check-deps: {line}", file=sys.stderr)
if problems:
    sys.exit(1)
print(f"check-deps: {len(meta['packages'])} packages: sources, bans and licences ok; {checked}")
EOF
