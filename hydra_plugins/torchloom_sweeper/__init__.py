"""Hydra instantiates sweepers only from classes defined in the ``hydra_plugins`` package: this
is torchloom's Optuna sweeper there; all it does lives in utils/run/search.py
(conf/hydra/sweeper/torchloom_optuna.yaml)."""

from utils.run.search import StudySweeper


class OptunaSweeper(StudySweeper):
    """``hydra/sweeper=torchloom_optuna``: utils/run/search.py's :class:`StudySweeper`."""
