#!/usr/bin/env python3
# check_layers.py — checks every #include of POS's own headers against the layer table of
# docs/architecture.md (which folder may include which); run by CI as the `layering` test.
"""Usage: tools/check_layers.py [ROOT]   exit 0: every include follows the table; 1: lists each breach."""
import os
import re
import sys

# Layers by folder (the longest matching prefix names a file's layer), and what each may include.
# Kept in the order of docs/architecture.md's table; a change here is a change of the architecture.
LAYERS = [
    # (layer, folder prefixes, layers it may include besides itself)
    ("base", ["pos/base/"], []),
    ("ckpt", ["ckpt/"], ["base"]),
    ("engine", ["pos/checkpoint/"], ["base", "ckpt", "core-types"]),
    ("core-types", ["pos/api_context.h", "pos/api_table.h", "pos/backend.h", "pos/backend.cc", "pos/config.",
                    "pos/handle.", "pos/inline_vec.h", "pos/call_profile.", "pos/resource_ops."],
     ["base"]),
    ("core", ["pos/client.", "pos/workspace."], ["base", "ckpt", "core-types", "engine"]),
    ("cuda_impl", ["pos/cuda_impl/"], ["base", "ckpt", "core-types", "core", "engine"]),
    ("backends", ["pos/backends/"], ["base", "core-types"]),
    ("runtime", ["pos/runtime."], ["base", "core-types", "core", "cuda_impl", "backends"]),
    ("wire", ["remoting/common/"], ["base"]),
    ("client", ["remoting/client/"], ["base", "wire"]),
    ("inproc", ["remoting/inproc/"], ["base", "wire", "client", "core-types", "core", "engine", "runtime", "ckpt"]),
    ("server", ["remoting/server/"], ["base", "wire", "client", "core-types", "core", "engine", "runtime", "ckpt"]),
    ("driver", ["remoting/driver/"], ["base", "wire", "core-types", "core", "engine", "runtime"]),
]
# Files of a layer that may reach one step further, each with the reason.
EXCEPTIONS = {
    # POSClient's checkpoint members (record, restore, stop): the engine's half of the client class.
    ("pos/checkpoint/client_checkpoint.cc", "core"),
    # The in-process job's device image: its region table and CRC-32C are ckpt's (region_table.h,
    # crc32c.h: no Protobuf, which must not enter a process that may carry its own).
    ("remoting/driver/device_image.h", "ckpt"),
    ("remoting/driver/device_image.cc", "ckpt"),
    ("remoting/driver/held_memory.cc", "ckpt"),  # the hand-off's allocation-list checksum (crc32c.h)
    # pos-cli's side of an in-process job's device-memory hand-off: the driver layer's device-neutral
    # held memory and device image, which both ends of the hand-off share (held_memory.h).
    ("remoting/server/job_dump.cc", "driver"),
    ("remoting/server/job_restore.cc", "driver"),
}
# Not layered: programs and tests over the libraries.
UNLAYERED = ("tools/", "unittest/", "bench/", "workloads/")

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    best = None
    for name, prefixes, _ in LAYERS:
        for p in prefixes:
            if path.startswith(p) and (best is None or len(p) > best[1]):
                best = (name, len(p))
    return best[0] if best else None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    allowed = {name: set(deps) | {name} for name, _, deps in LAYERS}
    breaches, files = [], 0
    for top in ("pos", "ckpt", "remoting"):
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if not n.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.relpath(os.path.join(dirpath, n), root)
                if path.startswith(UNLAYERED):
                    continue
                src = layer_of(path)
                if src is None:
                    breaches.append(f"{path}: in no layer of the table (add it to tools/check_layers.py "
                                    "and docs/architecture.md)")
                    continue
                files += 1
                with open(os.path.join(root, path), encoding="utf-8") as f:
                    text = f.read()
                for inc in INCLUDE.findall(text):
                    if inc.endswith(".pb.h"):
                        inc = "ckpt/"  # generated from ckpt/image.proto
                    if not inc.startswith(("pos/", "ckpt/", "remoting/")):
                        continue
                    dst = layer_of(inc)
                    if dst is None:
                        breaches.append(f"{path}: includes {inc}, which is in no layer")
                    elif dst not in allowed[src] and (path, dst) not in EXCEPTIONS:
                        breaches.append(f"{path} ({src}) includes {inc} ({dst}): not allowed")
    for b in breaches:
        print(b)
    print(f"layering: {files} files checked, {len(breaches)} breaches")
    return 1 if breaches or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
