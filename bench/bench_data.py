"""The benchmarks' training data: byte-level token shards of Tiny Shakespeare."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAKESPEARE = os.path.join(os.path.dirname(REPO), "shared", "data", "tinyshakespeare.txt")


def shakespeare_shards(pliant, tmp, nbytes=200000):
    """PREFIX_train.bin / PREFIX_val.bin of the first nbytes of Tiny Shakespeare in tmp,
    made by `pliant tokenize --bytes`; returns PREFIX."""
    text = os.path.join(tmp, "ts.txt")
    with open(SHAKESPEARE, "rb") as src, open(text, "wb") as dst:
        dst.write(src.read(nbytes))
    data = os.path.join(tmp, "ts")
    subprocess.run([pliant, "tokenize", "--bytes", text, data], check=True, capture_output=True)
    return data
