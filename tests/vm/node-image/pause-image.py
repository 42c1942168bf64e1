#!/usr/bin/env python3
"""Packs a static binary as a one-layer container image in the archive
format `ctr images import` reads (docker save's: manifest.json naming the
config and the layer, the image reference in RepoTags).

    pause-image.py BINARY REF OUT.tar

The layer holds BINARY as /pause (0755, root); the image runs it as
65535:65535, as the upstream pause image does. Deterministic: the same
binary gives the same bytes.
"""
import hashlib
import io
import json
import sys
import tarfile


def entry(name, data, mode):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    return info


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: pause-image.py BINARY REF OUT.tar")
    binary, ref, out = sys.argv[1:]
    with open(binary, "rb") as f:
        data = f.read()
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as t:
        t.addfile(entry("pause", data, 0o755), io.BytesIO(data))
    layer = layer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [ref], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as t:
        for name, body in (("layer.tar", layer), (config_name, config), ("manifest.json", manifest)):
            t.addfile(entry(name, body, 0o644), io.BytesIO(body))


if __name__ == "__main__":
    main()
