#!/usr/bin/env python3
"""Fails when a file includes a header of a layer above its own.

tern's folders are layers (README, "A tour of the layers"), bottom up:

    include/tern   the public C API: includes only itself
    common/        status values, timelines, logging, the ISA rules
    driver_shim/   the only code that talks to a device
    src/           libtern: memory, executables, the runtime
    collectives/   communicators over libfabric (part of libtern, above src/)
    tools/ examples/ python/ compiler/   consumers: the public API only
                   (python/ may also use compiler/, the library its
                   export and torch.compile front ends call)

A file may include the public headers, headers of its own folder, and
headers of the layers below it; consumers may include only the public
headers and their own files. tests/, bench/ and fuzz/ are white-box and may
include anything. The few deliberate exceptions are listed below with their
reason, as Chromium's DEPS files or Bazel's visibility lists do.

Internal includes are written from the repository root ("common/status_with_
message.h", "src/runtime/runtime_state.h"); a bare name ("util.h") means a
header in the including file's own folder.

Usage: scripts/check-layers.py [REPO_ROOT]   (exit 0: clean; 1: violations)
       scripts/check-layers.py --self-test   (the check catches what it should)
"""
import os
import re
import subprocess
import sys

# Layer number of each top-level folder; a file may include from layers at or
# below its own number ("public" is 0 and open to everyone).
LAYERS = {
    "include": 0,
    "common": 1,
    "driver_shim": 2,
    "src": 3,
    "collectives": 4,
}
# Consumers sit above every layer but see only the public API and themselves.
CONSUMERS = {"tools", "examples", "python", "compiler"}
# ... and the consumers below them in this table: the PyTorch plugin's
# export and torch.compile front ends hand graphs to the compiler library.
CONSUMER_USES = {"python": {"compiler"}}
# White-box code: tests may reach into any layer.
WHITE_BOX = {"tests", "bench", "fuzz"}

# (including file, included header): why the rule does not hold there.
EXCEPTIONS = {
    ("tools/src/dump.cc", "src/executable/dump.h"):
        "`tern dump` prints containers that the loader refuses, so it reads them with the "
        "executable library itself rather than through tern_executable_load",
    ("compiler/lower/constant_pool.cc", "common/half_float.h"):
        "a constant the compiler stores as bf16 or fp16 is rounded by the same header-only rules "
        "as the engines and the collectives round, rather than by a copy of them",
    ("tools/src/util.cc", "common/byte_size.h"):
        "the tools accept byte sizes exactly as TERN_SIM_TOPOLOGY does: one parser, linked from "
        "the bottom layer, rather than a second copy of the rules",
}

# Headers generated at build time: the folder they belong to.
GENERATED = {
    "src/executable/tern_executable_generated.h": "src",
}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def top(path):
    return path.split("/", 1)[0]


def resolve(repo, including, name, quoted):
    """The repository path of an included header, or None for a system one."""
    if name.startswith("tern/"):
        return "include/" + name
    if name in GENERATED:
        return name
    here = os.path.dirname(including)
    if quoted and "/" not in name and os.path.exists(os.path.join(repo, here, name)):
        return os.path.join(here, name)
    if quoted and top(including) in CONSUMERS:
        # A consumer builds on its own include roots (python/csrc, tools/src):
        # a path relative to the including folder or one above it, inside
        # the consumer's folder.
        folder = here
        while folder:
            if os.path.exists(os.path.join(repo, folder, name)):
                return os.path.normpath(os.path.join(folder, name))
            folder = os.path.dirname(folder)
    if os.path.exists(os.path.join(repo, name)) and top(name) in LAYERS.keys() | CONSUMERS | WHITE_BOX:
        return name
    if quoted:
        return "?" + name  # a project include that names no file: an error of its own
    return None


def allowed(src_top, dst_top):
    if dst_top == "include" or dst_top == src_top or src_top in WHITE_BOX:
        return True
    if src_top in CONSUMERS:
        return dst_top in CONSUMER_USES.get(src_top, set())
    if src_top in LAYERS and dst_top in LAYERS:
        return LAYERS[dst_top] <= LAYERS[src_top]
    return False


def self_test():
    """Builds a small repository with one allowed and three forbidden includes."""
    import tempfile
    with tempfile.TemporaryDirectory() as repo:
        files = {
            "common/a.h": "",
            "src/runtime/r.h": '#include "common/a.h"\n',            # down: fine
            "driver_shim/d.cc": '#include "src/runtime/r.h"\n',      # up: forbidden
            "tools/t.cc": '#include <tern/tern.h>\n#include "common/a.h"\n',  # consumer: forbidden
            "src/x.cc": '#include "nowhere/n.h"\n',                   # unresolved
            "tests/u.cc": '#include "src/runtime/r.h"\n',            # white-box: fine
        }
        for name, text in files.items():
            os.makedirs(os.path.join(repo, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(repo, name), "w") as f:
                f.write(text)
        subprocess.run(["git", "init", "-q", repo], check=True)
        errors = check(repo)
        expected = ["driver_shim/d.cc:1", "tools/t.cc:2", "src/x.cc:1"]
        got = [e.split(": ", 1)[0] for e in errors]
        if sorted(got) != sorted(expected):
            print(f"check-layers self-test failed: expected {expected}, got {errors}", file=sys.stderr)
            return 1
    print("check-layers: self-test passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    errors, count = check(repo), len(sources_of(repo))
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        print(f"check-layers: {len(errors)} include(s) break the layer order", file=sys.stderr)
        return 1
    print(f"check-layers: {count} files, every include respects the layer order")
    return 0


def sources_of(repo):
    files = subprocess.run(["git", "-C", repo, "ls-files", "-co", "--exclude-standard"],
                           capture_output=True, text=True, check=True).stdout.split()
    return [f for f in files if re.search(r"\.(c|cc|h)$", f) and os.path.exists(os.path.join(repo, f))]


def check(repo):
    """Every include that breaks the layer order, as 'path:line: message'."""
    errors = []
    for path in sources_of(repo):
        src_top = top(path)
        with open(os.path.join(repo, path), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                target = resolve(repo, path, m.group(2), m.group(1) == '"')
                if target is None:
                    continue
                if target.startswith("?"):
                    errors.append(f"{path}:{number}: includes \"{target[1:]}\", which is no file of the "
                                  "repository: write internal includes from the repository root "
                                  "(\"common/...\", \"src/...\") or name a header of the same folder")
                    continue
                dst_top = top(target)
                if allowed(src_top, dst_top) or (path, target) in EXCEPTIONS:
                    continue
                if src_top in CONSUMERS:
                    why = (f"{src_top}/ is a consumer: it may include only the public headers "
                           "(<tern/...>) and its own files. Use the public API, or grow it")
                else:
                    why = (f"{src_top}/ is below {dst_top}/ in the layer order "
                           "(common <- driver_shim <- src <- collectives): move the code down, "
                           "or pass what is needed in through an interface of the lower layer")
                errors.append(f"{path}:{number}: includes {target}: {why}")
    return errors


if __name__ == "__main__":
    sys.exit(main())
