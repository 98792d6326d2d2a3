"""``python counting_cache.py OVERRIDES`` runs train.py as its command line would, and each
process appends a line ``<rank> <cache file>`` to ``$CACHE_BUILDS`` for every image cache it
builds, so a test counts who built what (a build's own log line is rank 0's alone)."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from data.images import image_cache  # noqa: E402

build_file = image_cache.build_file


def counted(path, files, workers, name):
    with open(os.environ["CACHE_BUILDS"], "a") as f:
        f.write(f"{os.environ.get('RANK', '0')} {path.name}\n")
    return build_file(path, files, workers, name)


image_cache.build_file = counted
sys.argv = [str(ROOT / "train.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
