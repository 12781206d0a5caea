#!/usr/bin/env python3
"""Leader election (operator/k8s/leader.c) against the API emulator (tests/k8s/apiserver.py)
over TLS with a bearer token: `build/tests/test_leader --kubeconfig KUBECONFIG` runs two
electors on one Lease (exactly one leads; a stopped leader hands over at once; a leader
whose renewals fail under injected 500s steps down and the other takes over once the lease
expires). Each run gets a fresh emulator; the sanitized build is run too when it exists.
The C program's result lines are passed on, prefixed with "leader_emulator." (and "asan/").

Run: python3 tests/cli/test_leader_emulator.py --build build
"""

import argparse
import os
import sys

import test_kube_client_emulator as emu

BINARY = "test_leader"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    args = ap.parse_args()
    build = args.build if os.path.isabs(args.build) else os.path.join(emu.REPO, args.build)
    emu.PREFIX = "leader_emulator."  # run_binary labels the result lines with it
    failures = 0
    for sub, label, env in (("tests", "", {}),
                            (os.path.join("asan", "tests"), "asan/", emu.ASAN_ENV)):
        binary = os.path.join(build, sub, BINARY)
        if not os.access(binary, os.X_OK):
            print("skip %s%sall: %s not built" % (emu.PREFIX, label, binary))
        elif not os.path.exists(emu.EMULATOR):
            print("skip %s%sall: %s not found" % (emu.PREFIX, label, emu.EMULATOR))
        else:
            failures += emu.run_binary(binary, label, env)
        sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
