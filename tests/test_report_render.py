"""The reports as a person sees them: each kind of run's report.html rendered by headless
Chromium (Debian's ``chromium`` package; skipped where it is not installed) to a PNG that must
show more than a blank page: the default job, a regression table, an image folder, a text run
and a search. The slow suite's: a browser start a page."""

from __future__ import annotations

import html
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import imagefolder_root, run_train  # noqa: F401 - a fixture
from PIL import Image
from test_report import steps_table

pytestmark = pytest.mark.slow
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


def rendered(page: Path, out: Path) -> np.ndarray:
    """The page as headless Chromium draws it, 1200 px wide, as RGB pixels."""
    command = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    command += [f"--screenshot={out}", "--window-size=1200,2400", page.resolve().as_uri()]
    subprocess.run(command, check=True, capture_output=True, timeout=120)
    return np.asarray(Image.open(out).convert("RGB"))


def assert_not_blank(pixels: np.ndarray) -> None:
    """Ink on the page (not one colour), and pictures (many colours, not text alone)."""
    ink = (pixels.min(axis=2) < 200).mean()
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert ink > 0.01 and colours > 50, (ink, colours)


@pytest.mark.skipif(
    BROWSER is None, reason="needs Debian's chromium package (apt install chromium)"
)
def test_every_kind_of_report_renders_in_a_browser(tmp_path, imagefolder_root):  # noqa: F811
    pytest.importorskip("optuna")
    pytest.importorskip("tokenizers")
    from texts import write_reviews

    steps_table(tmp_path / "steps.csv")
    write_reviews(tmp_path / "reviews.csv")
    quick = ["trainer.max_epochs=2"]
    runs = {
        "default": ["run_name=default"],
        "table": ["data=csv", "data.path=steps.csv", "data.target=target", "task=regression"],
        "images": ["data=imagefolder", f"data.root={imagefolder_root}"],
        "texts": [
            "data=text",
            "data.text=review",
            "data.target=sentiment",
            "data.path=reviews.csv",
        ],
        "search": ["-m", "hparams_search=digits_optuna", "hydra.sweeper.n_trials=3"],
    }
    for name, overrides in runs.items():
        on = ["report=true", "baselines=true"]  # what the suite's other runs leave out
        flag = overrides[:1] if overrides[0] == "-m" else []  # Hydra's -m comes first
        run_train(tmp_path, *flag, *on, *overrides[len(flag) :], *quick, f"run_name={name}")
        page = tmp_path / "runs" / name / "report.html"
        assert_not_blank(rendered(page, tmp_path / f"{name}.png"))
    search = html.unescape((tmp_path / "runs" / "search" / "report.html").read_text())
    assert "each trial's objective" in search and "parameters against the objective" in search
