"""``python -m utils.doctor``: each diagnosis, faked the way a broken machine looks."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from utils import doctor


def fake_nvidia_smi(folder: Path, cuda_version: str, gpus: int = 1) -> str:
    """An nvidia-smi on PATH that prints a header and a GPU list like the real one."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvidia-smi"
    listing = "\n".join(f"GPU {i}: NVIDIA A100-SXM4-40GB (UUID: GPU-{i})" for i in range(gpus))
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-L" ]; then printf "{listing}\\n"; exit 0; fi\n'
        f'echo "| NVIDIA-SMI 520.61.05    Driver Version: 520.61.05    CUDA Version: {cuda_version} |"\n'
    )
    script.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ['PATH']}"


def problems_mentioning(text: str) -> list[doctor.Problem]:
    return [p for p in doctor.diagnose(doctor.probe()) if text in p.what]


def test_the_report_matches_this_machine_and_the_exit_code_follows_the_diagnosis(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "utils.doctor"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert torch.__version__ in result.stdout and "CPU cores / data workers" in result.stdout
    expected = 1 if doctor.diagnose(doctor.probe()) else 0
    assert result.returncode == expected
    assert ("ready to train" in result.stdout) == (expected == 0)


def test_cpu_build_on_a_machine_with_a_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", "12.4", gpus=2))
    monkeypatch.setattr(torch.version, "cuda", None)
    (problem,) = problems_mentioning("is a CPU build")
    assert "nvidia-smi sees 2 GPU(s)" in problem.what and "--index-url" in problem.fix


def test_driver_older_than_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", "11.8"))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    (problem,) = problems_mentioning("older than torch's CUDA 12.4")
    assert "driver supports CUDA 11.8" in problem.what and "update the NVIDIA driver" in problem.fix
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "new", "12.6"))
    assert not problems_mentioning("older than")


def test_the_command_exits_1_on_a_problem(tmp_path):
    env = {**os.environ, "PATH": fake_nvidia_smi(tmp_path / "bin", "9.0")}
    result = subprocess.run(
        [sys.executable, "-m", "utils.doctor"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "problem:" in result.stdout and "fix:" in result.stdout


def test_two_torch_installations_on_sys_path(tmp_path, monkeypatch):
    (tmp_path / "site" / "torch").mkdir(parents=True)
    (tmp_path / "site" / "torch" / "__init__.py").write_text("")
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path / "site")])
    (problem,) = problems_mentioning("more than one torch")
    assert str(tmp_path / "site" / "torch") in problem.what and "conda" in problem.fix


def test_cuda_libraries_on_ld_library_path(tmp_path, monkeypatch):
    (tmp_path / "cuda" / "lib64").mkdir(parents=True)
    (tmp_path / "cuda" / "lib64" / "libcudart.so.11.0").write_bytes(b"")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "cuda" / "lib64"))
    (problem,) = problems_mentioning("LD_LIBRARY_PATH")
    assert "libcudart.so.11.0" in problem.what


@pytest.mark.parametrize("torchvision, mismatch", [("0.29.1", False), ("0.20.0", True)])
def test_torchvision_must_match_torch(torchvision, mismatch):
    facts = dataclasses.replace(
        doctor.probe(), torch="2.14.1", torchvision=torchvision, torchvision_error=None
    )
    found = [p for p in doctor.diagnose(facts) if "does not match" in p.what]
    assert bool(found) == mismatch
    if mismatch:
        assert "torchvision==0.29" in found[0].fix


def test_a_torchvision_that_fails_to_import_is_a_problem():
    facts = dataclasses.replace(
        doctor.probe(),
        torchvision=None,
        torchvision_error="operator torchvision::nms does not exist",
    )
    (problem,) = [p for p in doctor.diagnose(facts) if "does not import" in p.what]
    assert "nms" in problem.what
