"""Is this machine ready to train? A report of what torch sees, then the problems, each with
its fix. Exit code 0 when ready, 1 when a problem was found.

    python -m utils.doctor
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

CUDA_LIBRARIES = ("libcudart.so", "libcublas.so", "libcudnn.so", "libnccl.so")


@dataclass
class Facts:
    python: str
    torch: str
    torch_cuda: str | None  # the CUDA version torch was built for; None for a CPU build
    torchvision: str | None
    torchvision_error: str | None
    cuda_available: bool
    devices: list[dict]
    driver_cuda: str | None  # from nvidia-smi's header
    smi_gpus: int  # GPUs nvidia-smi lists
    cudnn: int | None
    nccl: str | None
    triton: bool
    cpu_cores: int
    worker_count: int
    torch_installs: list[str] = field(default_factory=list)
    shadowing_libraries: list[str] = field(default_factory=list)


@dataclass
class Problem:
    what: str
    fix: str


def nvidia_smi() -> tuple[str | None, int]:
    """(driver's CUDA version, number of GPUs) from nvidia-smi, or (None, 0) without it."""
    if shutil.which("nvidia-smi") is None:
        return None, 0
    try:
        header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout
        listing = subprocess.run(
            ["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, 0
    match = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return (match.group(1) if match else None), len(re.findall(r"^GPU \d+:", listing, re.M))


def torch_installs() -> list[str]:
    """Every folder on sys.path that holds a torch package (pip and conda mixed → several)."""
    found = []
    for entry in sys.path:
        candidate = Path(entry or ".") / "torch" / "__init__.py"
        if candidate.is_file() and str(candidate.parent.resolve()) not in found:
            found.append(str(candidate.parent.resolve()))
    return found


def shadowing_libraries() -> list[str]:
    """CUDA libraries on LD_LIBRARY_PATH, which load before the ones torch ships."""
    found = []
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        if Path(folder).is_dir():
            found += sorted(
                str(p) for p in Path(folder).iterdir() if p.name.startswith(CUDA_LIBRARIES)
            )
    return found


def probe() -> Facts:
    try:
        import torchvision

        torchvision_version, torchvision_error = torchvision.__version__, None
    except Exception as error:  # a mismatched build fails at import ("operator ... does not exist")
        torchvision_version, torchvision_error = None, str(error).splitlines()[0]
    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "name": props.name,
                    "memory_gib": round(props.total_memory / 2**30, 1),
                    "capability": f"{props.major}.{props.minor}",
                    "bf16": props.major >= 8,
                }
            )
    driver_cuda, smi_gpus = nvidia_smi()
    nccl = None
    if hasattr(torch.cuda, "nccl") and torch.version.cuda:
        try:
            nccl = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            nccl = None
    cores = os.cpu_count() or 1
    return Facts(
        python=platform.python_version(),
        torch=torch.__version__,
        torch_cuda=torch.version.cuda,
        torchvision=torchvision_version,
        torchvision_error=torchvision_error,
        cuda_available=torch.cuda.is_available(),
        devices=devices,
        driver_cuda=driver_cuda,
        smi_gpus=smi_gpus,
        cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        nccl=nccl,
        triton=find_spec("triton") is not None,
        cpu_cores=cores,
        worker_count=min(8, cores),  # data/images/imagefolder.py's default
        torch_installs=torch_installs(),
        shadowing_libraries=shadowing_libraries(),
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def diagnose(facts: Facts) -> list[Problem]:
    problems = []
    if facts.smi_gpus and facts.torch_cuda is None:
        problems.append(
            Problem(
                f"nvidia-smi sees {facts.smi_gpus} GPU(s), but torch {facts.torch} is a CPU build",
                "install a CUDA build: pip install torch torchvision --index-url "
                "https://download.pytorch.org/whl/cu126 (pick the CUDA your driver supports)",
            )
        )
    if (
        facts.driver_cuda
        and facts.torch_cuda
        and _version(facts.driver_cuda) < _version(facts.torch_cuda)
    ):
        problems.append(
            Problem(
                f"the driver supports CUDA {facts.driver_cuda}, older than torch's CUDA {facts.torch_cuda}",
                "update the NVIDIA driver, or install a torch built for CUDA "
                f"{facts.driver_cuda} or older",
            )
        )
    if facts.torchvision_error:
        problems.append(
            Problem(
                f"torchvision does not import: {facts.torchvision_error}",
                "install the torchvision release made for this torch (pip install torchvision "
                "from the same index as torch)",
            )
        )
    elif facts.torchvision and _version(facts.torch)[0] == 2:
        expected = _version(facts.torch)[1] + 15  # torch 2.N pairs with torchvision 0.(N+15)
        if _version(facts.torchvision)[1] != expected:
            problems.append(
                Problem(
                    f"torchvision {facts.torchvision} does not match torch {facts.torch}",
                    f"pip install 'torchvision==0.{expected}.*'",
                )
            )
    if len(facts.torch_installs) > 1:
        problems.append(
            Problem(
                "more than one torch on sys.path: " + ", ".join(facts.torch_installs),
                "uninstall all but one (pip uninstall torch; conda remove pytorch), and do not mix "
                "pip and conda installs in one environment",
            )
        )
    if facts.shadowing_libraries:
        problems.append(
            Problem(
                "CUDA libraries on LD_LIBRARY_PATH can shadow the ones torch ships: "
                + ", ".join(facts.shadowing_libraries[:4]),
                "remove their folder from LD_LIBRARY_PATH (torch's wheels bring their own CUDA)",
            )
        )
    return problems


def report(facts: Facts, problems: list[Problem], console: Console) -> None:
    table = Table(title="torchloom doctor", show_header=False)
    table.add_column("what")
    table.add_column("found")
    build = f"CUDA {facts.torch_cuda}" if facts.torch_cuda else "CPU only"
    rows = [
        ("python", facts.python),
        ("torch", f"{facts.torch} ({build})"),
        ("torchvision", facts.torchvision or f"fails to import: {facts.torchvision_error}"),
        ("CUDA available", f"{facts.cuda_available}, {len(facts.devices)} device(s)"),
        *[
            (
                f"  cuda:{i}",
                f"{d['name']}, {d['memory_gib']} GiB, capability {d['capability']}, "
                f"bf16 {'yes' if d['bf16'] else 'no'}",
            )
            for i, d in enumerate(facts.devices)
        ],
        ("driver CUDA (nvidia-smi)", facts.driver_cuda or "nvidia-smi not found"),
        ("cuDNN", str(facts.cudnn) if facts.cudnn else "none"),
        ("NCCL", facts.nccl or "none"),
        (
            "torch.compile (triton)",
            "available" if facts.triton else "triton not installed (CPU compile only)",
        ),
        ("CPU cores / data workers", f"{facts.cpu_cores} / {facts.worker_count}"),
    ]
    for what, found in rows:
        table.add_row(what, found)
    console.print(table)
    if not problems:
        console.print("[green]ready to train[/]")
    for problem in problems:
        console.print(f"[red]problem:[/] {problem.what}\n  [bold]fix:[/] {problem.fix}")


def main() -> int:
    facts = probe()
    problems = diagnose(facts)
    report(facts, problems, Console())
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
