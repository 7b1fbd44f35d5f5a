"""The kernels in a Triton cache directory, counted by name: how many compiles a start-up made
(run it on the ``TRITON_CACHE_DIR`` of a start from an empty cache).

    python benchmarks/triton_cache_kernels.py CACHE_DIR

Prints ``count name`` per kernel, most compiled first, then the total.
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys


def kernel_counts(cache_dir: str) -> collections.Counter:
    """Compiled kernels per name: one per ``<name>.json`` metadata file (Triton's group files,
    ``__grp__*.json``, are skipped)."""
    counts = collections.Counter()
    for path in glob.glob(os.path.join(cache_dir, "*", "*.json")):
        if os.path.basename(path).startswith("__grp__"):
            continue
        with open(path) as f:
            meta = json.load(f)
        if "name" in meta:
            counts[meta["name"]] += 1
    return counts


if __name__ == "__main__":
    counts = kernel_counts(sys.argv[1])
    for name, n in counts.most_common():
        print(f"{n:3} {name}")
    print(f"{sum(counts.values()):3} in all")
