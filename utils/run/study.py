"""A study of torchloom's Optuna sweeper (utils/run/search.py): its search space as
``hydra-optuna-sweeper`` wrote it, its sampler, its pruner, its storage and its trials as rows
for the report. Inside a trial's job: utils/run/trial.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, RangeSweep
from omegaconf import DictConfig, OmegaConf

from utils.config.arguments import finite_number
from utils.errors import UserError

SAMPLERS = ("tpe", "random", "cmaes", "grid")
PRUNERS = ("auto", "none", "median", "percentile", "halving", "hyperband", "wilcoxon")
# pruner=auto: what Optuna's guide recommends for each sampler (its benchmarks: HyperbandPruner
# with TPE, MedianPruner with random search); median for the others.
RECOMMENDED = {"tpe": "hyperband", "random": "median", "cmaes": "median", "grid": "median"}
DIRECTIONS = ("maximize", "minimize")
# What a trial's job reads from its environment: the study's storage (with any password, which
# never reaches a file), its name and the trial's number.
STORAGE_ENV, STUDY_ENV, TRIAL_ENV = "TORCHLOOM_STUDY_STORAGE", "TORCHLOOM_STUDY", "TORCHLOOM_TRIAL"
SPACE_ATTR = "torchloom:search_space"  # the study's search space, so another one is refused
OBJECTIVES_ATTR = "torchloom:objectives"  # the metrics a study optimises, in its directions' order
OWNER_ATTR = "torchloom:owner"  # host and process of the sweeper running a trial
HEARTBEAT_ATTR = "torchloom:heartbeat"  # when that sweeper last said it runs the trial (Unix time)
PASSWORD = re.compile(r"(://[^:/@]+:)([^@]+)(@)")


def optuna() -> Any:
    """Optuna, or one line naming the extra."""
    try:
        import optuna as library
    except ImportError:
        raise UserError(
            'hydra/sweeper=torchloom_optuna needs Optuna: pip install -e ".[sweep]"'
        ) from None
    major, minor = (int(part) for part in library.__version__.split(".")[:2])
    if (major, minor) < (4, 7):
        raise UserError(
            f"hydra/sweeper=torchloom_optuna needs Optuna 4.7 or later, and {library.__version__} is "
            'installed: pip install -e ".[sweep]"'
        )
    library.logging.set_verbosity(library.logging.WARNING)
    return library


def redacted(url: str) -> str:
    """A storage URL with its password replaced by ``***``."""
    return PASSWORD.sub(r"\1***\3", url)


def shares_its_folder(config: DictConfig) -> bool:
    """Whether the sweep is a study's, whose workers share one sweep folder (each trial in its
    own job folder, handed out one at a time: utils/run/search.py), so the folder is not
    claimed whole."""
    target = str(OmegaConf.select(config, "hydra.sweeper._target_", default="") or "")
    return target.startswith("hydra_plugins.torchloom_sweeper.")


# --- The search space ------------------------------------------------------------------------


def search_space(params: dict[str, str], arguments: Sequence[str]) -> tuple[dict, list[str]]:
    """(distributions by key, fixed overrides) of ``hydra.sweeper.params`` and the command
    line's overrides: ``choice(...)``, ``range(...)``, ``interval(...)`` (a ``tag(log, ...)``
    makes it logarithmic; ``int(interval(...))`` whole numbers) are searched; plain values are
    passed to every trial as they are."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides([*lines, *arguments])
    except Exception as error:
        raise UserError(
            f"hydra.sweeper.params: {str(error).splitlines()[0]}; write a space as "
            "choice(a, b), range(1, 10), interval(0.1, 1.0) or tag(log, interval(1e-4, 1e-1))"
        ) from None
    distributions, fixed = {}, []
    for override in parsed:
        if override.is_sweep_override():
            distributions[override.get_key_element()] = _distribution(override)
        else:
            fixed.append(override.input_line)
    return distributions, fixed


def _distribution(override: Any) -> Any:
    library, key = optuna(), override.get_key_element()
    value = override.value()
    log_scale = "log" in (getattr(value, "tags", None) or set())
    if isinstance(value, ChoiceSweep):
        choices = tuple(value.list)
        if not all(c is None or isinstance(c, bool | int | float | str) for c in choices):
            raise UserError(
                f"hydra.sweeper.params.{key}: choices must be numbers, words or quoted text "
                f'(a list as "[128]"), not {choices!r}'
            )
        return library.distributions.CategoricalDistribution(choices)
    if isinstance(value, RangeSweep):
        start, stop, step = value.start, value.stop, value.step
        if all(isinstance(v, int) for v in (start, stop, step)):
            high = start + step * ((stop - 1 - start) // step)
            return library.distributions.IntDistribution(start, high, log=log_scale, step=step)
        return library.distributions.FloatDistribution(start, stop, step=step)
    if isinstance(value, IntervalSweep):
        low, high = value.start, value.end
        if low >= high or (log_scale and low <= 0):
            raise UserError(
                f"hydra.sweeper.params.{key}: interval({low}, {high}) must rise"
                + (" and stay above 0 on a log scale" if log_scale else "")
            )
        if isinstance(low, int) and isinstance(high, int):
            return library.distributions.IntDistribution(low, high, log=log_scale)
        return library.distributions.FloatDistribution(float(low), float(high), log=log_scale)
    raise UserError(f"hydra.sweeper.params.{key}: {override.input_line} is no search space")


def described_space(distributions: dict) -> str:
    """The space as JSON, so a study continued with another space is told apart."""
    library = optuna()
    return json.dumps(
        {k: library.distributions.distribution_to_json(d) for k, d in distributions.items()},
        sort_keys=True,
    )


def override_of(key: str, value: Any) -> str:
    """``key=value`` as a command line writes it (text choices as they were given)."""
    if isinstance(value, float):
        return f"{key}={value!r}"
    if value is None:
        return f"{key}=null"
    return f"{key}={value}"


# --- The sampler, the pruner, the storage ----------------------------------------------------


def sampler_of(name: str, seed: int | None, distributions: dict) -> Any:
    library = optuna()
    if name not in SAMPLERS:
        raise UserError(f"hydra.sweeper.sampler={name!r} must be one of {', '.join(SAMPLERS)}")
    if name == "tpe":
        return library.samplers.TPESampler(seed=seed)
    if name == "random":
        return library.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return library.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    grid = {}
    for key, distribution in distributions.items():
        if isinstance(distribution, library.distributions.CategoricalDistribution):
            grid[key] = list(distribution.choices)
        elif isinstance(distribution, library.distributions.IntDistribution):
            grid[key] = list(range(distribution.low, distribution.high + 1, distribution.step))
        else:
            raise UserError(
                f"hydra.sweeper.sampler=grid takes choice(...) and range(...) only, and "
                f"hydra.sweeper.params.{key} is an interval; give it choices"
            )
    return library.samplers.GridSampler(grid, seed=seed)


# The sweeper's settings a pruner is built from (in the sweeper and again in each trial's job).
PRUNER_KEYS = (
    "pruner",
    "sampler",
    "n_startup_trials",
    "n_warmup_epochs",
    "percentile",
    "p_threshold",
    "max_epochs",
    "directions",
)


def pruner_name(settings: dict[str, Any], cv: int | None) -> str:
    """The pruner ``hydra.sweeper.pruner`` names, ``auto`` resolved: none for several
    objectives (Optuna prunes single-objective studies only), wilcoxon under ``cv=K`` (a
    trial's folds against the best trial's same folds), else Optuna's advice per sampler."""
    name = settings.get("pruner", "auto")
    if name not in PRUNERS:
        raise UserError(f"hydra.sweeper.pruner={name!r} must be one of {', '.join(PRUNERS)}")
    several = len(settings.get("directions") or ()) > 1
    if name == "auto":
        if several:
            return "none"
        return "wilcoxon" if cv else RECOMMENDED.get(str(settings.get("sampler", "tpe")), "median")
    if several and name != "none":
        raise UserError(
            f"hydra.sweeper.pruner={name} and several hydra.sweeper.directions do not combine "
            "(Optuna prunes studies of one objective); use pruner=none or auto"
        )
    if name == "wilcoxon" and not cv:
        raise UserError(
            "hydra.sweeper.pruner=wilcoxon compares a trial's folds with the best trial's: it "
            "needs cv=K (cv=5 or more); add cv=... or choose median, percentile, halving or "
            "hyperband"
        )
    return name


def pruner_of(settings: dict[str, Any], cv: int | None = None) -> Any:
    """``hydra.sweeper.pruner`` with its ``n_startup_trials``, ``n_warmup_epochs`` and
    ``max_epochs`` (hyperband's largest budget: trainer.max_epochs). Under ``cv=K`` a trial
    reports once a fold (its step the fold's number), and the pruner compares folds."""
    library = optuna()
    name = pruner_name(settings, cv)
    startup, warmup = (
        int(settings.get("n_startup_trials", 5)),
        int(settings.get("n_warmup_epochs", 2)),
    )
    if name == "none":
        return library.pruners.NopPruner()
    if name == "median":
        return library.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    if name == "percentile":
        return library.pruners.PercentilePruner(
            float(settings.get("percentile", 25.0)), n_startup_trials=startup, n_warmup_steps=warmup
        )
    if name == "halving":
        return library.pruners.SuccessiveHalvingPruner(min_resource=max(warmup, 1))
    if name == "hyperband":
        return library.pruners.HyperbandPruner(
            min_resource=max(warmup, 1), max_resource=int(settings.get("max_epochs") or 100)
        )
    if importlib.util.find_spec("scipy") is None:  # Optuna's Wilcoxon test is scipy's
        raise UserError('hydra.sweeper.pruner=wilcoxon needs scipy: pip install -e ".[sweep]"')
    threshold = settings.get("p_threshold", 0.1)
    if not finite_number(threshold) or not 0 < threshold < 1:
        raise UserError(
            f"hydra.sweeper.p_threshold={settings.get('p_threshold')!r} must be a p-value "
            "between 0 and 1 (Optuna's default: 0.1)"
        )
    with warnings.catch_warnings():  # "experimental" since Optuna 3.6, unchanged since
        warnings.simplefilter("ignore", library.exceptions.ExperimentalWarning)
        return library.pruners.WilcoxonPruner(p_threshold=float(threshold), n_startup_steps=2)


def storage_url(given: str | None, sweep_dir: Path) -> str:
    """The study's storage: ``runs/<run_name>/study.db`` by default; ``journal`` its journal
    file there; a path ending in ``.journal``; or any URL Optuna takes."""
    if given in (None, "", "sqlite"):
        return f"sqlite:///{(sweep_dir / 'study.db').resolve()}"
    if given == "journal":
        return str((sweep_dir / "study.journal").resolve())
    return str(given)


def opened_storage(url: str) -> Any:
    """The storage ``url`` names, or one line (its password left out)."""
    library = optuna()
    try:
        if "://" not in url:  # a journal file
            Path(url).parent.mkdir(parents=True, exist_ok=True)
            backend = library.storages.journal.JournalFileBackend(url)
            return library.storages.JournalStorage(backend)
        if url.startswith("sqlite:///"):
            Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
        return library.storages.RDBStorage(url, skip_compatibility_check=False)
    except Exception as error:
        reason = redacted(str(error).splitlines()[0] if str(error) else type(error).__name__)
        raise UserError(
            f"hydra.sweeper.storage={redacted(url)} cannot be opened ({reason[:160]}); give a "
            "path, sqlite:///file.db or a database URL that is reachable"
        ) from None


def study_rows(url: str, name: str, objective: str) -> dict[str, Any]:
    """A study's trials as plain rows for the sweep report (utils/report/sweep.py): each
    trial's number, state, value (a pruned one's last reported value), its values (one per
    objective), whether it is on the Pareto front (several objectives), parameters, their
    choices and log scales; the objectives and directions, and the parameters' importances
    (or why none)."""
    library = optuna()
    study = library.load_study(study_name=name, storage=opened_storage(url))
    objectives = list(study.user_attrs.get(OBJECTIVES_ATTR) or [objective])
    several = len(study.directions) > 1
    front = {t.number for t in study.best_trials} if several else set()
    trials = []
    for trial in study.get_trials(deepcopy=False):
        values = list(trial.values or [])
        if not values and trial.intermediate_values:
            values = [trial.intermediate_values[max(trial.intermediate_values)]]
        distributions = trial.distributions
        trials.append(
            {
                "number": trial.number,
                "state": trial.state.name,
                "value": values[0] if values else None,
                "values": values,
                "pareto": trial.number in front,
                "params": dict(trial.params),
                "choices": {k: list(getattr(d, "choices", ())) for k, d in distributions.items()},
                "log": {k: bool(getattr(d, "log", False)) for k, d in distributions.items()},
            }
        )
    directions = [d.name.lower() for d in study.directions]
    return {
        "trials": trials,
        "direction": directions[0],
        "directions": directions,
        "objective": objectives[0],
        "objectives": objectives,
        "importances": _importances(library, study) if not several else None,
    }


def _importances(library: Any, study: Any) -> Any:
    """Optuna's parameter importances (fANOVA), or the reason it has none to give."""
    finished = [t for t in study.trials if t.state == library.trial.TrialState.COMPLETE]
    if len(finished) < 2:
        return "fewer than two finished trials"
    try:
        return dict(library.importance.get_param_importances(study))
    except (RuntimeError, ValueError, ImportError) as error:
        return f"not computed ({str(error).splitlines()[0][:120]})"
