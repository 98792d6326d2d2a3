"""The speed benchmark runs and reports every method it promises (its figures are for the
README, not for assertions: timing a shared CI machine proves nothing)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_benchmark_reports_floor_dataloader_and_torchloom(tmp_path):
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "loop_speed.py"), "--cases", "digits",
         "--rounds", "1", "--epochs", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["case"] == "digits" and report["floor_ratio"] == 1.0
    for method in ("floor", "dataloader", "torchloom"):
        assert report[method] > 0
    assert 0 < report["torchloom_ratio"] < 10
    assert "lightning" in result.stdout  # reported as run or as not installed
