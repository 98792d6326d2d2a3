"""trainer.refit (utils/run/refit.py): once a small table's run is validated and tested, the
final model trained again on train ∪ val and tested on the same rows; what a user relies on:
the run itself unchanged, the refit's rows and figures said, its best.pt its final weights,
a kill inside it resumed bit for bit, and the settings that cannot refit refused in one line."""

from __future__ import annotations

import json
import shlex
import signal

import pytest
import torch
from conftest import (
    EVALUATE,
    PREDICT,
    checkpoint,
    error_line,
    killed_at,
    run_python,
    run_train,
    write_table,
)
from omegaconf import OmegaConf

from data.batching.splits import MappedSplit, TensorSplit, joined
from utils.errors import UserError
from utils.evaluation.fit_calibration import check_val_held_out
from utils.run.refit import AUTO_ROWS, _wanted, check_refit, refit
from utils.run.resume_changes import config_changes
from utils.system.signals import EXIT_INTERRUPTED

RUN = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=3")


def metrics(tmp_path, run_name: str) -> dict:
    return json.loads((tmp_path / "runs" / run_name / "metrics.json").read_text())


def test_a_small_table_refits_on_train_and_val_and_the_run_is_what_it_was(tmp_path):
    write_table(tmp_path / "t.csv", rows=300)
    said = run_train(tmp_path, *RUN, "run_name=refitted")
    run_train(tmp_path, *RUN, "trainer.refit=false", "run_name=alone")
    first, alone = metrics(tmp_path, "refitted"), metrics(tmp_path, "alone")
    assert {k: first[k] for k in alone if k.startswith(("val/", "test/"))} == {
        k: v for k, v in alone.items() if k.startswith(("val/", "test/"))
    }  # the run validated and tested as without a refit
    a = checkpoint(tmp_path, "refitted", "best.pt")["model"]
    b = checkpoint(tmp_path, "alone", "best.pt")["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (tmp_path / "runs" / "alone" / "refit").exists()
    assert not any(k.startswith("refit/") for k in alone)

    second = metrics(tmp_path, "refitted/refit")
    rows = first["samples"]["train"] + first["samples"]["val"]
    assert second["samples"] == {**first["samples"], "train": rows}  # val joined, test apart
    assert first["refit/test/acc"] == second["test/acc"]
    assert first["refit/checkpoint"] == "checkpoints/refitted/refit/best.pt"
    best = checkpoint(tmp_path, "refitted/refit", "best.pt")
    last = checkpoint(tmp_path, "refitted/refit")
    assert best["epoch"] == last["epoch"] == 3  # validated after its last epoch alone
    assert all(torch.equal(best["model"][k], last["model"][k]) for k in best["model"])
    assert best["config"]["trainer"]["train_on_val"] is True
    out = said.stdout + said.stderr
    assert f"refit: the run again on train ∪ val ({rows} rows)" in out
    assert f"test/acc {second['test/acc']:.4f} (the run's {first['test/acc']:.4f})" in out

    predicted = run_python(  # the refit's weights serve as any checkpoint does
        tmp_path, str(PREDICT), f"ckpt={first['refit/checkpoint']}", "input=t.csv", "out=p.csv"
    )
    assert predicted.returncode == 0
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 301
    for asked, said in (("split=val", "split=val would score"), ("calibrate=temperature", "fit")):
        refused = run_python(
            tmp_path, str(EVALUATE), f"ckpt={first['refit/checkpoint']}", asked, ok=False
        )
        line = error_line(refused)  # scored or calibrated on rows it trained on: refused
        assert "trained on its val rows too (trainer.train_on_val: a refit)" in line
        assert f"{said} it on rows it learned" in line


def test_a_kill_inside_the_refit_resumes_it_bit_for_bit(tmp_path):
    """The run finishes; its refit is killed -9 at its 13th training batch (the signalling
    model counts the refit's own forwards); ``resume=auto`` keeps the finished run and
    continues the refit from its last.pt to the weights of a refit never stopped."""
    write_table(tmp_path / "t.csv", rows=300)
    run = (*RUN, "model._target_=signalling_model.auto", "data.batch_size=32")
    run += ("trainer.checkpoint_every_n_steps=3",)
    run_train(tmp_path, *run, "run_name=straight")
    run_train(tmp_path, *run, "trainer.refit=false", "run_name=killed")
    killed = run_train(
        tmp_path, *run, "run_name=killed", "resume=auto", ok=False, env=killed_at(13)
    )
    assert killed.returncode == -signal.SIGKILL
    stopped = checkpoint(tmp_path, "killed/refit")["global_step"]
    assert 0 < stopped < checkpoint(tmp_path, "straight/refit")["global_step"]  # inside it
    run_train(tmp_path, *run, "run_name=killed", "resume=auto")
    a = checkpoint(tmp_path, "straight/refit")["model"]
    b = checkpoint(tmp_path, "killed/refit")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (
        metrics(tmp_path, "killed")["refit/test/acc"]
        == metrics(tmp_path, "straight")["refit/test/acc"]
    )


def _config(refit="auto", target="data.tables.tabular.load_csv", folds=None, joined=False, **debug):
    trainer = {"refit": refit, "train_on_val": joined, "write_outputs": True, "shapes_only": False}
    trainer.update({"overfit_batches": 0, "limit_train_batches": None, "profile_steps": 0})
    trainer.update(debug)
    data = {"_target_": target, "split": {"folds": folds}}
    return OmegaConf.create({"trainer": trainer, "data": data})


def _first(train: int, val: int, test_split: str = "test") -> dict:
    samples = {"train": train, "val": val, "test": 50}
    return {"status": "completed", "samples": samples, "test_split": test_split}


def test_auto_refits_a_csv_table_under_10000_rows_and_true_any_held_split():
    assert _wanted(_config(), _first(AUTO_ROWS - 1001, 1000))
    assert not _wanted(_config(), _first(AUTO_ROWS - 1000, 1000))  # large enough to hold out
    assert not _wanted(_config(target="data.arrays.tensors.load_tensors"), _first(300, 50))
    assert _wanted(_config(True, target="data.arrays.tensors.load_tensors"), _first(30000, 50))
    assert not _wanted(_config(False), _first(300, 50))
    assert not _wanted(_config(folds=5), _first(300, 50))  # a fold's val makes its oof
    assert not _wanted(_config(joined=True), _first(300, 50))  # the refit itself
    assert not _wanted(_config(), {**_first(300, 50), "status": "interrupted"})
    for debug in ({"write_outputs": False}, {"overfit_batches": 2}, {"limit_train_batches": 5}):
        assert not _wanted(_config(True, **debug), _first(300, 50))  # conf/debug/'s modes
    assert not _wanted(_config(), _first(300, 50, test_split="val"))
    for edited in ({"train": "300", "val": 50}, {"train": 300}, [300, 50], None):
        assert not _wanted(_config(True), {**_first(300, 50), "samples": edited})  # no refit
    with pytest.raises(UserError, match="no test split apart from val"):
        _wanted(_config(True), _first(300, 50, test_split="val"))


def test_splits_join_in_memory_and_a_lazy_split_is_one_line():
    a = TensorSplit(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))
    b = TensorSplit(torch.ones(2, 2), torch.ones(2, dtype=torch.long))
    both = joined({"train": a, "val": b}, "trainer.train_on_val")
    assert (
        both.inputs.tolist() == [[0, 0]] * 3 + [[1, 1]] * 2
        and both.labels.tolist() == [0] * 3 + [1] * 2
    )
    mapped = MappedSplit(torch.zeros(2, 2).numpy(), torch.zeros(2, dtype=torch.long))
    with pytest.raises(UserError, match=r"trainer\.train_on_val: the train and val splits cannot"):
        joined({"train": a, "val": mapped}, "trainer.train_on_val")
    with pytest.raises(UserError, match="cannot be joined"):
        joined({"train": a, "val": TensorSplit(torch.ones(2, 3), torch.ones(2))}, "x")


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        (("trainer.refit=sometimes",), "trainer.refit='sometimes' must be auto, true or false"),
        (("trainer.refit=1.5",), "trainer.refit=1.5 must be auto, true or false"),
        (("trainer.refit=true", "cv=3"), "trainer.refit=true and cv=3 do not combine"),
    ],
)
def test_a_wrong_refit_setting_is_one_line(tmp_path, overrides, said):
    write_table(tmp_path / "t.csv", rows=60)
    result = run_train(tmp_path, *RUN, *overrides, ok=False)
    assert said in error_line(result)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def test_a_checkpoint_from_before_refit_resumes_and_training_on_val_needs_allowing():
    stored = {"trainer": {"max_epochs": 3}, "data": {"path": "t.csv"}}
    now = {"trainer": {"max_epochs": 3, "refit": "auto", "train_on_val": False}, **stored}
    now["trainer"] = {"max_epochs": 3, "refit": "auto", "train_on_val": False}
    changes = config_changes(stored, now)
    assert changes.never == changes.need_allow == []
    assert changes.applied == ["trainer.refit: False -> auto"]  # says how it ends, not what it is
    joined_now = {**now, "trainer": {**now["trainer"], "train_on_val": True}}
    assert config_changes(stored, joined_now).need_allow == ["trainer.train_on_val: False -> True"]


@pytest.mark.parametrize("part", ["refit", "fold-0"])
def test_a_part_of_a_run_stopped_by_sigterm_says_the_command_that_continues_the_run(tmp_path, part):
    """A refit or a cv fold is part of its run: the line a stop prints continues the run as a
    whole (its run_name, resume=auto), not the part's last.pt under the run's name, which the
    run's own folder refuses; that command, run as printed, finishes it."""
    write_table(tmp_path / "t.csv", rows=150)
    run = (*RUN[:3], "trainer.max_epochs=2", "model._target_=signalling_model.auto")
    run += ("data.batch_size=16", "run_name=p")
    if part == "refit":
        run_train(tmp_path, *run, "trainer.refit=false")  # the run finished; its refit next
        run += ("resume=auto",)
    else:
        run += ("cv=2",)
    stopped = run_train(tmp_path, *run, ok=False, env={"SIGNAL_AT_FORWARD": "5"})
    assert stopped.returncode == EXIT_INTERRUPTED
    command = stopped.stdout.split("continue with:")[1].strip().splitlines()[0]
    given = shlex.split(command)[2:]
    assert given[-2:] == ["run_name=p", "resume=auto"]
    assert f"checkpoints/p/{part}/last.pt" not in command
    resumed = run_train(tmp_path, *given)
    assert f"resumed from checkpoints/p/{part}/last.pt" in resumed.stdout
    assert metrics(tmp_path, f"p/{part}")["status"] == "completed"


def test_under_torchrun_refit_true_is_refused_and_auto_does_not_refit(monkeypatch):
    """Each process would have to read the run's metrics.json at once to agree on a refit;
    refitting is for tables that fit one process, so torchrun's processes never start one."""
    cfg = _config(True)
    cfg.cv = None
    check_refit(cfg)  # one process: fine
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=r"trainer\.refit=true runs in one process"):
        check_refit(cfg)
    cfg.trainer.refit = "auto"
    check_refit(cfg)
    called = []
    refit(cfg, None, lambda *args: called.append(args))  # returns before reading any file
    assert called == []


@pytest.mark.parametrize("stored", [True, "true", 1, "false"])
def test_a_stored_train_on_val_edited_to_anything_but_false_is_held_to_its_val_rows(stored):
    """A checkpoint's config is data from elsewhere: only a stored false (or none: a run from
    before the key) lets evaluate.py score val or calibrate there."""
    config = {"trainer": {"train_on_val": stored}}
    with pytest.raises(UserError, match="trained on its val rows too"):
        check_val_held_out("best.pt", config, "val", None)
    with pytest.raises(UserError, match="calibrate=/threshold= would fit"):
        check_val_held_out("best.pt", config, "test", (True, False))
    check_val_held_out("best.pt", config, "test", None)  # its test split: fine
    for held_out in ({"trainer": {"train_on_val": False}}, {"trainer": {}}, {}, None):
        check_val_held_out("best.pt", held_out, "val", (True, False))


def test_a_refits_checkpoint_resumed_over_another_run_is_refused_naming_the_run_it_is_part_of(
    tmp_path,
):
    """Resuming a part's checkpoint into a folder of another run is refused, as any is; the
    line names the command that continues it, its run's resume (a run_name ending in refit is
    refused), not the part's own name."""
    write_table(tmp_path / "t.csv", rows=120)
    run = ("data=csv", "data.path=t.csv", "data.target=kind", "trainer.max_epochs=1")
    run_train(tmp_path, *run, "run_name=a")
    run_train(tmp_path, *run, "trainer.refit=false", "run_name=b")
    again = ("run_name=b", "resume=checkpoints/a/refit/last.pt")
    line = error_line(run_train(tmp_path, *run, "trainer.max_epochs=2", *again, ok=False))
    assert "that folder holds another run" in line
    assert "continue the checkpoint's run with run_name=a resume=auto (the run its refit" in line
