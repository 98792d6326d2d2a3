"""Shared helpers: running the real entry points, and small datasets written in the real
on-disk formats (MNIST's IDX files, CIFAR-10's pickled batches, a folder of PNGs)."""

from __future__ import annotations

import csv
import json
import os
import pickle
import socket
import struct
import subprocess
import sys
from pathlib import Path

from utils.system.cpu_math import same_bits_every_run

same_bits_every_run()  # before torch loads MKL: runs in this process resume bit-equal too

import numpy as np
import pytest
import torch
from hypothesis import settings

from utils.system.signals import EXIT_INTERRUPTED

# Randomised tests draw the same examples on every run in CI (a landing never rests on luck);
# an example one of them finds becomes an @example of that test.
settings.register_profile("ci", derandomize=True, database=None)
settings.load_profile("ci" if os.environ.get("CI") else "default")

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "tests" / "helpers"
TRAIN = ROOT / "train.py"
EVALUATE = ROOT / "evaluate.py"
PREDICT = ROOT / "predict.py"
SHARD = ROOT / "shard.py"
CONF = ROOT / "conf"


def run_python(
    cwd: Path,
    *args: str,
    ok: bool = True,
    timeout: float = 600,
    env: dict | None = None,
    process: bool = False,
):
    """Run ``python ARGS`` in ``cwd``; tests/helpers is importable for test-only models. With
    ``ok``, a non-zero exit fails the test with the output.

    ``train.py``, ``evaluate.py`` and ``predict.py`` run in this process
    (:func:`run_in_process`) unless the process boundary is what is tested: ``process=True``,
    or an ``env`` that makes a helper model send a signal (``SIGNAL_*``: it must reach the
    run, not pytest)."""
    args = (*args, *quiet(args))
    signals = any(key.startswith("SIGNAL_") for key in env or {})
    in_process = (str(TRAIN), str(EVALUATE), str(PREDICT))
    if not (process or signals) and args and args[0] in in_process:
        result = run_in_process(cwd, Path(args[0]), *args[1:], env=env)
    else:
        result = subprocess.run(
            [sys.executable, *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "PYTHONPATH": str(HELPERS), **(env or {})},
        )
    if ok:
        assert result.returncode == 0, (
            f"{args[:3]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


# What a test's run leaves out unless it asks for it (report=true, baselines=true): the report's
# drawing and the scikit-learn fits cost about a second a run, in every run of the suite;
# tests/test_report.py asks for both and checks them through the same entry points.
QUIET = {str(TRAIN): ("report=false", "baselines=false"), str(EVALUATE): ("report=false",)}


def quiet(args: tuple) -> tuple[str, ...]:
    """The overrides of :data:`QUIET` a command line ``args`` (an entry point, or a helper
    that runs one: ``faulty_run.py train.py ...``) does not set itself."""
    script = next((a for a in args[:2] if a in QUIET), None)
    given = {arg.split("=", 1)[0] for arg in args[1:]}
    leave_out = QUIET.get(script, ())
    return tuple(o for o in leave_out if o.split("=", 1)[0] not in given)


def run_train(cwd: Path, *overrides: str, ok: bool = True, **how):
    """``python train.py OVERRIDES`` in ``cwd`` (outputs land in cwd/runs, cwd/checkpoints);
    ``how``: ``timeout``, ``env``, ``process`` as for :func:`run_python`."""
    return run_python(cwd, str(TRAIN), *overrides, ok=ok, **how)


def run_in_process(
    cwd: Path, script: Path, *args: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run an entry point as ``python SCRIPT ARGS`` would, in this process: its ``__main__``
    block (Hydra's command line, ``run_cli``'s one-line errors, ``main()``'s exit codes) runs
    through ``runpy``, with stdout, stderr and warnings captured. What a run changes in the
    process (working directory, argv, environment, signal handlers, logging, warning filters,
    torch's deterministic and anomaly modes and threads) is put back afterwards, so the next
    run starts as a fresh process would. ``env`` is added to the environment for the run.
    Saves the seconds of starting Python and importing torch per run."""
    import contextlib
    import io
    import logging
    import runpy
    import signal
    import traceback
    import warnings

    from hydra.core.global_hydra import GlobalHydra

    from utils.system.signals import STOP_SIGNALS

    saved = (os.getcwd(), sys.argv, dict(os.environ), list(sys.path))
    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    root = logging.getLogger()
    logging_before = (root.handlers[:], root.level)
    torch_modes = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_anomaly_enabled(),
        torch.get_num_threads(),
    )
    out, err = io.StringIO(), io.StringIO()

    def show(message, category, filename, lineno, file=None, line=None):
        err.write(warnings.formatwarning(message, category, filename, lineno, line))

    code = 0
    os.environ.update(env or {})
    os.chdir(cwd)
    sys.argv = [str(script), *args]
    sys.path[:0] = [str(script.parent), str(HELPERS)]
    GlobalHydra.instance().clear()
    try:
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            warnings.catch_warnings(),
        ):
            warnings.simplefilter("default")
            warnings.showwarning = show
            try:
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exit_:
                if isinstance(exit_.code, int) or exit_.code is None:
                    code = exit_.code or 0
                else:
                    print(exit_.code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
    finally:
        GlobalHydra.instance().clear()
        os.chdir(saved[0])
        sys.argv, sys.path[:] = saved[1], saved[3]
        os.environ.clear()
        os.environ.update(saved[2])
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for handler in root.handlers:
            if handler not in logging_before[0]:
                handler.close()
        root.handlers[:] = logging_before[0]
        root.setLevel(logging_before[1])
        torch.use_deterministic_algorithms(torch_modes[0])
        torch.autograd.set_detect_anomaly(torch_modes[1])
        torch.set_num_threads(torch_modes[2])
    return subprocess.CompletedProcess([str(script), *args], code, out.getvalue(), err.getvalue())


def compose_train(cwd: Path, *overrides: str) -> float:
    """``train(cfg, stop)`` called directly, as lightning-hydra-template's tests do: the config
    composed with Hydra's API, ``HydraConfig`` set as Hydra's own run sets it (the run dir
    resolved, single-run mode), outputs under ``cwd``. Returns what train() returns; its
    errors are raised, not turned into exit codes (that is main()'s job)."""
    import contextlib
    import signal

    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf, open_dict

    from utils.system.signals import STOP_SIGNALS, StopRequest

    handlers = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        import train as recipe  # its import holds early stop signals: put back below

        with (
            contextlib.chdir(cwd),
            initialize_config_dir(str(CONF), version_base="1.3", job_name="train"),
        ):
            cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
            with open_dict(cfg):
                cfg.hydra.runtime.output_dir = str(Path(cfg.hydra.run.dir).resolve())
                cfg.hydra.mode = RunMode.RUN
            HydraConfig.instance().set_config(cfg)
            Path(cfg.hydra.runtime.output_dir).mkdir(parents=True, exist_ok=True)
            job = OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"])
            with StopRequest() as stop:
                return recipe.train(job, stop)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def read_events(run_dir: Path):
    """The TensorBoard events a run wrote, as TensorBoard's own reader sees them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return events


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = read_events(run_dir)
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def read_metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


def write_idx(path: Path, array: np.ndarray) -> None:
    """IDX as MNIST stores it: magic (0, 0, dtype 0x08 = ubyte, ndim), big-endian int32 dims."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}i", *array.shape))
        f.write(array.astype(np.uint8).tobytes())


def write_mnist(root: Path, folder: str, train: int = 96, test: int = 32, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    for prefix, n in (("train", train), ("t10k", test)):
        write_idx(raw / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28)))
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", rng.integers(0, 10, (n,)))
    return root


def write_cifar10(root: Path, per_batch: int = 20, seed: int = 0) -> Path:
    """The python-version batches: pickled dicts with ``data`` [N, 3072] uint8 and ``labels``."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {
            b"batch_label": name.encode(),
            b"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
            b"labels": rng.integers(0, 10, per_batch).tolist(),
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


def write_imagefolder(
    root: Path, classes=("cat", "dog", "fox"), per_class: int = 6, size=(12, 10), test=True
) -> Path:
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    for split in ("train", "val", "test") if test else ("train", "val"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = torch.randint(0, 256, (*size, 3), dtype=torch.uint8, generator=generator)
                Image.fromarray(pixels.numpy()).save(folder / f"{i}.png")
    return root


@pytest.fixture(scope="session")
def mnist_root(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("mnist"), "MNIST")


@pytest.fixture(scope="session")
def fashion_root(tmp_path_factory) -> Path:
    return write_mnist(tmp_path_factory.mktemp("fashion"), "FashionMNIST", seed=1)


@pytest.fixture(scope="session")
def cifar_root(tmp_path_factory) -> Path:
    return write_cifar10(tmp_path_factory.mktemp("cifar"))


@pytest.fixture(scope="session")
def imagefolder_root(tmp_path_factory) -> Path:
    return write_imagefolder(tmp_path_factory.mktemp("images"))


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def error_line(result) -> str:
    """The one ``error:`` line of a refused command: exit 2, no traceback, one line."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def write_rows(path: Path, header: list[str], rows: list[list], encoding: str = "utf-8") -> Path:
    with open(path, "w", newline="", encoding=encoding) as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def classes_table(path: Path, labels: list[str], rows: int = 120, **how) -> Path:
    """Two numeric features; the label is which of ``labels`` the first feature's band is."""
    generator = torch.Generator().manual_seed(0)
    values = torch.rand(rows, 2, generator=generator)
    chosen = [labels[min(int(v * len(labels)), len(labels) - 1)] for v in values[:, 0].tolist()]
    return write_rows(
        path,
        ["a", "b", "y"],
        [[*map(repr, v), c] for v, c in zip(values.tolist(), chosen, strict=True)],
        **how,
    )


def slow(*values):
    """Parameters of a parametrised test that run under ``-m slow`` only: the quick suite keeps
    one variant of each finding, CI runs them all."""
    return [
        pytest.param(*v if isinstance(v, tuple) else (v,), marks=pytest.mark.slow) for v in values
    ]


# --- Shared by several test modules ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(cwd, *overrides, env=None, ok=True, script=TRAIN):
    """``torchrun`` with two processes on this machine, running ``script`` with ``overrides``."""
    launch = ["--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}"]
    return run_python(
        cwd, "-m", "torch.distributed.run", *launch, str(script), *overrides, ok=ok, env=env
    )


def run_evaluate(cwd: Path, *overrides: str, ok: bool = True):
    return run_python(cwd, str(EVALUATE), *overrides, ok=ok)


def checkpoint(cwd: Path, run_name: str, name: str = "last.pt") -> dict:
    return torch.load(cwd / "checkpoints" / run_name / name, map_location="cpu", weights_only=True)


def killed_at(forward: int) -> dict:
    """The environment that makes the signalling model (tests/helpers) kill -9 its run at its
    ``forward``-th training micro-batch: a kill at a chosen point, not a timed one."""
    return {"SIGNAL_AT_FORWARD": str(forward), "SIGNAL_NAME": "SIGKILL"}


NEEDS_GLOO = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def interrupt_and_resume(
    cwd: Path, run: list[str], run_name: str, at: int, signal_name: str = "SIGTERM"
):
    """Signal the run at its ``at``-th training micro-batch, then ``resume=auto`` it."""
    first = run_train(
        cwd,
        *run,
        f"run_name={run_name}",
        ok=False,
        env={"SIGNAL_AT_FORWARD": str(at), "SIGNAL_NAME": signal_name},
    )
    assert first.returncode == EXIT_INTERRUPTED, first.stderr[-2000:]
    assert f"{signal_name} received" in first.stderr
    assert (
        "continue with:" in first.stdout
        and f"resume=checkpoints/{run_name}/last.pt" in first.stdout
    )
    position = checkpoint(cwd, run_name)
    resumed = run_train(cwd, *run, f"run_name={run_name}", "resume=auto")
    assert f"resumed from checkpoints/{run_name}/last.pt" in resumed.stdout
    return position


def assert_same_run(cwd: Path, straight: str, resumed: str) -> None:
    a, b = checkpoint(cwd, straight), checkpoint(cwd, resumed)
    assert a["global_step"] == b["global_step"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("exp_avg", "exp_avg_sq"):
        for index in a["optimizer"]["state"]:
            assert torch.equal(
                a["optimizer"]["state"][index][key], b["optimizer"]["state"][index][key]
            )
    logged_a, logged_b = scalars(cwd / "runs" / straight), scalars(cwd / "runs" / resumed)
    for tag in ("train/loss", "train/lr", "val/loss", "val/acc"):
        assert logged_a[tag] == logged_b[tag], tag  # same steps, same values, no duplicates
    assert (
        read_metrics(cwd / "runs" / straight)["test/acc"]
        == read_metrics(cwd / "runs" / resumed)["test/acc"]
    )


def user_conf(root: Path, files: dict[str, str]) -> str:
    """A config folder of the user's own YAMLs, found through Hydra's search path."""
    for name, text in files.items():
        path = root / "conf" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return f"hydra.searchpath=[file://{root / 'conf'}]"


def write_table(path: Path, rows: int = 240, seed: int = 0, delimiter: str = ",") -> Path:
    """Two numeric features on very different scales, a categorical one, named labels."""
    import random

    rng = random.Random(seed)
    lines = [delimiter.join(["size", "weight", "colour", "kind"])]
    for _ in range(rows):
        size, weight, colour = rng.gauss(0, 1), rng.gauss(500, 100), rng.choice("rgb")
        kind = "big" if size + (weight - 500) / 100 + (colour == "r") > 0.3 else "small"
        lines.append(delimiter.join([f"{size:.4f}", f"{weight:.2f}", colour, kind]))
    path.write_text("\n".join(lines) + "\n")
    return path


def raw_columns(path: Path, table: dict) -> torch.Tensor:
    """A CSV's rows as a table model's export takes them (data/tables/inputs.py RawColumns): the
    number columns as written, NaN at a gap, then each categorical column's code in the
    recorded vocabulary (-1 for a value training never saw)."""
    from data.tables.missing import is_gap

    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    numbers = [
        [float("nan") if is_gap(r[c]) else float(r[c]) for c in table["numeric"]] for r in rows
    ]
    codes = [
        [
            float(v.index(r[c].strip())) if r[c].strip() in v else -1.0
            for c, v in table["categories"].items()
        ]
        for r in rows
    ]
    return torch.tensor([n + c for n, c in zip(numbers, codes, strict=True)], dtype=torch.float32)
