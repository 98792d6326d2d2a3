"""The model as built, stepped and evaluated, and its optimizer.

modules  the model as built, as the step calls it (DDP, compile), as evaluation calls it
checks   the dummy forward; parameter counts
weights  the unwrapped module; loading weights that must fit exactly
optim    the optimizer's parameter groups (no decay on biases and norms, each layer's LR)
guards   start-up checks against classic pitfalls; step counts
"""

# What the entry points use, importable from the package.
from utils.model.guards import check_start_up
from utils.model.modules import Modules
from utils.model.optim import build_optimizer, lr_table

__all__ = [
    "Modules",
    "build_optimizer",
    "check_start_up",
    "lr_table",
]
