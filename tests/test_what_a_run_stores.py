"""What a run stores and reads back (tests/test_what_a_run_reads.py has what it reads): exports
that would replace their checkpoint or hide NaN outputs, stored scales that are 0 in float32,
stored paths whose content would be echoed, hand-edited checkpoints and configs, paths and sizes
a system cannot take, a checkpoint write that fails, and the continue command of a stopped
sweep."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import torch
from conftest import (
    EVALUATE,
    PREDICT,
    ROOT,
    classes_table,
    error_line,
    run_python,
    run_train,
    slow,
)

TINY = ("model.hidden_sizes=[16]", "data.batch_size=64", "trainer.max_epochs=1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny digits run (checkpoints/base) to edit, resume, evaluate and predict."""
    cwd = tmp_path_factory.mktemp("hostile")
    run_train(cwd, *TINY, "trainer.max_epochs=2", "run_name=base")
    from PIL import Image

    (cwd / "pictures").mkdir()
    for i in range(3):
        Image.fromarray(torch.full((8, 8), 40 * i, dtype=torch.uint8).numpy()).save(
            cwd / "pictures" / f"{i}.png"
        )
    return cwd


# --- Exports and stored scales ---------------------------------------------------------


def test_an_export_never_replaces_the_checkpoint_it_is_made_from(trained, tmp_path):
    pytest.importorskip("safetensors")
    export = run_python(
        trained,
        str(EVALUATE),
        "ckpt=checkpoints/base/best.pt",
        f"export={tmp_path}/new/folder/w.safetensors",
    )  # a missing folder is made
    assert (tmp_path / "new/folder/w.safetensors").is_file(), export.stdout
    before = (tmp_path / "new/folder/w.safetensors").read_bytes()
    again = run_python(
        trained,
        str(EVALUATE),
        f"ckpt={tmp_path}/new/folder/w.safetensors",
        f"export={tmp_path}/new/folder/w.safetensors",
        ok=False,
    )
    assert "own input" in error_line(again)
    assert (tmp_path / "new/folder/w.safetensors").read_bytes() == before


def test_an_onnx_export_of_nan_outputs_is_refused_not_reported_as_exact(trained, tmp_path):
    pytest.importorskip("onnxruntime")
    checkpoint = torch.load(trained / "checkpoints/base/best.pt", weights_only=True)
    first = next(iter(checkpoint["model"]))
    checkpoint["model"][first] = torch.full_like(checkpoint["model"][first], float("nan"))
    torch.save(checkpoint, tmp_path / "nan.pt")
    result = run_python(
        trained, str(EVALUATE), f"ckpt={tmp_path}/nan.pt", f"export={tmp_path}/m.onnx", ok=False
    )
    assert "not finite" in error_line(result)
    assert not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("std", [1e-300, *slow(1e-45, 1e39)])
def test_a_stored_std_that_is_zero_or_inf_in_float32_is_refused(trained, tmp_path, std):
    checkpoint = torch.load(trained / "checkpoints/base/best.pt", weights_only=True)
    checkpoint["inputs"]["std"] = [std]
    torch.save(checkpoint, tmp_path / "s.pt")
    result = run_python(
        trained,
        str(PREDICT),
        f"ckpt={tmp_path}/s.pt",
        "input=pictures",
        f"out={tmp_path}/p.csv",
        ok=False,
    )
    assert "inputs record is not what torchloom writes" in error_line(result)
    assert not (tmp_path / "p.csv").exists()


# --- 5. A stored path's content is never echoed ------------------------------------------


def test_evaluate_names_a_stored_data_path_but_never_echoes_its_content(tmp_path):
    classes_table(tmp_path / "t.csv", ["x", "z"])
    run_train(tmp_path, "data=csv", "data.path=t.csv", "data.target=y", *TINY, "run_name=c")
    secret = tmp_path / "secrets.env"
    secret.write_text("api_key=SECRET-1234,token=SECRET-5678\n1,2\n")
    checkpoint = torch.load(tmp_path / "checkpoints/c/best.pt", weights_only=True)
    checkpoint["config"]["data"]["path"] = str(secret)
    torch.save(checkpoint, tmp_path / "edited.pt")
    result = run_python(tmp_path, str(EVALUATE), "ckpt=edited.pt", ok=False)
    line = error_line(result)
    assert str(secret) in line and "SECRET" not in result.stdout + result.stderr
    named = run_python(tmp_path, str(EVALUATE), "ckpt=edited.pt", f"data.path={secret}", ok=False)
    assert "api_key" in error_line(named)  # a file named on this command line may be quoted


# --- 6. Hand-edited checkpoints, odd paths and sizes: one line, exit 2 --------------------------

EDITS = {
    "a non-tensor in model": lambda c: c["model"].__setitem__(next(iter(c["model"])), "text"),
    "a non-tensor in ema.model": lambda c: c.__setitem__("ema", {"model": {"w": 1}, "updates": 1}),
    "losses without their keys": lambda c: c.__setitem__("losses", {"epoch": 1}),
    "rng without its keys": lambda c: (
        c.__setitem__("rng", {}),
        c.__setitem__("rng_per_rank", [{}]),
    ),
    "a scheduler state of other keys": lambda c: c.__setitem__("scheduler", {"foo": 1}),
    "text in metrics": lambda c: c.__setitem__("metrics", {"val/acc": "high"}),
    "batch_in_epoch=10**30": lambda c: c.__setitem__("batch_in_epoch", 10**30),
    "batch_in_epoch past its epoch": lambda c: c.__setitem__("batch_in_epoch", 10**6),
    "a negative epoch": lambda c: c.__setitem__("epoch", -3),
    "a world size of text mid-epoch": lambda c: c.update(batch_in_epoch=5, world_size="two"),
    "a world size of 0 mid-epoch": lambda c: c.update(batch_in_epoch=5, world_size=0),
    "an optimizer state of other keys": lambda c: c.__setitem__("optimizer", {"state": 1}),
    "a negative elapsed time": lambda c: c.__setitem__("elapsed_seconds", -5.0),
    "an elapsed time of text": lambda c: c.__setitem__("elapsed_seconds", "long"),
    "an elapsed time of nan": lambda c: c.__setitem__("elapsed_seconds", float("nan")),
}


QUICK_EDITS = (
    "a non-tensor in model",
    "losses without their keys",
    "batch_in_epoch past its epoch",
    "an elapsed time of nan",
)  # the rest under -m slow


@pytest.mark.parametrize("edit", [*QUICK_EDITS, *slow(*(e for e in EDITS if e not in QUICK_EDITS))])
def test_a_hand_edited_checkpoint_is_one_line_on_resume_evaluate_and_predict(
    trained, tmp_path, edit
):
    checkpoint = torch.load(trained / "checkpoints/base/last.pt", weights_only=True)
    EDITS[edit](checkpoint)
    folder = tmp_path / "edited"
    folder.mkdir()
    torch.save(checkpoint, folder / "last.pt")
    resumed = run_train(
        tmp_path, *TINY, f"resume={folder}/last.pt", "trainer.max_epochs=3", ok=False
    )
    error_line(resumed)
    if "model" not in edit:  # evaluate and predict read the weights alone
        return
    for command in (
        [str(EVALUATE), f"ckpt={folder}/last.pt"],
        [str(PREDICT), f"ckpt={folder}/last.pt", "input=pictures", f"out={tmp_path}/p.csv"],
    ):
        assert "holds something other than named tensors" in error_line(
            run_python(trained, *command, ok=False)
        )


@pytest.mark.parametrize(
    "key, value", [("_partial_", True), *slow(("_recursive_", "yes"), ("_convert_", "all"))]
)
def test_a_stored_config_that_changes_how_it_is_built_is_refused(trained, tmp_path, key, value):
    checkpoint = torch.load(trained / "checkpoints/base/best.pt", weights_only=True)
    checkpoint["config"]["model"][key] = value
    torch.save(checkpoint, tmp_path / "c.pt")
    for command in (
        [str(EVALUATE), f"ckpt={tmp_path}/c.pt"],
        [str(PREDICT), f"ckpt={tmp_path}/c.pt", "input=pictures"],
    ):
        assert f"model.{key}=" in error_line(run_python(trained, *command, ok=False))


LONG = "n" * 300


@pytest.mark.parametrize(
    "script, arguments",
    [
        ("train", ["data=csv", f"data.path={LONG}.csv", "data.target=y"]),
        ("evaluate", [f"ckpt={LONG}.pt"]),
        ("predict", ["ckpt=checkpoints/base", "input=pictures", "batch_size=0"]),
        *slow(
            ("train", [f"resume={LONG}.pt"]),
            ("train", [f"run_name={LONG}"]),
            ("train", ["paths.runs=pictures/0.png/runs"]),
            ("predict", ["ckpt=checkpoints/base", f"input=pictures/{LONG}.png"]),
            ("evaluate", ["ckpt=checkpoints/base", "data.batch_size=0"]),
            ("train", ["data=synthetic", "data.num_samples=1000000000000"]),
        ),
    ],
)
def test_paths_and_sizes_a_system_cannot_take_are_one_line(trained, script, arguments):
    settings = TINY if script == "train" else ()
    error_line(run_python(trained, str(ROOT / f"{script}.py"), *settings, *arguments, ok=False))


WRITE_LIMITED = """
import resource, runpy, sys
resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))  # last.pt needs more
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow  # its own process, to limit the size of the files it writes
def test_a_checkpoint_write_that_fails_is_one_line_and_loses_nothing(trained):
    before = (trained / "checkpoints/base/last.pt").read_bytes()
    result = run_python(
        trained,
        "-c",
        WRITE_LIMITED,
        str(ROOT / "train.py"),
        *TINY,
        "run_name=base",
        "resume=auto",
        "trainer.max_epochs=3",
        ok=False,
    )
    assert "could not write checkpoint" in error_line(result)
    assert (trained / "checkpoints/base/last.pt").read_bytes() == before
    assert not [p for p in (trained / "checkpoints/base").iterdir() if p.suffix == ".tmp"]


# --- 9. A stopped sweep job continues in its sweep -----------------------------------------


@pytest.mark.slow
def test_the_continue_command_of_a_stopped_sweep_job_reruns_its_sweep(tmp_path):
    sweep = (
        "-m",
        *TINY,
        "trainer.max_epochs=2",
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "seed=0,1",
        "run_name=sw",
    )
    stopped = run_train(tmp_path, *sweep, env={"SIGNAL_AT_FORWARD": "3"}, ok=False)
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    command = stopped.stdout.split("continue with:")[1].strip().splitlines()[0]
    assert command.startswith("python train.py -m ") and command.endswith("run_name=sw")
    words = shlex.split(command)[2:]
    continued = run_train(tmp_path, *words)
    assert "resumed from checkpoints/sw/0/last.pt" in continued.stdout + continued.stderr
    summary = json.loads((tmp_path / "runs/sw/summary.json").read_text())
    assert [job["status"] for job in summary["jobs"]] == ["completed", "completed"]
