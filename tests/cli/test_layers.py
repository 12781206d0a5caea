#!/usr/bin/env python3
"""The layering check (tools/check_layers.py) that `make` runs before compiling: the
repository passes it; a lower layer including an upper one, or a sibling's header,
fails it with a message naming both files; includes within a folder and downwards
pass.

Run: python3 tests/cli/test_layers.py --build build
"""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import REPO, Suite, check  # noqa: E402

suite = Suite("layers")
test = suite.test

CHECK = os.path.join(REPO, "tools", "check_layers.py")
FOLDERS = ("shared", "kernels", "kernels/cpu", "kernels/cuda", "worker/comm", "worker/engine",
           "worker/agent", "operator/runtime", "operator/k8s", "operator/cli")


def tree(files):
    """A copy of the layer folders holding only `files` ({path: text}); returns its root."""
    root = os.path.join(suite.tmp, "tree%d" % len(os.listdir(suite.tmp)))
    for d in FOLDERS:
        os.makedirs(os.path.join(root, d))
    os.makedirs(os.path.join(root, "tools"))
    shutil.copy(CHECK, os.path.join(root, "tools"))
    for path, text in files.items():
        with open(os.path.join(root, path), "w") as f:
            f.write(text)
    return root


def run_check(root):
    p = subprocess.run([sys.executable, os.path.join(root, "tools", "check_layers.py")],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    return p.returncode, p.stderr.decode()


@test
def the_repository_keeps_its_layers():
    rc, err = run_check(REPO)
    check(rc == 0, "check_layers failed on the repository:\n%s", err)


@test
def an_upward_include_fails_naming_both_files():
    root = tree({"operator/runtime/coordinator.h": "int x;\n",
                 "worker/engine/engine.c": '#include "util.h"\n#include "coordinator.h"\n',
                 "shared/util.h": "int y;\n"})
    rc, err = run_check(root)
    check(rc == 1, "exit %d, expected 1: %s", rc, err)
    check("worker/engine/engine.c:2 includes operator/runtime/coordinator.h" in err,
          "the message does not name both files: %s", err)
    check(err.count("layering:") == 1, "one violation expected: %s", err)


@test
def a_header_including_upwards_fails_too():
    root = tree({"operator/cli/commands.h": "int x;\n",
                 "operator/runtime/local_workers.h": '#include "commands.h"\n'})
    rc, err = run_check(root)
    check(rc == 1 and "operator/runtime/local_workers.h:1 includes operator/cli/commands.h" in err,
          "exit %d: %s", rc, err)


@test
def siblings_at_the_top_do_not_include_each_other():
    root = tree({"operator/k8s/controller.h": "int x;\n",
                 "operator/cli/cmd_run.c": '#include "controller.h"\n'})
    rc, err = run_check(root)
    check(rc == 1 and "operator/cli/ may not include operator/k8s/" in err, "exit %d: %s", rc,
          err)


@test
def downward_and_own_folder_includes_pass():
    root = tree({"shared/util.h": "int a;\n",
                 "worker/engine/engine.h": '#include "util.h"\n',
                 "worker/agent/agent.c": '#include "engine.h"\n#include "agent.h"\n',
                 "worker/agent/agent.h": "int b;\n",
                 "operator/cli/pliant.c": '#include "engine.h"\n#include <stdio.h>\n'})
    rc, err = run_check(root)
    check(rc == 0, "exit %d: %s", rc, err)


if __name__ == "__main__":
    sys.exit(suite.main())
