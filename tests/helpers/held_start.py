"""A Hydra callback that holds a starting run once its folder is claimed, until the file
``$HELD_UNTIL`` exists: a test signals the run, then writes the file, and the run's first long
phase finds the stop waiting whatever this machine's speed.

    +hydra.callbacks.held._target_=held_start.HeldStart
"""

import os
import time
from pathlib import Path

from hydra.experimental.callback import Callback


class HeldStart(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        go = Path(os.environ["HELD_UNTIL"])
        for _ in range(6000):  # 60 s at most
            if go.exists():
                return
            time.sleep(0.01)
