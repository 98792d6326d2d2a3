"""Bad input through the real entry points, as one table: every row must exit non-zero with
one or two lines on stderr that name the key, value or path, no Python traceback, and leave
every file already in runs/ and checkpoints/ as it was. Then random override strings
(hypothesis) must give a run or one clear error, never a traceback."""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch
from conftest import run_python
from harness import ROOT, TRAIN, report
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from PIL import Image

from utils.checkpoint.load import load_checkpoint

EVALUATE = ROOT / "evaluate.py"
HELPERS = ROOT / "tests" / "helpers"
TINY = ("trainer.max_epochs=1", "model.hidden_sizes=[16]")


class WritesMarker:
    """A pickle that would create a file when loaded without weights_only."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A folder holding a finished run and every bad file the rows point at."""
    cwd = tmp_path_factory.mktemp("bad")
    python(cwd, TRAIN, *TINY, "run_name=base")
    python(cwd, TRAIN, "trainer.max_epochs=1", "model=cnn", "model.channels=[4]", "run_name=other")
    good = (cwd / "checkpoints/base/last.pt").read_bytes()
    (cwd / "zero.pt").write_bytes(b"")
    (cwd / "truncated.pt").write_bytes(good[: len(good) // 2])
    (cwd / "notes.pt").write_text("these are not weights\n")
    (cwd / "empty_dir").mkdir()
    torch.save({"format_version": 1, "model": WritesMarker(cwd / "pwned")}, cwd / "hostile.pt")
    state = load_checkpoint(cwd / "checkpoints/base/best.pt")
    state["config"]["model"] = {"_target_": "posix.system", "_args_": ["touch pwned"]}
    torch.save(state, cwd / "command.pt")
    hostile_configs(cwd, load_checkpoint(cwd / "checkpoints/base/best.pt"))
    (cwd / "checkpoints/unreadable").mkdir(parents=True)
    (cwd / "checkpoints/unreadable/last.pt").write_bytes(b"\0" * 64)
    (cwd / "a_file").write_text("")
    images = cwd / "images"
    for split in ("train", "val"):
        for label in ("cat", "dog"):
            (images / split / label).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(images / split / label / "0.png")
    (images / "train" / "cat" / "broken.png").write_bytes(b"not a png")
    for name, content in (("zero_images", b""), ("bomb_images", png_bomb())):
        shutil.copytree(images / "train", cwd / name / "train", ignore=ignore_broken)
        shutil.copytree(images / "val", cwd / name / "val")
        (cwd / name / "val" / "dog" / "bad.png").write_bytes(content)
    (images / "empty_class" / "train" / "cat").mkdir(parents=True)
    (images / "empty_class" / "val" / "cat").mkdir(parents=True)
    rows = [",".join(["0"] * 64 + [str(i % 10)]) for i in range(200)]
    rows[7] = ",".join(["3"] * 64 + ["12"])
    with gzip.open(cwd / "labels.csv.gz", "wt") as f:
        f.write("\n".join(rows) + "\n")
    return cwd


def ignore_broken(folder: str, names: list[str]) -> list[str]:
    return [name for name in names if name == "broken.png"]


def hostile_configs(cwd: Path, state: dict) -> None:
    """Checkpoints whose stored config would run code, and files that are not whole ones."""
    config = state["config"]
    evil = "${oc.create:{_target_: pathlib.Path.write_text, _args_: [{_target_: pathlib.Path, "
    evil += "_args_: [pwned]}, 'import os']}}"
    for name, key, value in (
        ("interpolated", "dropout", evil),
        ("prefix", "_target_", "torch.nn.attention._fa4._fa4_import_module"),
    ):
        torch.save(
            {**state, "config": {**config, "model": {**config["model"], key: value}}},
            cwd / f"{name}.pt",
        )
    torch.save({"model": state["model"]}, cwd / "weights.pt")
    torch.save({**state, "format_version": 99}, cwd / "future.pt")


def png_bomb(side: int = 40_000) -> bytes:
    """A valid PNG header claiming side × side pixels: PIL refuses it as a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def python(cwd: Path, script: Path | str, *args: str, check: bool = True, env=None):
    """``python SCRIPT ARGS`` (a str: ``python -m``). train.py and evaluate.py run in-process
    (conftest.run_python), except with decoding workers: that a run with workers still exits
    at once on bad input is a property of the process's exit, so those rows get a process."""
    command = ["-m", script] if isinstance(script, str) else [str(script)]
    workers = any(
        arg.startswith("data.num_workers=") and arg != "data.num_workers=0" for arg in args
    )
    return run_python(cwd, *command, *args, ok=check, timeout=180, env=env, process=workers)


def snapshot(cwd: Path) -> dict[str, str]:
    """Every checkpoint, metrics file and TensorBoard event file. Hydra's own record of the
    latest command line (.hydra/) and its appended log are left out: Hydra rewrites them for
    each invocation before train.py runs."""
    files = [p for folder in ("runs", "checkpoints") for p in (cwd / folder).rglob("*")]
    kept = [p for p in files if p.is_file() and ".hydra" not in p.parts and p.suffix != ".log"]
    return {str(p): hashlib.sha1(p.read_bytes()).hexdigest() for p in kept}


# fmt: off
ROWS = [
    # (case, entry point, arguments, what the message must contain)
    ("unknown group option", TRAIN, ["model=transformer"], "model=transformer is not an option"),
    ("unknown key", TRAIN, ["trainer.max_epoch=3"], "did you mean trainer.max_epochs"),
    ("unknown nested key", TRAIN, ["data.imagefolder=1"], "unknown key data.imagefolder"),
    ("wrong value type", TRAIN, ["trainer.log_every_n_steps=ten"], "trainer.log_every_n_steps: Value 'ten'"),
    ("epochs not a number", TRAIN, ["trainer.max_epochs=ten"], "trainer.max_epochs='ten' must be a whole"),
    ("wrong bool", TRAIN, ["trainer.compile=maybe"], "trainer.compile: Value 'maybe'"),
    ("unparsable override", TRAIN, ["optim.lr=[1"], "cannot parse an override"),
    ("list where a sweep was meant", TRAIN, ["optim=sgd,adamw"], "add --multirun"),
    ("zero batch size", TRAIN, ["data.batch_size=0"], "data.batch_size=0 is out of range"),
    ("negative epochs", TRAIN, ["trainer.max_epochs=-1"], "trainer.max_epochs=-1 must be a whole number"),
    ("negative learning rate", TRAIN, ["optim.lr=-0.1"], "optim.lr=-0.1 is out of range"),
    ("accumulate 0", TRAIN, ["trainer.accumulate_grad_batches=0"], "accumulate_grad_batches=0"),
    ("monitor not measured", TRAIN, ["trainer.monitor=val/f1"], "trainer.monitor='val/f1'"),
    ("unknown NaN policy", TRAIN, ["trainer.nonfinite=ignore"], "trainer.nonfinite='ignore'"),
    ("unknown init", TRAIN, ["model=mlp", "model.init=uniformish"], "model.init='uniformish'"),
    ("unknown tuner", TRAIN, ["tune=speed"], "tune='speed' is unknown"),
    ("limit above 1.0", TRAIN, ["trainer.limit_train_batches=2.5"], "at most 1.0"),
    ("unknown precision", TRAIN, ["precision.dtype=float8"], "precision.dtype='float8'"),
    ("missing data root", TRAIN, ["data=mnist", "data.root=nowhere", "data.download=false"],
     "nowhere"),
    ("missing image folder", TRAIN, ["data=imagefolder", "data.root=no/such"],
     "image folder root not found: no/such"),
    ("empty class folder", TRAIN, ["data=imagefolder", "data.root=images/empty_class"],
     "images/empty_class/train/cat"),
    ("corrupt image", TRAIN, ["data=imagefolder", "data.root=images", "data.batch_size=1",
                              "data.num_workers=0"], "broken.png"),
    ("corrupt image, no cache", TRAIN, ["data=imagefolder", "data.root=images",
                                        "data.batch_size=1", "data.num_workers=0",
                                        "data.cache=off"], "broken.png"),
    ("unknown cache mode", TRAIN, ["data=imagefolder", "data.root=images", "data.cache=sometimes"],
     "data.cache='sometimes'"),
    ("negative cache budget", TRAIN, ["data=imagefolder", "data.root=images",
                                      "data.cache_max_gb=-1"], "data.cache_max_gb=-1"),
    ("label out of range", TRAIN, ["data.path=labels.csv.gz", "data.val_size=20",
                                   "data.test_size=20"], "label 12"),
    ("input shape the model cannot take", TRAIN, ["model=mlp", "model._target_=signalling_model.fixed_input"],
     "cannot take inputs of shape [1, 8, 8]: layer '1' (Linear)"),
    ("resume: missing file", TRAIN, ["resume=nowhere.pt"], "no checkpoint file at nowhere.pt"),
    ("resume: folder without checkpoints", TRAIN, ["resume=empty_dir"], "resume=empty_dir"),
    ("resume: zero-byte file", TRAIN, ["resume=zero.pt"], "not a readable checkpoint: zero.pt"),
    ("resume: truncated file", TRAIN, ["resume=truncated.pt"], "not a readable checkpoint"),
    ("resume: text file", TRAIN, ["resume=notes.pt"], "not a readable checkpoint: notes.pt"),
    ("resume: another model's checkpoint", TRAIN,
     [*TINY, "resume=checkpoints/other/last.pt", "run_name=other"], "config changed (model"),
    ("resume: another run's checkpoint into this run", TRAIN,
     [*TINY, "resume=checkpoints/other/last.pt", "run_name=base"], "that folder holds another run"),
    ("resume: hostile pickle", TRAIN, ["resume=hostile.pt"], "refusing to load hostile.pt"),
    ("evaluate: hostile pickle", EVALUATE, ["ckpt=hostile.pt"], "refusing to load"),
    ("evaluate: forbidden _target_", EVALUATE, ["ckpt=command.pt"], "model._target_='posix.system'"),
    ("evaluate: no ckpt", EVALUATE, [], "ckpt is required"),
    ("evaluate: unknown split", EVALUATE, ["ckpt=checkpoints/base/best.pt", "split=holdout"],
     "split='holdout'"),
    ("unwritable runs folder", TRAIN, ["paths.runs=a_file/runs"], "cannot write the run to a_file"),
    ("unwritable checkpoints folder", TRAIN, ["paths.checkpoints=a_file/ck"], "a_file/ck"),
    ("sweep with one bad job", TRAIN, ["-m", *TINY, "run_name=sweep", "optim.lr=0.01,-1"],
     "1 of 2 jobs did not complete"),
    # A stored config is data; a file that is not a training checkpoint says what it lacks.
    ("evaluate: interpolation in the stored config", EVALUATE, ["ckpt=interpolated.pt"],
     "model.dropout=\"${oc.create"),
    ("evaluate: a target under a trusted prefix", EVALUATE, ["ckpt=prefix.pt"],
     "not one of torchloom's builders"),
    ("evaluate: weights only", EVALUATE, ["ckpt=weights.pt"], "holds no torchloom config"),
    ("resume: weights only", TRAIN, ["resume=weights.pt"], "use init_from=weights.pt"),
    ("resume: a newer format", TRAIN, ["resume=future.pt"], "format 99"),
    ("resume: optimizer switched", TRAIN, [*TINY, "run_name=base", "resume=auto", "optim=sgd"],
     "optim._target_: torch.optim.AdamW -> torch.optim.SGD"),
    ("resume: seed changed", TRAIN, [*TINY, "run_name=base", "resume=auto", "seed=5"],
     "seed: 0 -> 5"),
    ("resume=auto: no checkpoint readable", TRAIN, [*TINY, "run_name=unreadable", "resume=auto"],
     "no readable checkpoint in checkpoints/unreadable"),
    ("reused run name", TRAIN, [*TINY, "run_name=base"], "already holds a run"),
    ("run name escaping runs/", TRAIN, ["run_name=../../outside"], "run_name='../../outside'"),
    ("absolute run name", TRAIN, ["run_name=/tmp/elsewhere"], "run_name='/tmp/elsewhere'"),
    # Every value is checked against its builder before any data is loaded.
    ("betas out of range", TRAIN, ["optim.betas=[1.5,0.999]"], "optim.betas=[1.5, 0.999]"),
    ("negative momentum", TRAIN, ["optim=sgd", "optim.momentum=-1"], "optim.momentum=-1"),
    ("an optimizer key it does not take", TRAIN, ["+optim.foo=1"], "optim.foo is not a parameter"),
    # a key the data supplies (the class count, a table's training rows) is not a setting
    ("a class count in the config", TRAIN, ["+model.num_classes=3"],
     "model.num_classes is not a setting: train.py passes it"),
    ("training rows in the config", TRAIN, ["model=tabular", "+model.train_rows=99999999"],
     "model.train_rows is not a setting"),
    ("step_size 0", TRAIN, ["scheduler=step", "scheduler.step_size=0"], "scheduler.step_size=0"),
    ("plateau factor above 1", TRAIN, ["scheduler=plateau", "scheduler.factor=2"],
     "scheduler.factor=2"),
    ("negative warmup", TRAIN, ["scheduler.warmup_steps=-5"], "scheduler.warmup_steps=-5"),
    ("negative hidden size", TRAIN, ["model.hidden_sizes=[-1]"], "model.hidden_sizes=[-1]"),
    ("monitor and mode contradict", TRAIN, ["trainer.monitor=val/loss", "trainer.monitor_mode=max"],
     "would keep the worst epoch"),
    ("image size of one value", TRAIN, ["data=imagefolder", "data.root=images",
                                        "data.image_size=[8]"], "data.image_size=[8]"),
    # A bad image ends the run in one line whatever the number of decoding workers, while the
    # cache is built (the default) or while training reads it (data.cache=off).
    ("corrupt image, 2 workers", TRAIN, ["data=imagefolder", "data.root=images",
                                         "data.batch_size=1", "data.num_workers=2"], "broken.png"),
    ("corrupt image, 2 workers, no cache", TRAIN, ["data=imagefolder", "data.root=images",
                                                   "data.batch_size=1", "data.num_workers=2",
                                                   "data.cache=off"], "broken.png"),
    ("empty image, 2 workers", TRAIN, ["data=imagefolder", "data.root=zero_images",
                                       "data.batch_size=1", "data.num_workers=2"], "bad.png"),
    ("decompression bomb, 2 workers", TRAIN, ["data=imagefolder", "data.root=bomb_images",
                                              "data.batch_size=1", "data.num_workers=2"],
     "a possible decompression bomb"),
]
# fmt: on
if not torch.cuda.is_available():
    ROWS.append(("cuda without a GPU", TRAIN, ["trainer.device=cuda"], "no usable CUDA GPU"))


@pytest.mark.parametrize(("case", "entry", "args", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_bad_input_gets_one_clear_line_and_changes_nothing(workspace, case, entry, args, expected):
    before = snapshot(workspace)
    result = python(workspace, entry, *args, check=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("warning")]
    assert result.returncode != 0, f"{case}: exited 0"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert 1 <= len(errors) <= 2, f"{case}: {len(errors)} lines on stderr:\n{result.stderr}"
    assert any(expected in line for line in errors), f"{case}: {errors}"
    after = snapshot(workspace)
    assert {k: v for k, v in after.items() if k in before} == before, f"{case} changed files"
    assert not (workspace / "pwned").exists()


def test_the_doctor_names_a_problem_and_its_fix(tmp_path):
    # A GPU with a driver far older than any CUDA build: a CPU build of torch is told to
    # install a CUDA build, a CUDA build is told its driver is too old.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI 390.00  Driver Version: 390.00  CUDA Version: 9.1'\n"
        "echo 'GPU 0: Tesla K80'\n"
    )
    (fake / "nvidia-smi").chmod(0o755)
    env = {"PATH": f"{fake}:{os.environ['PATH']}"}
    result = python(tmp_path, "utils.doctor", check=False, env=env)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    expected = "older" if torch.version.cuda else "CPU build"
    assert expected in result.stdout, result.stdout[-3000:]


def test_the_matrix_is_at_least_30_rows():
    kinds = {"train.py": 0, "evaluate.py": 0}
    for _, entry, _, _ in ROWS:
        kinds[entry.name] += 1
    report(
        "bad_input",
        rows=len(ROWS) + 1,
        **{k.replace(".py", ""): v for k, v in kinds.items()},
        doctor=1,
    )
    assert len(ROWS) >= 30


# --- Random command lines ------------------------------------------------------------------

# fmt: off
KEYS = ["trainer.max_epochs", "trainer.max_epoch", "optim.lr", "data.batch_size", "model",
        "data", "optim", "seed", "trainer.compile", "model.hidden_sizes", "foo", "trainer",
        "scheduler", "precision", "debug", "tune", "trainer.limit_train_batches"]
VALUES = st.one_of(
    st.sampled_from(["mlp", "cnn", "sgd", "none", "fp32", "fast_dev_run", "lr", "[8]", "null",
                     "true", "0", "-1", "1.5", "3", "abc", "[1", "x,y", "''"]),
    st.integers(-5, 5).map(str),
    st.text("abcxyz019.-_/[]", min_size=0, max_size=6),
)
# fmt: on
OVERRIDES = st.lists(st.tuples(st.sampled_from(KEYS), VALUES).map("=".join), max_size=3)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OVERRIDES)
@example(["model=[8]"])  # found at random: a group given a list of numbers
@example(["data=[1.5]", "trainer.max_epoch=3"])
def test_random_overrides_compose_or_fail_with_one_line(overrides):
    """Composition in-process: a config, or one of the messages the command line shows."""
    from hydra import compose, initialize_config_dir

    from utils.run.cli import command_line_error

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        try:
            compose("train", overrides=overrides)
        except Exception as error:
            message = command_line_error(error, "train")
            assert message and "\n" not in message and "Traceback" not in message


@settings(
    max_examples=5,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(OVERRIDES)
@example(["model=[8]"])  # found at random: Hydra's TypeError reached the user
def test_random_overrides_through_train_py_run_or_fail_with_one_line(tmp_path, overrides):
    result = python(tmp_path, TRAIN, "debug=fast_dev_run", *overrides, check=False)
    assert "Traceback" not in result.stderr, f"{overrides}:\n{result.stderr[-3000:]}"
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, f"{overrides}:\n{result.stderr[-3000:]}"
