"""The training recipe: an EMA of the weights (trainer.ema), MixUp/CutMix (data.augment.*) and
label smoothing (task.label_smoothing), with early stopping. Each is a pure function of the
run's seed and position, so a run interrupted anywhere — mid-epoch, at the EMA's warm-up end, at
mix_off_epoch, one validation before an early stop — resumes bit for bit; under two processes
every rank holds the same EMA."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import (
    EVALUATE,
    HELPERS,
    interrupt_and_resume,
    read_metrics,
    run_python,
    run_train,
    scalars,
    torchrun,
)

from data.augmentation.mixing import Draw, MixedBatches, Mixing, mixed
from data.batching.batches import TensorBatches
from utils.checkpoint.load import load_checkpoint
from utils.errors import UserError
from utils.fit.ema import WeightAverage
from utils.run.resume_changes import config_changes
from utils.tasks import ClassificationLoss

# 160 samples in batches of 8, 2 micro-batches a step: 20 micro-batches and 10 steps an epoch.
# EMA decay 0.75 with warm-up: (1+n)/(10+n) reaches 0.75 after n = 26 updates (in epoch 3).
# MixUp and CutMix in the first 2 epochs. Early stopping: the val loss never falls by 10, so
# validations 2 and 3 do not improve and patience=2 ends the run after epoch 3 of 5.
RECIPE = [
    "model=mlp",
    "model._target_=signalling_model.mlp",
    "model.hidden_sizes=[32]",
    "model.dropout=0.3",
    "data=synthetic",
    "data.shape=[1,8,8]",
    "data.num_samples=160",
    "data.val_size=32",
    "data.test_size=32",
    "data.batch_size=8",
    "data.augment.crop_padding=1",
    "data.augment.mixup_alpha=0.4",
    "data.augment.cutmix_alpha=1.0",
    "data.augment.mix_prob=0.8",
    "data.augment.mix_off_epoch=2",
    "task.label_smoothing=0.1",
    "trainer.ema.decay=0.75",
    "trainer.accumulate_grad_batches=2",
    "trainer.log_every_n_steps=3",
    "trainer.max_epochs=5",
    "trainer.monitor=val/loss",
    "trainer.early_stopping.patience=2",
    "trainer.early_stopping.min_delta=10",
]


def last(cwd, run_name: str) -> dict:
    return load_checkpoint(cwd / "checkpoints" / run_name / "last.pt")


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("recipe")
    run_train(cwd, *RECIPE, "run_name=straight")
    return cwd


def test_the_recipe_run_stops_early_and_judges_the_ema(straight):
    metrics = read_metrics(straight / "runs" / "straight")
    assert metrics["stopped_early_at_epoch"] == 3 and metrics["epochs"] == 3
    checkpoint = last(straight, "straight")
    assert checkpoint["ema"]["updates"] == checkpoint["global_step"] == 30
    ema, raw = checkpoint["ema"]["model"], checkpoint["model"]
    assert ema.keys() == raw.keys() and any(not torch.equal(ema[k], raw[k]) for k in raw)


def test_the_test_figures_are_the_emas_and_evaluate_chooses_with_weights(tmp_path):
    run_train(tmp_path, "trainer.max_epochs=2", "trainer.ema.decay=0.9", "run_name=a")
    test_loss = f"{read_metrics(tmp_path / 'runs' / 'a')['test/loss']:.4f}"
    best = "ckpt=checkpoints/a/best.pt"
    auto = run_python(tmp_path, str(EVALUATE), best, "runs=eval").stdout
    ema = run_python(tmp_path, str(EVALUATE), best, "weights=ema", "runs=eval").stdout
    raw = run_python(tmp_path, str(EVALUATE), best, "weights=raw", "runs=eval").stdout
    assert test_loss in auto and test_loss in ema  # the EMA, by default when present
    assert test_loss not in raw and "test/loss" in raw


def test_weights_auto_means_what_training_judged_when_the_ema_was_not(tmp_path):
    # trainer.ema.evaluate=false: training validated and tested the raw weights; so does auto.
    run_train(
        tmp_path,
        "trainer.max_epochs=2",
        "trainer.ema.decay=0.9",
        "trainer.ema.evaluate=false",
        "run_name=r",
    )
    test_loss = f"{read_metrics(tmp_path / 'runs' / 'r')['test/loss']:.4f}"
    best = "ckpt=checkpoints/r/best.pt"
    auto = run_python(tmp_path, str(EVALUATE), best, "runs=eval").stdout
    ema = run_python(tmp_path, str(EVALUATE), best, "weights=ema", "runs=eval").stdout
    assert test_loss in auto and test_loss not in ema


@pytest.mark.parametrize(
    ("at", "epoch", "batch_in_epoch"),
    [
        (26, 1, 6),  # mid-epoch 2, while batches are mixed
        (40, 2, 0),  # the end of epoch 2: mix_off_epoch, and one validation before the stop
        (52, 2, 12),  # right after update 26: the end of the EMA's warm-up
    ],
    ids=["mid-epoch-mixing", "mix-off-and-early-stop", "ema-warmup-end"],
)
def test_an_interrupted_recipe_run_resumes_bit_identically(straight, at, epoch, batch_in_epoch):
    name = f"cut_at_{at}"
    position = interrupt_and_resume(straight, RECIPE, name, at)
    assert (position["epoch"], position["batch_in_epoch"]) == (epoch, batch_in_epoch)
    a, b = last(straight, "straight"), last(straight, name)
    assert a["global_step"] == b["global_step"] and a["ema"]["updates"] == b["ema"]["updates"]
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
        assert torch.equal(a["ema"]["model"][key], b["ema"]["model"][key]), key
    assert a["early_stopping"] == b["early_stopping"]
    logged_a, logged_b = scalars(straight / "runs" / "straight"), scalars(straight / "runs" / name)
    for tag in ("train/loss", "val/loss", "val/acc", "test/loss"):
        assert logged_a[tag] == logged_b[tag], tag
    metrics_a, metrics_b = (read_metrics(straight / "runs" / n) for n in ("straight", name))
    assert metrics_a["stopped_early_at_epoch"] == metrics_b["stopped_early_at_epoch"] == 3


@pytest.mark.slow
def test_two_processes_hold_the_same_ema(tmp_path):
    dump = tmp_path / "ema"
    torchrun(
        tmp_path,
        *RECIPE[:3],
        "trainer.max_epochs=2",
        "trainer.ema.decay=0.9",
        "data.augment.mixup_alpha=0.4",
        "run_name=ddp",
        env={"EMA_DUMP": str(dump)},
        script=HELPERS / "ema_per_rank.py",
    )
    rank0, rank1 = (torch.load(dump / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    assert rank0["updates"] == rank1["updates"] > 0
    for key, tensor in rank0["model"].items():
        assert torch.equal(tensor, rank1["model"][key]), key
    saved = last(tmp_path, "ddp")["ema"]["model"]
    assert all(torch.equal(saved[k], v) for k, v in rank0["model"].items())


# --- EMA -----------------------------------------------------------------------------------


def test_ema_update_is_the_documented_average_with_warmup_and_copied_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ema = WeightAverage(model, decay=0.9, warmup=True)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
            model[1].running_mean.add_(1.0)
        decay = min(0.9, (1 + n) / (10 + n))
        assert ema.decay_now() == decay
        ema.update()
        expected = [
            decay * e + (1 - decay) * p.detach()
            for e, p in zip(expected, model.parameters(), strict=True)
        ]
    for got, want in zip(ema.module.parameters(), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(ema.module[1].running_mean, model[1].running_mean)
    assert ema.module[1].num_batches_tracked == model[1].num_batches_tracked
    assert WeightAverage(model, decay=0.9, warmup=False).decay_now() == 0.9
    with pytest.raises(UserError, match=r"trainer.ema.decay=1.0 must be above 0 and below 1"):
        WeightAverage(model, decay=1.0, warmup=True)


@pytest.mark.parametrize("ema", [{"model": {}, "updates": True}, {"updates": 3}, "ema"])
def test_an_edited_ema_entry_is_refused_in_one_line(tmp_path, ema):
    run_train(tmp_path, "trainer.max_epochs=1", "trainer.ema.decay=0.9", "run_name=a")
    path = tmp_path / "checkpoints" / "a" / "last.pt"
    checkpoint = load_checkpoint(path)
    checkpoint["ema"] = ema
    torch.save(checkpoint, path)
    before = path.read_bytes()
    result = run_train(
        tmp_path,
        "trainer.max_epochs=2",
        "trainer.ema.decay=0.9",
        "run_name=a",
        "resume=auto",
        ok=False,
    )
    assert result.returncode != 0 and "error:" in result.stderr
    assert "ema" in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
    assert path.read_bytes() == before  # nothing saved is lost


def test_ema_turned_on_at_a_resume_starts_at_the_resumed_weights(tmp_path):
    run_train(tmp_path, "trainer.max_epochs=1", "run_name=a")
    no_ema = run_python(
        tmp_path, str(EVALUATE), "ckpt=checkpoints/a/best.pt", "weights=ema", "runs=eval", ok=False
    )
    assert "holds no EMA weights" in no_ema.stderr and no_ema.returncode != 0
    steps_before = last(tmp_path, "a")["global_step"]
    result = run_train(
        tmp_path, "trainer.max_epochs=2", "trainer.ema.decay=0.9", "run_name=a", "resume=auto"
    )
    assert "the checkpoint holds no EMA; it starts at the resumed weights" in result.stdout
    checkpoint = last(tmp_path, "a")
    assert checkpoint["ema"]["updates"] == checkpoint["global_step"] - steps_before > 0


# --- MixUp / CutMix and label smoothing ------------------------------------------------------


def batches_of(n: int, batch_size: int, mixing: Mixing, seed: int = 0) -> MixedBatches:
    from data.batching.batches import BatchPlan, BatchTransform
    from data.batching.splits import TensorSplit

    generator = torch.Generator().manual_seed(1)
    split = TensorSplit(
        torch.randint(0, 256, (n, 1, 6, 6), dtype=torch.uint8, generator=generator),
        torch.randint(0, 5, (n,), generator=generator),
    )
    plan = BatchPlan(batch_size=batch_size, train=True, seed=seed)
    transform = BatchTransform([0.5], [0.25], torch.device("cpu"))
    return MixedBatches(TensorBatches(split, plan, transform), mixing, 5, plan)


BOTH = Mixing(mixup_alpha=0.4, cutmix_alpha=1.0, mix_prob=0.7, mix_switch_prob=0.5, mix_off_epoch=3)


@pytest.mark.parametrize("batch_size", [1, 7, 8])
def test_mixing_is_a_pure_function_of_seed_epoch_and_batch_for_any_batch_size(batch_size):
    batches = batches_of(45, batch_size, BOTH)
    whole = list(batches.epoch(1))
    again = list(batches_of(45, batch_size, BOTH).epoch(1, start=3))
    assert len(again) == len(whole) - 3
    for (x, y), (x2, y2) in zip(whole[3:], again, strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    kinds = {y.is_floating_point() for _, y in whole}
    if batch_size > 1:
        assert kinds == {True, False}  # mix_prob=0.7: some batches mixed, some not
    for _, y in whole:  # the last batch holds the 45 % batch_size left (when 2 or more)
        if y.is_floating_point():
            assert y.shape[1] == 5 and len(y) in (batch_size, 45 % batch_size)
            torch.testing.assert_close(y.sum(dim=1), torch.ones(len(y)))
    assert not any(y.is_floating_point() for _, y in batches.epoch(3))  # mix_off_epoch=3


def test_cutmix_lambda_is_the_share_of_pixels_kept_and_mixup_blends():
    images = torch.zeros(4, 1, 10, 10)
    images[1:] = 1.0  # image 0 is black, the others white
    labels, perm = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    mixing = Mixing(0.0, 1.0, 1.0, 0.5, None)
    draw = mixing.draw(seed=5, image_size=(10, 10))
    assert draw.kind == "cutmix"
    out, targets = mixed(images, labels, draw, perm, 4)
    pasted = out[0].mean().item()  # white pixels pasted into the black image
    assert math.isclose(1 - pasted, draw.lam, abs_tol=1e-6)
    assert math.isclose(targets[0, 0].item(), draw.lam, abs_tol=1e-6)
    assert math.isclose(targets[0, 1].item(), 1 - draw.lam, abs_tol=1e-6)
    out, targets = mixed(images, labels, Draw("mixup", 0.3), perm, 4)
    torch.testing.assert_close(out[0], torch.full((1, 10, 10), 0.7))
    torch.testing.assert_close(targets[0], torch.tensor([0.3, 0.7, 0.0, 0.0]))


def test_soft_targets_are_smoothed_once():
    loss = ClassificationLoss(label_smoothing=0.1, weight=None, classes=4)
    labels, perm = torch.tensor([0, 1, 2, 3]), torch.tensor([1, 0, 3, 2])
    _, targets = mixed(torch.zeros(4, 1, 2, 2), labels, Draw("mixup", 0.7), perm, 4)
    smoothed = loss.smoothed(targets)
    torch.testing.assert_close(smoothed.sum(dim=1), torch.ones(4))
    torch.testing.assert_close(smoothed.max(dim=1).values, torch.full((4,), 0.9 * 0.7 + 0.1 / 4))
    # An unmixed target as probabilities gives the hard label's smoothed loss: once, not twice.
    logits = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    hard = loss(logits, labels)
    soft = loss(logits, F.one_hot(labels, 4).float())
    torch.testing.assert_close(soft, hard)
    twice = F.cross_entropy(
        logits, loss.smoothed(F.one_hot(labels, 4).float()), label_smoothing=0.1
    )
    assert not torch.isclose(twice, hard)


def test_validation_and_test_batches_are_never_mixed(tmp_path):
    from conftest import CONF
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from data.batching.batches import Placement

    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["data.augment.mixup_alpha=0.4"])
    data = instantiate(cfg.data)
    batches = data.batches_for(Placement(torch.device("cpu")), seed=0)
    assert isinstance(batches.train, MixedBatches)
    assert not isinstance(batches.val, MixedBatches) and not isinstance(
        batches.test(), MixedBatches
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "data.augment.mix_prob=1.5",
            "data.augment.mix_prob=1.5 is out of range: it must be between 0 and 1",
        ),
        ("data.augment.mixup_alpha=-1", "data.augment.mixup_alpha=-1 is out of range"),
        ("data.augment.mix_off_epoch=0", "data.augment.mix_off_epoch=0 is out of range"),
        ("trainer.ema.decay=1", "trainer.ema.decay=1.0 is out of range"),
        ("task.label_smoothing=1.0", "task.label_smoothing=1.0 is out of range"),
        ("task.class_weights=[1,2]", "task.class_weights has 2 values; digits has 10 classes"),
        (
            "task.class_weights=[1,2,3,4,5,6,7,8,9,0]",
            "task.class_weights=[1, 2, 3, 4, 5, 6, 7, 8, 9, 0] is out of range",
        ),
    ],
)
def test_bad_recipe_values_fail_in_one_line_naming_the_key(tmp_path, override, message):
    result = run_train(tmp_path, override, "trainer.max_epochs=1", ok=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr[-800:]
    assert "Traceback" not in result.stderr and not list(tmp_path.rglob("*.pt"))


def test_auto_class_weights_are_the_inverse_train_frequency_and_logged(tmp_path):
    result = run_train(tmp_path, "task.class_weights=auto", "trainer.max_epochs=1")
    line = next(x for x in result.stdout.splitlines() if x.startswith("class weights"))
    weights = [float(w) for w in line.split(": ")[1].split()]
    assert len(weights) == 10 and math.isclose(sum(weights) / 10, 1.0, rel_tol=0.01)
    assert "train/loss is the cross-entropy with class weights" in result.stdout


def test_a_checkpoint_from_before_the_recipe_keys_resumes_with_no_change_reported():
    now = {
        "data": {
            "augment": {
                "crop_padding": 0,
                "mixup_alpha": 0.0,
                "cutmix_alpha": 0.0,
                "mix_prob": 1.0,
                "mix_switch_prob": 0.5,
                "mix_off_epoch": None,
            }
        },
        "task": {
            "_target_": "utils.tasks.classification",
            "label_smoothing": 0.0,
            "class_weights": None,
        },
        "trainer": {"ema": {"decay": None, "warmup": True, "evaluate": True}},
    }
    before = {"data": {"augment": {"crop_padding": 0}}, "trainer": {}}
    changes = config_changes(before, now)
    assert changes.never == changes.need_allow == changes.applied == []
    mixed_now = {**now, "data": {"augment": {**now["data"]["augment"], "mixup_alpha": 0.2}}}
    assert config_changes(before, mixed_now).need_allow == ["data.augment.mixup_alpha: 0.0 -> 0.2"]


@pytest.mark.parametrize("name", ["none", "step", "cosine", "onecycle", "plateau"])
def test_warmup_epochs_are_that_many_epochs_of_warmup_steps(name):
    """scheduler.warmup_epochs (timm's --warmup-epochs) is warmup_epochs × the steps of an
    epoch of warmup, in every schedule: the LRs step by step are those of warmup_steps."""
    import utils.schedulers as schedules
    from utils.schedulers import StepCounts

    extra = {
        "none": {},
        "step": {"step_size": 2, "gamma": 0.5},
        "cosine": {"min_lr_ratio": 0.0},
        "onecycle": {"div_factor": 25.0, "final_div_factor": 1e4, "anneal_strategy": "cos"},
        "plateau": {
            "monitor": "val/loss",
            "mode": "min",
            "factor": 0.1,
            "patience": 1,
            "min_lr": 0,
        },
    }[name]

    def lrs(**warmup):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        schedule = getattr(schedules, name)(**warmup, **extra)(optimizer, StepCounts(5, 40))
        seen = []
        for _ in range(20):
            optimizer.step()
            schedule.after_optimizer_step()
            seen.append(optimizer.param_groups[0]["lr"])
        return seen

    assert lrs(warmup_steps=0, warmup_epochs=2) == lrs(warmup_steps=10)
    assert lrs(warmup_steps=0, warmup_epochs=2) != lrs(warmup_steps=3)
    assert len(lrs(warmup_steps=0)) == 20  # no warmup: onecycle rises for one step, no error
