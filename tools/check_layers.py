#!/usr/bin/env python3
"""Refuses an include that goes up a layer: `make` runs it before compiling anything.

The folders of the product, bottom up (docs/architecture.md has the same table), and
the folders each may include from besides its own. Every `#include "x.h"` of a .c, .h,
.cu or .cuh file is resolved as the compiler does (the file's own folder first, then
the folders in INCLUDE_ORDER, which is the Makefile's -I order); an include resolving to
a folder not allowed is reported naming both files, and the exit status is 1.
Standard library only.
"""

import os
import re
import sys

ALLOWED = {
    "shared": [],
    "kernels": ["shared"],
    "kernels/cpu": ["kernels", "shared"],
    "kernels/cuda": ["kernels", "shared"],
    # the worker is one layer: the engine and the transports use each other's types
    "worker/comm": ["worker/engine", "kernels", "shared"],
    "worker/engine": ["worker/comm", "kernels", "shared"],
    "worker/agent": ["worker/engine", "worker/comm", "kernels", "shared"],
    "operator/runtime": ["worker/agent", "worker/engine", "worker/comm", "kernels", "shared"],
    "operator/k8s": ["operator/runtime", "worker/agent", "worker/engine", "worker/comm",
                     "kernels", "shared"],
    "operator/cli": ["operator/runtime", "worker/agent", "worker/engine", "worker/comm",
                     "kernels", "shared"],
}

# The Makefile's include path, in its order.
INCLUDE_ORDER = ["shared", "kernels", "worker/engine", "worker/comm", "worker/agent",
                 "operator/runtime", "operator/k8s", "operator/cli"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def resolve(root, folder, name):
    for d in [folder] + INCLUDE_ORDER:
        if os.path.isfile(os.path.join(root, d, name)):
            return os.path.normpath(os.path.join(d, name))
    return None


def check(root):
    bad = []
    for folder in sorted(ALLOWED):
        d = os.path.join(root, folder)
        if not os.path.isdir(d):
            bad.append("%s: a layer folder that does not exist (tools/check_layers.py)" % folder)
            continue
        for name in sorted(os.listdir(d)):
            if not name.endswith(SOURCE_EXT):
                continue
            path = os.path.join(folder, name)
            with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE_RE.match(line)
                    if not m:
                        continue
                    target = resolve(root, folder, m.group(1))
                    if target is None:
                        continue  # not a project header (the compiler reports a missing one)
                    tfolder = os.path.dirname(target)
                    if tfolder != folder and tfolder not in ALLOWED[folder]:
                        bad.append("%s:%d includes %s: %s/ may not include %s/ (a layer above "
                                   "it or beside it; see docs/architecture.md)"
                                   % (path, lineno, target, folder, tfolder))
    return bad


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = check(root)
    for line in bad:
        print("layering: " + line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
