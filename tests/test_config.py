"""Every option of every config group composes through Hydra and builds what it names."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch
from conftest import CONF, write_mnist
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf.errors import ValidationError

from data.batching.batches import Placement
from utils.errors import UserError
from utils.model.checks import check_forward
from utils.model.optim import build_optimizer
from utils.preflight.train import check_config
from utils.schedulers import StepCounts

CPU = torch.device("cpu")


def options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF / group).glob("*.yaml"))


def make_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=list(overrides))


def test_each_group_has_the_options_the_readme_promises():
    assert options("model") == [
        "auto",
        "cnn",
        "cnn1d",
        "gpt",
        "hf",
        "mlp",
        "resnet18",
        "tabular",
        "text_bag",
        "text_transformer",
        "timm",
        "torchvision",
    ]
    assert options("data") == [
        "cifar10",
        "corpus",
        "csv",
        "digits",
        "fashion_mnist",
        "image_csv",
        "imagefolder",
        "mnist",
        "parquet",
        "synthetic",
        "tensors",
        "text",
        "torchvision",
    ]
    assert options("task") == ["causal_lm", "classification", "multilabel", "regression"]
    assert options("optim") == ["adam", "adamw", "sgd"]
    assert options("scheduler") == ["cosine", "none", "onecycle", "plateau", "step"]
    assert options("precision") == ["auto", "bf16", "fp16", "fp32"]


# cnn1d: test_sequences; tabular: below (rows only); texts' models: test_text, test_hf
IMAGE_MODELS = [
    name
    for name in options("model")
    if name not in ("cnn1d", "tabular", "text_bag", "text_transformer", "hf", "gpt")
]


@pytest.mark.parametrize("model", IMAGE_MODELS)
@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 32, 32)])
def test_every_model_builds_for_every_image_size(model, shape):
    cfg = make_config(f"model={model}")
    net = instantiate(cfg.model, input_shape=shape, num_classes=10)
    check_forward(net, torch.zeros(2, *shape), 10)


@pytest.mark.parametrize("embedding", ["auto", "none", "linear", "periodic", "piecewise"])
def test_the_tabular_model_builds_for_rows_and_refuses_images(embedding):
    cfg = make_config("model=tabular", f"model.embedding={embedding}")
    check_forward(instantiate(cfg.model, input_shape=(7,), num_classes=3), torch.zeros(2, 7), 3)
    with pytest.raises(Exception, match=r"model=tabular takes a table.s rows"):  # via Hydra
        instantiate(cfg.model, input_shape=(1, 8, 8), num_classes=3)


@pytest.mark.parametrize("shape", [(1, 8), (3, 128), (40,)])
def test_cnn1d_builds_for_every_sequence_length(shape):
    net = instantiate(make_config("model=cnn1d").model, input_shape=shape, num_classes=10)
    check_forward(net, torch.zeros(2, *shape), 10)


# texts: test_text; a corpus: test_language_models
@pytest.mark.parametrize(
    "data", [name for name in options("data") if name not in ("text", "corpus")]
)
def test_every_dataset_builds(
    data, mnist_root, fashion_root, cifar_root, imagefolder_root, tmp_path
):
    lines = ["a,b,label"] + [f"{i % 7},{i % 3},{'xy'[i % 2]}" for i in range(60)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    torch.save({"x": torch.randn(60, 5), "y": torch.arange(60) % 3}, tmp_path / "a.pt")
    (tmp_path / "m.csv").write_text(
        "path,label\n"
        + "".join(
            f"{Path(p).relative_to(imagefolder_root)},{Path(p).parent.name}\n"
            for p in sorted(map(str, imagefolder_root.glob("train/*/*.png")))
        )
    )
    write_mnist(tmp_path, "KMNIST")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = {"a": [float(i % 7) for i in range(60)], "label": ["xy"[i % 2] for i in range(60)]}
    pq.write_table(pa.table(rows), tmp_path / "t.parquet", row_group_size=8)
    roots = {
        "parquet": [f"data.path={tmp_path / 't.parquet'}", "data.num_workers=0"],
        "csv": [f"data.path={tmp_path / 't.csv'}", "data.target=label"],
        "image_csv": [
            f"data.root={imagefolder_root}",
            f"data.manifest={tmp_path / 'm.csv'}",
            "data.num_workers=0",
            f"data.cache_dir={tmp_path / 'cache'}",
        ],
        "torchvision": ["data.name=kmnist", f"data.root={tmp_path}", "data.val_size=16"],
        "tensors": [f"data.path={tmp_path / 'a.pt'}"],
        "mnist": ["data.root=" + str(mnist_root), "data.val_size=16"],
        "fashion_mnist": ["data.root=" + str(fashion_root), "data.val_size=16"],
        "cifar10": ["data.root=" + str(cifar_root), "data.val_size=20"],
        "imagefolder": ["data.root=" + str(imagefolder_root), "data.num_workers=0"],
    }
    extra = roots.get(data, []) + (
        ["data.download=false"]
        if data in ("mnist", "fashion_mnist", "cifar10", "torchvision")
        else []
    )
    cfg = make_config(f"data={data}", "data.batch_size=8", *extra)
    check_config(cfg)
    built = instantiate(cfg.data)
    images, labels = next(built.batches("train", Placement(CPU), seed=0).epoch(0))
    assert images.shape == (8, *built.input_shape) and images.dtype == torch.float32
    assert labels.dtype == torch.long and int(labels.max()) < built.num_classes


@pytest.mark.parametrize("optim", options("optim"))
def test_every_optimizer_builds_with_no_decay_on_bias_and_norm(optim):
    cfg = make_config(f"optim={optim}", "model=cnn")
    net = instantiate(cfg.model, input_shape=(1, 8, 8), num_classes=10)
    optimizer = build_optimizer(net, cfg.optim)
    assert optimizer.__class__.__name__.lower() == optim
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == cfg.optim.weight_decay and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"])  # conv and linear weights only
    assert all(p.ndim == 1 for p in no_decay["params"])  # biases, BatchNorm weights and biases
    everything = build_optimizer(
        net, make_config(f"optim={optim}", "optim.decay_bias_and_norm=true").optim
    )
    assert len(everything.param_groups) == 1


def lrs(scheduler: str, *overrides: str, steps: int = 100, steps_per_epoch: int = 10, metric=None):
    cfg = make_config(f"scheduler={scheduler}", "optim.lr=1.0", *overrides)
    net = torch.nn.Linear(2, 2)
    optimizer = build_optimizer(net, cfg.optim)
    schedule = instantiate(cfg.scheduler)(optimizer, StepCounts(steps_per_epoch, steps))
    seen = []
    for step in range(steps):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.after_optimizer_step()
        if (step + 1) % steps_per_epoch == 0:
            schedule.after_validation({"val/acc": metric(step) if metric else 0.5, "val/loss": 1.0})
    return seen


def test_warmup_is_linear_in_optimizer_steps():
    seen = lrs("cosine", "scheduler.warmup_steps=4")
    assert seen[:5] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_cosine_decays_to_the_floor_by_the_last_step():
    seen = lrs("cosine", "scheduler.min_lr_ratio=0.1")
    assert seen[0] == 1.0 and seen[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in itertools.pairwise(seen))


def test_step_decays_at_epoch_boundaries():
    seen = lrs("step", "scheduler.step_size=3", "scheduler.gamma=0.5")
    assert seen[29] == 1.0 and seen[30] == 0.5 and seen[60] == 0.25


def test_onecycle_peaks_at_the_configured_lr():
    seen = lrs("onecycle", "scheduler.warmup_steps=30")
    assert max(seen) == pytest.approx(1.0) and seen.index(max(seen)) == 30
    assert seen[0] == pytest.approx(1.0 / 25) and seen[-1] < 1e-3


def test_plateau_reduces_after_patience_validations_without_improvement():
    seen = lrs(
        "plateau", "scheduler.patience=1", "scheduler.factor=0.5", "scheduler.warmup_steps=5"
    )
    assert seen[:6] == pytest.approx([1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1.0])
    # Constant metric: improves once, then each 2nd flat validation halves the LR.
    assert seen[29] == 1.0 and seen[30] == 0.5 and seen[49] == 0.5 and seen[50] == 0.25


def test_none_is_constant():
    assert set(lrs("none")) == {1.0}


@pytest.mark.parametrize(
    "scheduler, overrides",
    [
        ("cosine", ["scheduler.warmup_steps=7", "scheduler.min_lr_ratio=0.05"]),
        ("step", ["scheduler.step_size=2", "scheduler.warmup_steps=3"]),
        ("none", ["scheduler.warmup_steps=4"]),
        ("plateau", ["scheduler.warmup_steps=6"]),
    ],
)
def test_a_multiplier_schedule_steps_as_torchs_lambdalr_does(scheduler, overrides):
    """The schedules set each LR after every optimizer step themselves (torch's LambdaLR.step()
    costs a small model about 1% of its step): the LRs of every group and the state a
    checkpoint stores equal, step for step, those of LambdaLR.step() on the same schedule."""
    from torch.optim.lr_scheduler import LambdaLR

    def run(torch_steps: bool):
        cfg = make_config(f"scheduler={scheduler}", "optim.lr=0.3", *overrides)
        net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.LayerNorm(2))
        optimizer = build_optimizer(net, cfg.optim)  # two groups: decayed and not
        schedule = instantiate(cfg.scheduler)(optimizer, StepCounts(5, 40))
        assert isinstance(schedule.per_step, LambdaLR)
        seen = []
        for _ in range(40):
            optimizer.step()
            if not torch_steps:
                schedule.after_optimizer_step()
            elif schedule.plateau is None or schedule.per_step.last_epoch < schedule.warmup_steps:
                schedule.per_step.step()  # after_optimizer_step's rule, on torch's step()
            seen.append([group["lr"] for group in optimizer.param_groups])
        return seen, schedule.state_dict(), schedule.per_step.get_last_lr()

    own, reference = run(torch_steps=False), run(torch_steps=True)
    assert len(own[0][0]) == 2 and own == reference  # exactly, not approximately


@pytest.mark.parametrize("precision", options("precision"))
def test_every_precision_builds_on_cpu(precision):
    built = instantiate(make_config(f"precision={precision}").precision, device=CPU)
    assert built.scaler.is_enabled() == (built.dtype == torch.float16)
    with built.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == (torch.float32 if precision in ("fp32", "auto") else built.dtype)


def test_a_typo_in_an_override_fails_at_composition_naming_the_key():
    with pytest.raises(ConfigCompositionException, match="max_epoch"):
        make_config("trainer.max_epoch=3")


def test_a_wrong_type_fails_at_composition():
    with pytest.raises((ConfigCompositionException, ValidationError), match="accumulate_grad"):
        make_config("trainer.accumulate_grad_batches=ten")
    # max_epochs also takes auto, so a word is refused by the pre-flight, in one line.
    with pytest.raises(UserError, match=r"trainer\.max_epochs='ten' must be a whole number"):
        check_config(make_config("trainer.max_epochs=ten"))


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.batch_size=0", "data.batch_size"),
        ("trainer.max_epochs=-1", "trainer.max_epochs"),
        ("optim.lr=0", "optim.lr"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches"),
        ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val"),
        ("trainer.monitor_mode=up", "trainer.monitor_mode"),
        ("data.batch_size=abc", "data.batch_size"),
    ],
)
def test_values_out_of_range_are_refused_before_any_data_is_loaded(override, key):
    with pytest.raises(UserError, match=key.replace(".", r"\.")):
        check_config(make_config(override))


def test_the_default_config_is_valid_and_resolves():
    cfg = make_config()
    check_config(cfg)
    assert (
        cfg.data._target_ == "data.images.digits.load_digits"
        and cfg.model._target_ == "models.auto.auto"
    )
    assert cfg.trainer.monitor == "val/acc" and cfg.trainer.monitor_mode == "auto"
    assert not math.isnan(cfg.optim.lr)
