"""(Re)write the report of a finished run, evaluation or sweep from its folder alone.

    python report.py runs/<run_name>            # a training run: runs/<run_name>/report.html
    python report.py runs/<sweep_name>          # a sweep (its study, when a search)
    python report.py runs/eval/<timestamp>      # an evaluate.py run

Everything it reads (metrics.json, provenance.json, the history, test_predictions.npz, the
study) is read as data; it writes report.html in that folder and nothing else. Exit code: 0
when written, 2 on bad input (one line naming it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from utils.errors import EXIT_USER_ERROR, UserError, print_error
from utils.report.evaluation import write_evaluation_report
from utils.report.run import read_json, write_run_report
from utils.report.sweep import write_sweep_report
from utils.run.study import optuna, storage_url, study_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a run, evaluation or sweep folder")
    parser.add_argument("--study-name", default="torchloom", help="a search's study_name")
    args = parser.parse_args(argv)
    try:
        written = report_of(args.folder, args.study_name)
    except UserError as error:
        print_error(error)
        return EXIT_USER_ERROR
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        # a file of the folder holds what no run writes (edited by hand, or not a run's)
        print_error(
            UserError(
                f"{args.folder}: its files are not as a run writes them ({error}); was one edited?"
            )
        )
        return EXIT_USER_ERROR
    print(f"report: {written}")
    return 0


def report_of(folder: Path, study_name: str) -> Path:
    """The report of what ``folder`` holds: a sweep (summary.json or a study), an
    evaluation (metrics.json by checkpoint) or a training run (metrics.json)."""
    if not folder.is_dir():
        raise UserError(f"{folder} is not a folder: pass a run folder such as runs/<run_name>")
    if (folder / "summary.json").is_file() or (folder / "study.db").is_file():
        study = None
        if (folder / "study.db").is_file():
            optuna()  # one line naming the extra when Optuna is missing
            monitor = _sweep_monitor(folder)
            study = study_rows(storage_url(None, folder), study_name, monitor)
        return write_sweep_report(folder, study)
    metrics = read_json(folder / "metrics.json")
    if metrics is not None and "status" not in metrics and metrics:
        return write_evaluation_report(folder, metrics)
    return write_run_report(folder)


def _sweep_monitor(folder: Path) -> str:
    """The metric a search optimised, as its first job's metrics.json names it."""
    for job in sorted(p for p in folder.iterdir() if p.name.isdigit()):
        metrics = read_json(job / "metrics.json")
        if metrics and isinstance(metrics.get("monitor"), str):
            return metrics["monitor"]
    return "objective"


if __name__ == "__main__":
    sys.exit(main())
