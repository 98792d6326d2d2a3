"""Callbacks named in the config (docs/callbacks.md), through train.py as a user runs it: the
entry checks, the hooks and when they fire, a stop and its record, state that resumes under
its name, errors, and that only train.py ever builds one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import (
    HELPERS,
    PREDICT,
    checkpoint,
    error_line,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
)
from PIL import Image

from utils.errors import UserError
from utils.fit.callbacks.ready import seconds_of

FAST = ("trainer.max_epochs=3", "model.hidden_sizes=[32]", "trainer.log_every_n_steps=5")


def cb(name: str, target: str, **arguments) -> list[str]:
    """The overrides that declare callback ``name``."""
    return [f"+callbacks.{name}._target_={target}"] + [
        f"+callbacks.{name}.{key}={value}" for key, value in arguments.items()
    ]


def test_a_stop_asked_after_validation_ends_the_default_run_with_its_reason(tmp_path):
    result = run_train(tmp_path, "run_name=stop", *cb("enough", "probe_callbacks.StopAt", epoch=3))
    metrics = read_metrics(tmp_path / "runs" / "stop")
    assert metrics["stopped_by"] == {
        "callback": "enough",
        "reason": "seen enough at epoch 3",
        "epoch": 3,
        "step": metrics["global_step"],
    }
    assert metrics["epochs"] == 3 and "test/acc" in metrics  # best.pt was tested
    assert "stopped by callback enough: seen enough at epoch 3" in result.stdout
    assert checkpoint(tmp_path, "stop")["stopped_by"]["callback"] == "enough"
    # Resumed with the callback still declared, the stop holds: no further epoch is trained.
    run_train(
        tmp_path, "run_name=stop", "resume=auto", *cb("enough", "probe_callbacks.StopAt", epoch=3)
    )
    assert checkpoint(tmp_path, "stop")["epoch"] == 3


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["+callbacks.probe._targt_=probe_callbacks.Counter"], "callbacks.probe._targt_"),
        (["+callbacks.probe.tag=x"], "callbacks.probe has no _target_"),
        (cb("probe", "probe_callbacks.Nothing"), "callbacks.probe._target_"),
        (cb("probe", "probe_callbacks.Counter", every=3), "callbacks.probe.every"),
        (cb("probe", "probe_callbacks.StopAt"), "callbacks.probe.epoch is required"),
        (cb("probe", "probe_callbacks.StepCounter"), "callbacks.probe.mutable=true"),
        (cb("probe", "probe_callbacks.Counter", on_error="ignore"), "callbacks.probe.on_error"),
        (cb("probe", "probe_callbacks.Counter", order="first"), "callbacks.probe.order"),
        (cb("probe", "torch.nn.Linear"), "defines none of the hooks"),
    ],
)
def test_an_entry_that_cannot_be_built_fails_before_any_data_is_read(tmp_path, overrides, named):
    result = run_train(tmp_path, "run_name=bad", *overrides, ok=False)
    assert named in error_line(result)
    assert not (tmp_path / "checkpoints").exists()  # before the run's folders and data


def test_each_name_keeps_its_own_state_across_a_resume_exactly(tmp_path):
    both = [*cb("a", "probe_callbacks.Counter", tag="a"), *cb("b", "probe_callbacks.Counter")]
    run_train(tmp_path, *FAST, "run_name=straight", *both)
    # Stopped by a third callback after epoch 2, then resumed without it: the stop no longer
    # applies and the two counters go on from their saved state.
    run_train(tmp_path, *FAST, "run_name=twice", *both, *cb("s", "probe_callbacks.StopAt", epoch=2))
    assert checkpoint(tmp_path, "twice")["epoch"] == 2
    result = run_train(tmp_path, *FAST, "run_name=twice", "resume=auto", *both)
    assert "callback 's' stopped the run, and this command does not declare it" in result.stdout
    straight, resumed = checkpoint(tmp_path, "straight"), checkpoint(tmp_path, "twice")
    assert resumed["callbacks"] == straight["callbacks"]
    assert resumed["callbacks"]["a"]["tag"] == "a" and resumed["callbacks"]["b"]["tag"] == ""
    assert resumed["callbacks"]["a"]["counts"]["epoch_start:3"] == 1
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def test_step_hooks_fire_once_per_optimizer_step_under_accumulation(tmp_path):
    run_train(
        tmp_path,
        *FAST,
        "run_name=steps",
        "trainer.accumulate_grad_batches=4",
        *cb("steps", "probe_callbacks.StepCounter", mutable="true"),
    )
    seen = json.loads((tmp_path / "step_counter.json").read_text())
    steps = checkpoint(tmp_path, "steps")["global_step"]
    # 64 samples a micro-batch, 4 a step; under accumulation the last partial batch is dropped
    assert steps == 3 * (1257 // 64 // 4)
    for hook in ("after_backward", "before_step", "after_step"):
        assert seen[hook] == list(range(1, steps + 1)), hook


def test_read_only_hooks_cannot_change_the_run(tmp_path):
    run_train(tmp_path, *FAST, "run_name=plain")
    run_train(tmp_path, *FAST, "run_name=meddled", *cb("meddler", "probe_callbacks.Meddler"))
    plain, meddled = checkpoint(tmp_path, "plain"), checkpoint(tmp_path, "meddled")
    for name, tensor in plain["model"].items():
        assert torch.equal(meddled["model"][name], tensor), name
    assert meddled["metrics"] == plain["metrics"]
    assert meddled["config"]["optim"]["lr"] == plain["config"]["optim"]["lr"]


def test_a_step_with_every_service_around_it_trains_as_the_bare_step_does(tmp_path):
    """A step that logs nothing is bare when nothing surrounds it (utils/fit/loop.py
    ``bare_steps``); a mutable callback and ``trainer.nonfinite=skip`` send every step through
    ``_optimizer_step`` instead. Both train the same weights and optimizer state, bit for bit."""
    run_train(tmp_path, *FAST, "run_name=bare")
    steps = cb("steps", "probe_callbacks.StepCounter", mutable="true")
    run_train(tmp_path, *FAST, "run_name=full", "trainer.nonfinite=skip", *steps)
    bare, full = checkpoint(tmp_path, "bare"), checkpoint(tmp_path, "full")
    for name, tensor in bare["model"].items():
        assert torch.equal(full["model"][name], tensor), name
    for index, moments in bare["optimizer"]["state"].items():
        for name, tensor in moments.items():
            assert torch.equal(full["optimizer"]["state"][index][name], tensor), (index, name)
    assert full["scheduler"] == bare["scheduler"]
    assert full["metrics"] == bare["metrics"]


def test_a_mutable_callback_changes_the_steps(tmp_path):
    run_train(tmp_path, *FAST, "run_name=plain")
    run_train(tmp_path, *FAST, "run_name=noisy", "callbacks=gradient_noise")
    plain, noisy = checkpoint(tmp_path, "plain"), checkpoint(tmp_path, "noisy")
    assert any(not torch.equal(noisy["model"][k], v) for k, v in plain["model"].items())


def test_a_raising_hook_ends_the_run_in_one_line_and_leaves_last_pt_as_it_was(tmp_path):
    run_train(tmp_path, *FAST, "run_name=r", "trainer.max_epochs=1")
    last = tmp_path / "checkpoints" / "r" / "last.pt"
    before = last.read_bytes()
    seen = tmp_path / "seen.txt"
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=r",
        "resume=auto",
        *cb("probe", "probe_callbacks.Raising", epoch=2, seen=str(seen)),
        ok=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert (
        lines[-1] == "error: callback probe.on_validation_end raised RuntimeError: the probe broke"
    )
    assert "Traceback" not in result.stderr
    assert last.read_bytes() == before  # epoch 2 was validated, never saved
    assert seen.read_text().startswith("CallbackFailed: callback probe.on_validation_end")
    assert "the probe broke" in (tmp_path / "runs" / "r" / "train.log").read_text()
    # on_error: warn: a logging-type callback's failure is a warning and the run goes on.
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=warned",
        *cb("probe", "probe_callbacks.Raising", epoch=2, on_error="warn"),
    )
    assert "warning: callback probe.on_validation_end raised RuntimeError" in result.stdout
    assert read_metrics(tmp_path / "runs" / "warned")["epochs"] == 3


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("exit", "raised SystemExit: 0"),
        ("ansi", "raised RuntimeError: \\x1b[2J\\x1b[31mthe probe broke"),
    ],
)
def test_a_hook_that_exits_or_writes_escapes_fails_the_run_in_one_plain_line(tmp_path, how, said):
    """sys.exit(0) in a hook ended the run with exit 0, no checkpoint, no metrics.json and no
    word; an exception's ANSI sequence reached the terminal raw."""
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=r",
        *cb("probe", "probe_callbacks.Raising", epoch=1, how=how),
        ok=False,
    )
    assert result.returncode == 1
    assert (
        result.stderr.strip().splitlines()[-1] == f"error: callback probe.on_validation_end {said}"
    )
    assert "\x1b" not in result.stderr and "Traceback" not in result.stderr


def test_a_sweep_job_whose_callback_raises_is_one_line_too(tmp_path):
    result = run_train(
        tmp_path,
        "-m",
        *FAST,
        "run_name=s",
        "seed=0,1",
        *cb("probe", "probe_callbacks.Raising", epoch=1),
        ok=False,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    assert "error: callback probe.on_validation_end raised RuntimeError: the probe broke" in (
        result.stderr
    )


def test_state_that_is_not_plain_or_does_not_load_is_one_line_naming_the_callback(tmp_path):
    result = run_train(
        tmp_path, *FAST, "run_name=np", *cb("probe", "probe_callbacks.NotPlain"), ok=False
    )
    assert result.returncode == 1
    assert "callback probe.state_dict returned dict data that is not plain" in result.stderr
    run_train(
        tmp_path,
        *FAST,
        "run_name=s",
        "trainer.max_epochs=1",
        *cb("probe", "probe_callbacks.Counter"),
    )
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=s",
        "resume=auto",
        *cb("probe", "probe_callbacks.FailsToLoad"),
        ok=False,
    )
    assert (
        "callback probe.load_state_dict raised ValueError: the state is from another"
        in (result.stderr.splitlines()[-1])
    )
    # The state of a callback the command no longer declares: one warning, and the run goes on.
    result = run_train(tmp_path, *FAST, "run_name=s", "resume=auto")
    assert "holds the state of callback 'probe', which this command does not declare" in (
        result.stdout
    )
    assert "callbacks" in checkpoint(tmp_path, "s") and checkpoint(tmp_path, "s")["callbacks"] == {}


def test_a_hostile_callbacks_record_in_a_checkpoint_is_refused_in_one_line(tmp_path):
    run_train(tmp_path, *FAST, "run_name=h", "trainer.max_epochs=1")
    last = tmp_path / "checkpoints" / "h" / "last.pt"
    stored = torch.load(last, weights_only=True)
    hostile = (
        ("callbacks", {"probe": torch.zeros(3)}),
        ("callbacks", {"probe": {"log": "x" * (17 * 2**20)}}),  # over the bound docs promise
        ("stopped_by", {"x": 1}),
    )
    for key, value in hostile:
        torch.save({**stored, key: value}, last)
        result = run_train(tmp_path, *FAST, "run_name=h", "resume=auto", ok=False)
        assert "was it edited?" in error_line(result) and key.rstrip("s") in error_line(result)


def test_a_stored_config_naming_a_callback_is_never_built_by_evaluate_or_predict(tmp_path):
    run_train(tmp_path, *FAST, "run_name=t", "trainer.max_epochs=1")
    last = tmp_path / "checkpoints" / "t" / "last.pt"
    stored = torch.load(last, weights_only=True)
    stored["config"]["callbacks"] = {"boom": {"_target_": "hostile_callback.Boom", "x": 1}}
    torch.save(stored, last)
    run_evaluate(tmp_path, f"ckpt={last}")
    Image.fromarray(np.full((8, 8), 255, dtype=np.uint8)).save(tmp_path / "white.png")
    run_python(tmp_path, str(PREDICT), f"ckpt={last}", "input=white.png", "out=p.csv")
    assert (tmp_path / "p.csv").read_text().startswith("input,")
    assert not (tmp_path / "callback_was_imported").exists()
    assert not (tmp_path / "callback_was_built").exists()


def test_the_ready_made_callbacks(tmp_path):
    # A budget already spent stops at the first logged step, with a checkpoint there and the
    # test of the run; resumed, its elapsed time is carried, so it stops again at once.
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=b",
        "callbacks=time_budget",
        "callbacks.time_budget.max_time=0.000001",
    )
    metrics = read_metrics(tmp_path / "runs" / "b")
    assert metrics["stopped_by"]["callback"] == "time_budget"
    assert metrics["stopped_by"]["step"] == 5 and metrics["global_step"] == 5
    assert "test/acc" in metrics
    saved = checkpoint(tmp_path, "b")
    assert saved["batch_in_epoch"] == 5 and saved["callbacks"]["time_budget"]["elapsed_seconds"] > 0
    assert "the time budget of 1e-06 s is spent" in result.stdout
    result = run_train(
        tmp_path,
        *FAST,
        "run_name=t",
        "callbacks=stop_at_target",
        "callbacks.stop_at_target.target=0.5",
    )
    assert read_metrics(tmp_path / "runs" / "t")["stopped_by"]["epoch"] == 1
    assert seconds_of("01:30:00") == 5400 and seconds_of(90) == 90
    assert seconds_of("1:00:00:00") == 86400
    for bad in ("soon", "1:2:3:4:5", 0, "-1"):
        with pytest.raises(UserError):
            seconds_of(bad)


def test_where_the_hooks_sit_among_the_built_in_pieces(tmp_path):
    run_train(
        tmp_path,
        "run_name=order",
        "trainer.max_epochs=2",
        "trainer.gradient_clip_val=0.01",
        *cb("order", "probe_callbacks.Order", mutable="true"),
    )
    events = json.loads((tmp_path / "order.json").read_text())
    steps = [e for e in events if e[0] in ("after_backward", "before_step", "after_step")]
    assert [e[0] for e in steps[:3]] == ["after_backward", "before_step", "after_step"]
    # Before the optimizer step the gradients are clipped; after backward they are not yet.
    backward = [e[2] for e in steps if e[0] == "after_backward"]
    before = [e[2] for e in steps if e[0] == "before_step"]
    assert max(before) <= 0.01 * 1.0001 and max(backward) > 0.01
    # After the optimizer step the schedule has stepped: the LR is the next step's.
    saved = checkpoint(tmp_path, "order")
    assert (
        steps[-1][0] == "after_step" and steps[-1][2] == saved["optimizer"]["param_groups"][0]["lr"]
    )
    # Per epoch: its start, its steps, the validation, then last.pt and best.pt are written.
    coarse = [e[:2] for e in events if e[0] not in ("after_backward", "before_step", "after_step")]
    assert coarse[:7] == [
        ["epoch_start", 1],
        ["validation_end", 1],
        ["checkpoint", "last"],
        ["checkpoint", "best"],  # the first validation is the best so far
        ["epoch_start", 2],
        ["validation_end", 2],
        ["checkpoint", "last"],
    ]
    assert coarse[7:-1] in ([], [["checkpoint", "best"]]) and coarse[-1] == ["fit_end", "finished"]


def test_entries_are_called_in_declaration_order_unless_an_order_is_given(monkeypatch):
    monkeypatch.syspath_prepend(str(HELPERS))
    import probe_callbacks

    from utils.fit.callbacks.hooks import Callbacks, entries_of

    def called(config: dict) -> list[str]:
        probe_callbacks.CALLS.clear()
        Callbacks(entries_of(config)).epoch_start(1)
        return list(probe_callbacks.CALLS)

    target = "probe_callbacks.Recorder"
    declared = {name: {"_target_": target, "tag": name} for name in ("c", "a", "b")}
    assert called(declared) == ["c", "a", "b"]
    declared["b"]["order"] = -1  # first; the others keep their declared order
    assert called(declared) == ["b", "c", "a"]
