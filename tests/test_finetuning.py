"""Fine-tuning: layer-wise LR decay (optim.layer_decay, models/layers.py), knowledge
distillation from a checkpoint (distill.*), and weight averaging (trainer.swa, evaluate.py
average=top_k)."""

from __future__ import annotations

import re

import pytest
import torch
from omegaconf import OmegaConf
from test_run_folders_and_resume import HOSTILE_CONFIGS
from torch import nn

from utils.config.build import build
from utils.errors import UserError
from utils.model.optim import build_optimizer
from utils.schedulers import StepCounts

SCHEDULERS = {  # each with a warmup, so the warmup's factor is checked too
    "none": {"warmup_steps": 5},
    "step": {"warmup_steps": 5, "step_size": 1, "gamma": 0.5},
    "cosine": {"warmup_steps": 5, "min_lr_ratio": 0.1},
    "onecycle": {
        "warmup_steps": 5,
        "div_factor": 25.0,
        "final_div_factor": 1e4,
        "anneal_strategy": "cos",
    },
    "plateau": {
        "warmup_steps": 5,
        "monitor": "val/loss",
        "mode": "min",
        "factor": 0.5,
        "patience": 0,
        "min_lr": 1e-4,
    },
}


def adamw(**extra) -> OmegaConf:
    return OmegaConf.create(
        {
            "_target_": "torch.optim.AdamW",
            "_partial_": True,
            "lr": 0.01,
            "weight_decay": 0.05,
            **extra,
        }
    )


@pytest.mark.parametrize("name", SCHEDULERS)
def test_every_schedule_keeps_the_ratios_between_layers_for_100_steps(name):
    from models.resnet import resnet18

    model = resnet18((3, 16, 16), 4, small_input_stem=True, init="default")
    optimizer = build_optimizer(model, adamw(layer_decay=0.7))
    layers = list(dict.fromkeys(g["layer"] for g in optimizer.param_groups))
    assert layers[0] == "conv1+bn1" and layers[-1] == "fc" and len(layers) == 10
    depth = {layer: len(layers) - 1 - i for i, layer in enumerate(layers)}
    node = OmegaConf.create({"_target_": f"utils.schedulers.{name}", **SCHEDULERS[name]})
    schedule = build(node)(optimizer, StepCounts(per_epoch=10, total=100))
    for step in range(100):
        optimizer.step()
        schedule.after_optimizer_step()
        if step % 10 == 9:  # a validation that never improves: the plateau keeps reducing
            schedule.after_validation({"val/loss": 1.0})
        head = next(g["lr"] for g in optimizer.param_groups if g["layer"] == "fc")
        for group in optimizer.param_groups:
            ratio = group["lr"] / head
            assert ratio == pytest.approx(0.7 ** depth[group["layer"]], rel=1e-9), (
                step,
                group["layer"],
            )
    assert head < 0.01 or name == "none"  # the schedule did move the LR


class Declared(nn.Module):
    """A user's model that names its layers, but forgets one parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.body, self.out = nn.Linear(4, 8), nn.Linear(8, 8), nn.Linear(8, 2)
        self.scale = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return self.out(self.body(self.embed(x)) * self.scale)

    def layer_groups(self):
        return [("embed", self.embed), ("body", self.body), ("head", self.out)]


def test_a_parameter_no_declared_layer_holds_is_refused_in_one_line():
    with pytest.raises(UserError, match=r"parameter scale is in none of Declared.layer_groups"):
        build_optimizer(Declared(), adamw(layer_decay=0.5))
    model = Declared()
    model.layer_groups = lambda: [
        ("embed", [*model.embed.parameters(), model.scale]),
        ("body", model.body),
        ("head", model.out),
    ]
    optimizer = build_optimizer(model, adamw(layer_decay=0.5))
    lrs = {g["layer"]: g["lr"] for g in optimizer.param_groups}
    assert lrs == pytest.approx({"embed": 0.0025, "body": 0.005, "head": 0.01})


def test_layer_decay_out_of_range_is_refused_before_data_is_read(tmp_path):
    from conftest import run_train

    result = run_train(tmp_path, "optim.layer_decay=1.5", ok=False)
    assert result.returncode == 2
    assert (
        "optim.layer_decay=1.5 is out of range: it must be above 0 and at most 1" in result.stderr
    )


# --- SWA and checkpoint averaging (utils/fit/swa.py) -------------------------------------------

SWA = [
    "model=cnn",
    "model.channels=[8,16]",
    "trainer.max_epochs=3",
    "trainer.keep_top_k=3",
    "trainer.swa.start=1",
    "trainer.swa.lr=0.0005",
    "scheduler=cosine",
]


@pytest.fixture(scope="module")
def swa_run(tmp_path_factory):
    from conftest import run_train

    cwd = tmp_path_factory.mktemp("swa")
    run_train(cwd, *SWA, "run_name=s")
    return cwd


def train_split(checkpoint: dict):
    """The train split in order, unaugmented, in the run's evaluation batches."""
    from data.batching.batches import Placement

    data = build(OmegaConf.create(checkpoint["config"]["data"]))
    return data.batches("train", Placement(torch.device("cpu")), seed=0, train=False)


def test_swa_averages_the_epochs_after_start_and_refits_batchnorm_cumulatively(swa_run):
    from models.cnn import cnn
    from utils.checkpoint.load import load_checkpoint
    from utils.fit.swa import recompute_batchnorm
    from utils.precision import Precision

    folder = swa_run / "checkpoints" / "s"
    last = load_checkpoint(folder / "last.pt")
    epochs = [load_checkpoint(p)["model"] for p in sorted(folder.glob("epoch=*.pt"))]
    averaged = last["swa"]["model"]
    assert last["swa"]["updates"] == 2  # epochs 2 and 3: those after swa.start=1
    for key, value in averaged.items():
        if "running" not in key and value.is_floating_point():
            assert torch.allclose(value, (epochs[1][key] + epochs[2][key]) / 2, atol=1e-6), key
    # By hand: each BatchNorm's input over the train split; the statistics are the mean over
    # batches of each batch's mean and unbiased variance (what momentum=None accumulates).
    model = cnn((1, 8, 8), 10, [8, 16], 0.1, "default")
    model.load_state_dict(averaged)
    seen: dict[nn.Module, list] = {}
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    hooks = [
        norm.register_forward_pre_hook(
            lambda m, args: seen.setdefault(m, []).append(args[0].detach())
        )
        for norm in norms
    ]
    model.train()
    with torch.no_grad():
        for inputs, _ in train_split(last).epoch(0):
            model(inputs)
    for hook in hooks:
        hook.remove()
    names = [name for name, m in model.named_modules() if isinstance(m, nn.BatchNorm2d)]
    for name, norm in zip(names, norms, strict=True):
        batches = seen[norm]
        mean = torch.stack([b.mean((0, 2, 3)) for b in batches]).mean(0)
        var = torch.stack([b.var((0, 2, 3), unbiased=True) for b in batches]).mean(0)
        assert torch.allclose(averaged[f"{name}.running_mean"], mean, atol=1e-5), name
        assert torch.allclose(averaged[f"{name}.running_var"], var, rtol=1e-4, atol=1e-6), name
        assert not torch.allclose(
            averaged[f"{name}.running_mean"], last["model"][f"{name}.running_mean"]
        )
    # The same function, run here, puts each momentum back (not 0: Lightning #14866).
    assert recompute_batchnorm(
        model, train_split(last).epoch(0), Precision("float32", torch.device("cpu"))
    )
    assert all(norm.momentum == 0.1 for norm in norms)
    assert torch.allclose(
        model.state_dict()[f"{names[0]}.running_mean"],
        averaged[f"{names[0]}.running_mean"],
        atol=1e-6,
    )


@pytest.mark.parametrize("epoch", [1, 2])  # at swa.start, and inside the averaging
def test_a_resume_on_either_side_of_swa_start_is_bit_identical(swa_run, epoch):
    from conftest import run_train

    from utils.checkpoint.load import load_checkpoint

    folder = swa_run / "checkpoints" / "s"
    (copy,) = folder.glob(f"epoch={epoch:03d}-*.pt")
    run_train(swa_run, *SWA, f"run_name=cut{epoch}", f"resume='{copy}'")
    straight = load_checkpoint(folder / "last.pt")
    resumed = load_checkpoint(swa_run / "checkpoints" / f"cut{epoch}" / "last.pt")
    for part in ("model", "swa"):
        want = straight[part] if part == "model" else straight[part]["model"]
        got = resumed[part] if part == "model" else resumed[part]["model"]
        assert all(torch.equal(want[k], got[k]) for k in want), part
    assert resumed["scheduler"] == straight["scheduler"]  # the SWA phase and its LRs
    assert resumed["optimizer"]["param_groups"] == straight["optimizer"]["param_groups"]


def test_an_swa_phase_with_fewer_lrs_than_groups_is_one_line_at_resume(swa_run):
    from conftest import run_train

    (copy,) = (swa_run / "checkpoints" / "s").glob("epoch=002-*.pt")
    edited = torch.load(copy, weights_only=True)
    assert len(edited["scheduler"]["swa"]["lr_start"]) > 1
    edited["scheduler"]["swa"]["lr_start"] = edited["scheduler"]["swa"]["lr_start"][:1]
    torch.save(edited, swa_run / "short.pt")
    result = run_train(swa_run, *SWA, "run_name=short", "resume=short.pt", ok=False)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "scheduler" in lines[0], result.stderr


def test_swa_anneals_to_its_lr_and_weights_swa_evaluates_and_exports(swa_run):
    import json

    from conftest import run_evaluate

    from utils.checkpoint.load import load_checkpoint

    last = load_checkpoint(swa_run / "checkpoints" / "s" / "last.pt")
    assert last["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.0005)  # annealed
    assert last["scheduler"]["swa"]["taken"] == last["global_step"]
    result = run_evaluate(
        swa_run, "ckpt=checkpoints/s", "weights=swa", "export=s.pt2", "runs=e-swa"
    )
    assert "torch.export.load on batches of 1, 2 and 8" in " ".join(result.stdout.split())
    (run_dir,) = (swa_run / "e-swa" / "eval").iterdir()
    evaluated = next(iter(json.loads((run_dir / "metrics.json").read_text()).values()))
    trained = json.loads((swa_run / "runs" / "s" / "metrics.json").read_text())
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-9)  # judged: SWA
    program = torch.export.load(swa_run / "s.pt2").module()
    assert program(torch.zeros(3, 1, 8, 8, dtype=torch.uint8)).shape == (3, 10)  # pixels


def test_average_top_k_averages_the_copies_refits_batchnorm_and_keeps_the_result(swa_run):
    from conftest import run_evaluate

    from utils.checkpoint.load import load_checkpoint

    folder = swa_run / "checkpoints" / "s"
    copies = [load_checkpoint(p) for p in sorted(folder.glob("epoch=*.pt"))]
    result = run_evaluate(
        swa_run, "ckpt=checkpoints/s", "average=top_k", "weights=raw", "runs=e-avg"
    )
    assert "averaged 3 top-k copies" in " ".join(result.stdout.split())
    (run_dir,) = (swa_run / "e-avg" / "eval").iterdir()
    kept = load_checkpoint(run_dir / "averaged.pt")
    for key, value in kept["model"].items():
        mean = sum(c["model"][key].double() for c in copies) / 3
        if "running" in key:  # refitted on the train split, not averaged
            assert not torch.allclose(value.double(), mean, atol=1e-4), key
        elif value.is_floating_point():
            assert torch.allclose(value.double(), mean, atol=1e-6), key
    again = run_evaluate(swa_run, f"ckpt={run_dir / 'averaged.pt'}", "runs=e-again")
    assert "test/acc" in again.stdout
    few = run_evaluate(
        swa_run,
        "ckpt=checkpoints/s/best.pt",
        "average=top_k",
        "split=val",
        "calibrate=temperature",
        "runs=e-few",
        ok=False,
    )
    assert few.returncode == 2 and "average=top_k takes one run's checkpoint folder" in few.stderr


def test_average_top_k_of_a_run_without_copies_is_refused_not_best_pt_as_it_is(tmp_path):
    from conftest import run_evaluate, run_train

    run_train(tmp_path, "trainer.max_epochs=1", "model.hidden_sizes=[16]", "run_name=none")
    result = run_evaluate(tmp_path, "ckpt=checkpoints/none", "average=top_k", "runs=e", ok=False)
    assert result.returncode == 2
    assert "average=top_k needs two or more top-k copies; found 0" in result.stderr
    assert not list((tmp_path / "e").rglob("averaged.pt"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.swa.start=5", "trainer.max_epochs=3"],
            "trainer.swa.start=5 must be a whole number",
        ),
        (["trainer.swa.start=0.5", "trainer.ema.decay=0.9"], "trainer.ema and trainer.swa each"),
        (
            ["trainer.swa.start=1", "trainer.swa.lr=-1"],
            "trainer.swa.lr=-1.0 must be greater than 0",
        ),
        (
            ["trainer.swa.start=1", "trainer.sync_batchnorm=true"],
            "set trainer.sync_batchnorm=false",
        ),
    ],
)
def test_bad_swa_settings_are_one_line(tmp_path, overrides, message):
    from conftest import run_train

    result = run_train(tmp_path, "trainer.max_epochs=2", *overrides, ok=False)
    assert result.returncode == 2 and message in result.stderr


def test_a_resume_that_changes_swa_is_refused(swa_run):
    from conftest import run_train

    result = run_train(
        swa_run, *SWA[:-2], "trainer.swa.start=2", "run_name=s", "resume=auto", ok=False
    )
    assert result.returncode == 2 and "trainer.swa.start: 1 -> 2" in result.stderr


# --- Knowledge distillation (utils/fit/teacher.py) ----------------------------------------------

STUDENT = ["model.hidden_sizes=[32]", "trainer.max_epochs=2"]


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    from conftest import run_train

    cwd = tmp_path_factory.mktemp("teacher")
    run_train(cwd, "model=cnn", "model.channels=[8,16]", "trainer.max_epochs=2", "run_name=t")
    return cwd


def distill_node(path, **settings) -> OmegaConf:
    return OmegaConf.create(
        {"teacher": str(path), "weights": "auto", "temperature": 4.0, "alpha": 0.5, **settings}
    )


def digits_and_task(teacher_run):
    from utils.checkpoint.load import load_checkpoint

    stored = load_checkpoint(teacher_run / "checkpoints" / "t" / "best.pt")["config"]["data"]
    data = build(OmegaConf.create(stored))  # the same digits the teacher trained on
    task = build(
        OmegaConf.create(
            {
                "_target_": "utils.tasks.classification",
                "label_smoothing": 0.0,
                "class_weights": None,
            }
        )
    )
    return data, task.fitted(data, torch.device("cpu"))


def test_the_kl_term_is_zero_for_a_copy_of_the_teacher_and_alpha_blends(teacher_run, tmp_path):
    import copy

    from utils.fit.teacher import Teacher

    data, task = digits_and_task(teacher_run)
    best = teacher_run / "checkpoints" / "t" / "best.pt"
    teacher = Teacher.of(distill_node(best, alpha=1.0), data, task, torch.device("cpu"), tmp_path)
    assert teacher.renormalize is None and not teacher.model.training  # the same statistics
    inputs = torch.randn(16, 1, 8, 8)
    copied = copy.deepcopy(teacher.model)
    loss = torch.tensor(3.0)
    assert teacher.blend(loss, copied(inputs), inputs).item() == 0.0  # α = 1: the KL alone
    other = torch.randn(16, 10, requires_grad=True)
    kl = teacher.blend(loss, other, inputs)
    assert kl.item() > 0
    kl.backward()  # the teacher's outputs, taken under inference_mode, may join autograd
    assert other.grad is not None
    teacher.alpha = 0.25
    blended = teacher.blend(loss, other, inputs)
    assert blended.item() == pytest.approx(0.75 * 3.0 + 0.25 * kl.item(), rel=1e-6)
    # A student normalised differently: its inputs are taken to the teacher's statistics.
    data.mean, data.std = [0.2], [0.5]
    renormed = Teacher.of(distill_node(best), data, task, torch.device("cpu"), tmp_path)
    raw = torch.rand(4, 1, 8, 8)
    scale, shift = renormed.renormalize
    record = load_checkpoint_record(best)
    expected = (raw - record["mean"][0]) / record["std"][0]
    assert torch.allclose((raw - 0.2) / 0.5 * scale + shift, expected, atol=1e-6)


def load_checkpoint_record(path) -> dict:
    from utils.checkpoint.load import load_checkpoint

    return load_checkpoint(path)["inputs"]


def test_a_student_learns_from_its_teacher_and_keeps_only_its_path_and_hash(teacher_run):
    from conftest import run_train

    from utils.checkpoint.load import load_checkpoint
    from utils.fit.teacher import file_sha256

    best = teacher_run / "checkpoints" / "t" / "best.pt"
    before = file_sha256(best)
    run_train(
        teacher_run,
        *STUDENT,
        f"distill.teacher={best}",
        "data.augment.mixup_alpha=0.2",
        "run_name=s",
    )
    student = load_checkpoint(teacher_run / "checkpoints" / "s" / "last.pt")
    assert student["distill"] == {"teacher": str(best), "sha256": before}
    assert sorted(student["model"]) == ["1.bias", "1.weight", "4.bias", "4.weight"]  # the mlp's
    assert file_sha256(best) == before  # the teacher's file is only read
    assert student["metrics"]["val/acc"] > 0.5


def test_a_resume_with_another_teacher_file_is_refused_and_a_moved_copy_is_not(teacher_run):
    import shutil

    from conftest import run_train

    from utils.checkpoint.load import load_checkpoint

    best = teacher_run / "checkpoints" / "t" / "best.pt"
    run_train(
        teacher_run, *STUDENT, f"distill.teacher={best}", "run_name=r", "trainer.keep_top_k=2"
    )
    (epoch_1,) = (teacher_run / "checkpoints" / "r").glob("epoch=001-*.pt")
    moved = teacher_run / "moved.pt"
    shutil.copy(best, moved)
    run_train(
        teacher_run, *STUDENT, f"distill.teacher={moved}", "run_name=r2", f"resume='{epoch_1}'"
    )
    other = teacher_run / "other.pt"  # another teacher: one weight changed
    edited = load_checkpoint(best)
    edited["model"]["16.bias"] += 1.0  # the cnn's classifier
    torch.save(edited, other)
    shutil.copy(epoch_1, teacher_run / "e1.pt")
    refused = run_train(
        teacher_run,
        *STUDENT,
        f"distill.teacher={other}",
        "run_name=r3",
        f"resume='{teacher_run / 'e1.pt'}'",
        ok=False,
    )
    assert refused.returncode == 2
    assert "are not the teacher the run was trained with" in refused.stderr


def crafted(config: dict):
    """An edit merging one of the hardening matrix's crafted configs into a checkpoint's."""

    def edit(checkpoint: dict) -> None:
        for group, node in config.items():
            checkpoint["config"][group] = {**checkpoint["config"][group], **node}

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        *((crafted(config), message) for _, config, message in HOSTILE_CONFIGS),
        (
            lambda c: c["inputs"].update(
                num_classes=3, targets={"kind": "classes", "count": 3, "names": None}
            ),
            "do not fit the model",
        ),
        (
            lambda c: c["config"].update(
                task={
                    "_target_": "utils.tasks.regression",
                    "loss": "mse",
                    "huber_delta": 1.0,
                    "standardize_targets": True,
                }
            ),
            "task=regression learns numbers",
        ),
        (lambda c: c.update(model={"w": torch.zeros(2)}), "do not fit the model"),
    ],
)
def test_a_hostile_or_unfit_teacher_is_refused_in_one_line(teacher_run, tmp_path, edit, message):
    from conftest import run_train

    from utils.checkpoint.load import load_checkpoint

    checkpoint = load_checkpoint(teacher_run / "checkpoints" / "t" / "best.pt")
    edit(checkpoint)
    torch.save(checkpoint, tmp_path / "edited.pt")
    result = run_train(tmp_path, *STUDENT, f"distill.teacher={tmp_path / 'edited.pt'}", ok=False)
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").rglob("*.pt")
    )


def test_distilling_into_another_task_or_with_bad_settings_is_one_line(teacher_run, tmp_path):
    from utils.fit.teacher import Teacher

    data, _ = digits_and_task(teacher_run)
    best = teacher_run / "checkpoints" / "t" / "best.pt"
    regression = build(
        OmegaConf.create(
            {
                "_target_": "utils.tasks.regression",
                "loss": "mse",
                "huber_delta": 1.0,
                "standardize_targets": True,
            }
        )
    )
    with pytest.raises(UserError, match="task=classification only"):
        Teacher.of(distill_node(best), data, regression, torch.device("cpu"), tmp_path)
    _, task = digits_and_task(teacher_run)
    for settings, message in (
        ({"temperature": 0.0}, "distill.temperature=0.0 must be"),
        ({"alpha": 1.5}, "distill.alpha=1.5 must be from 0 to 1"),
        ({"weights": "best"}, "distill.weights='best' must be"),
    ):
        with pytest.raises(UserError, match=message):
            Teacher.of(distill_node(best, **settings), data, task, torch.device("cpu"), tmp_path)
    with pytest.raises(UserError, match="is a checkpoint of this run"):
        Teacher.of(distill_node(best), data, task, torch.device("cpu"), best.parent)
    data.num_classes = 3  # a student of three classes
    with pytest.raises(UserError, match=r"predicts other classes \(10\) than this data has \(3\)"):
        Teacher.of(distill_node(best), data, task, torch.device("cpu"), tmp_path)


def test_a_teacher_of_other_table_columns_is_refused_as_evaluate_refuses_them(tmp_path):
    from conftest import run_train, write_table

    write_table(tmp_path / "t.csv")
    table = [
        "data=csv",
        "data.path=t.csv",
        "data.target=kind",
        "trainer.max_epochs=1",
        "data.batch_size=32",
    ]
    run_train(tmp_path, *table, "data.features=[weight,size]", "run_name=teacher")
    result = run_train(
        tmp_path,
        *table,
        "data.features=[size,weight]",
        "run_name=student",
        "distill.teacher=checkpoints/teacher",
        ok=False,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1
        and "distill.teacher=checkpoints/teacher/best.pt was trained on table its columns"
        in errors[0]
        and "distil from it" in errors[0]
    ), result.stderr
    run_train(
        tmp_path,
        *table,
        "data.features=[weight,size]",
        "run_name=same",
        "distill.teacher=checkpoints/teacher",
    )


@pytest.mark.slow
def test_a_stop_mid_epoch_inside_swa_with_a_teacher_and_layer_decay_resumes_exactly(teacher_run):
    from conftest import assert_same_run, checkpoint, interrupt_and_resume, run_train

    best = teacher_run / "checkpoints" / "t" / "best.pt"
    run = [
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "model.hidden_sizes=[32]",
        "trainer.max_epochs=3",
        "trainer.swa.start=1",
        "trainer.swa.lr=0.001",
        "optim.layer_decay=0.8",
        f"distill.teacher={best}",
        "trainer.log_every_n_steps=5",
    ]
    run_train(teacher_run, *run, "run_name=straight")
    position = interrupt_and_resume(teacher_run, run, "cut", 45)  # 20 batches an epoch
    assert (position["epoch"], position["batch_in_epoch"]) == (2, 5)  # epoch 3: averaging
    assert_same_run(teacher_run, "straight", "cut")
    straight, cut = checkpoint(teacher_run, "straight"), checkpoint(teacher_run, "cut")
    assert all(torch.equal(v, cut["swa"]["model"][k]) for k, v in straight["swa"]["model"].items())
    assert straight["swa"]["updates"] == cut["swa"]["updates"] == 2


@pytest.mark.gpu
def test_on_cuda_a_bf16_student_distils_averages_and_exports(teacher_run, tmp_path):
    from conftest import run_evaluate, run_train

    best = teacher_run / "checkpoints" / "t" / "best.pt"
    run_train(
        tmp_path,
        "trainer.device=cuda",
        "precision=bf16",
        "model=cnn",
        "model.channels=[8,16]",
        "trainer.max_epochs=3",
        "trainer.swa.start=1",
        "optim.layer_decay=0.8",
        f"distill.teacher={best}",
        "run_name=g",
    )
    result = run_evaluate(
        tmp_path, "ckpt=checkpoints/g", "weights=swa", "device=cuda", "export=g.pt2", "runs=e"
    )
    assert "torch.export.load on batches of 1, 2 and 8" in " ".join(result.stdout.split())


@pytest.mark.parametrize("entry", ["swa", "ema"])
def test_an_edited_average_is_named_as_edited_not_as_missing(swa_run, tmp_path, entry):
    from conftest import run_evaluate

    from utils.checkpoint.load import load_checkpoint

    checkpoint = load_checkpoint(swa_run / "checkpoints" / "s" / "best.pt")
    checkpoint[entry] = [1, 2]  # what no torchloom version writes
    torch.save(checkpoint, tmp_path / "edited.pt")
    result = run_evaluate(
        swa_run,
        f"ckpt={tmp_path / 'edited.pt'}",
        f"weights={entry}",
        f"runs={tmp_path / 'runs'}",
        ok=False,
    )
    assert result.returncode == 2
    assert f"its {entry} entry is not what torchloom writes (was it edited?)" in result.stderr
    raw = run_evaluate(
        swa_run, f"ckpt={tmp_path / 'edited.pt'}", "weights=raw", f"runs={tmp_path / 'raw'}"
    )
    assert "test/acc" in raw.stdout
