"""A tracker backend that runs in a process of its own and tells what that process holds."""

from __future__ import annotations

import os
import sys

from utils.tracking.local import Backend


class Probe(Backend):
    name = "probe"
    own_process = True

    def position(self) -> dict:
        return {"modules": sorted(sys.modules), "pid": os.getpid(), "session": os.getsid(0)}
