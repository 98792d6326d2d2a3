"""The epochs: the step, the state that resumes, the averages, when to save.

loop            Parts (what a step changes) and the step and its epochs: NaN watch, timing, stop
state           TrainState: every counter that resumes, and the latest metrics
loss_sums       the loss summed on the device between syncs
nonfinite       what happens on a NaN or Inf loss
ema             an exponential moving average of the weights (trainer.ema)
swa             stochastic weight averaging (trainer.swa), BatchNorm statistics refitted
teacher         distill.*: the teacher from its checkpoint, the blended loss, its file's sha256
early_stopping  when the monitored metric stopped improving (trainer.early_stopping)
progress        the progress bar and plain progress lines
checkpointer    what is saved, when and where; resume, stop, best
top_k           the top-k copies: their names, ranking, which stay and which go
callbacks/      yours, named in the config: their hooks, their state, the ready-made ones
"""

# What the entry points use, importable from the package.
from utils.fit.callbacks.hooks import CallbackFailed, Callbacks
from utils.fit.checkpointer import Checkpointer
from utils.fit.early_stopping import EarlyStopping
from utils.fit.loop import Loop, Objective, Parts
from utils.fit.progress import TrainingProgress
from utils.fit.state import TrainState
from utils.fit.teacher import Teacher

__all__ = [
    "CallbackFailed",
    "Callbacks",
    "Checkpointer",
    "EarlyStopping",
    "Loop",
    "Objective",
    "Parts",
    "Teacher",
    "TrainState",
    "TrainingProgress",
]
