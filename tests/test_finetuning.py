"""Fine-tuning: layer-wise LR decay (optim.layer_decay, utils/layers.py), knowledge
distillation from a checkpoint (distill.*), and weight averaging (trainer.swa, evaluate.py
average=top_k)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from utils.config import build
from utils.errors import UserError
from utils.optim import build_optimizer
from utils.schedulers import StepCounts

SCHEDULERS = {  # each with a warmup, so the warmup's factor is checked too
    "none": {"warmup_steps": 5},
    "step": {"warmup_steps": 5, "step_size": 1, "gamma": 0.5},
    "cosine": {"warmup_steps": 5, "min_lr_ratio": 0.1},
    "onecycle": {"warmup_steps": 5, "div_factor": 25.0, "final_div_factor": 1e4,
                 "anneal_strategy": "cos"},
    "plateau": {"warmup_steps": 5, "monitor": "val/loss", "mode": "min", "factor": 0.5,
                "patience": 0, "min_lr": 1e-4},
}  # fmt: skip


def adamw(**extra) -> OmegaConf:
    return OmegaConf.create({"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.01,
                             "weight_decay": 0.05, **extra})  # fmt: skip


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
    model.layer_groups = lambda: [("embed", [*model.embed.parameters(), model.scale]),
                                  ("body", model.body), ("head", model.out)]  # fmt: skip
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
