"""A command's life: where it lives, how it starts and continues, what it shows and writes.

cli               run_cli: a command line Hydra cannot compose ends in one line
folders           the run dir checked and claimed before Hydra writes it; the checkpoint folder
start             continue, replace or refuse; RunContext: which process, whether it writes files
resume_changes    what a resume may change, and how each difference is classified
outputs           who prints and who writes (the history, metrics.json, tables), decided once
report            what the config tree, model summary, final table and metrics.json hold
sweep             sweep jobs: skip finished, record failures, the summary table
search            the Optuna sweeper: a study on disk, continued; trials claimed, run, told
study             a study's space, sampler, pruner, storage, its trials as rows
trial             inside a trial's job: its values reported after each validation or fold
cross_validation  cv=K: every fold a run of its own, resumable; oof.csv, pooled metrics
refit             trainer.refit: the final model trained again on train ∪ val, resumable
provenance        what produced a run: command, code, packages, machine, data; guards resume
compare           why two runs differ (compare.py): config, code, packages, machine, data
"""

# What the entry points use, importable from the package.
from utils.run import provenance
from utils.run.cli import one_line_errors, run_cli
from utils.run.cross_validation import cross_validate, save_fold_predictions
from utils.run.outputs import Outputs, check_output
from utils.run.refit import refit
from utils.run.start import RunContext, start_run

__all__ = [
    "Outputs",
    "RunContext",
    "check_output",
    "cross_validate",
    "one_line_errors",
    "provenance",
    "refit",
    "run_cli",
    "save_fold_predictions",
    "start_run",
]
