"""Debug modes, finders and the remaining pitfall guards, through the real ``train.py``."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import read_events, read_metrics, run_train, scalars

from data.batching.batches import Placement
from models.init import initialize
from models.mlp import mlp
from utils.diagnose.tune import RangeTest, find_batch_size, lr_range_test
from utils.errors import UserError
from utils.precision import Precision

FAULTY = ("model=mlp", "model._target_=signalling_model.faulty_mlp")


def test_fast_dev_run_runs_one_batch_of_each_split_and_saves_nothing(tmp_path):
    result = run_train(tmp_path, "debug=fast_dev_run", "run_name=dev")
    said = " ".join(result.stdout.split())
    assert "│ global_step │ 1 │" in said and "│ epochs │ 1 │" in said and "test/acc" in said
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "runs" / "dev").exists()  # a dry run keeps no folder either
    assert "a dry run keeps nothing:" in said and "runs/dev removed" in said
    assert "Traceback" not in result.stderr
    (tmp_path / "runs" / "kept").mkdir(parents=True)
    (tmp_path / "runs" / "kept" / "notes.txt").write_text("mine")
    run_train(tmp_path, "debug=fast_dev_run", "run_name=kept", "overwrite=true")
    assert (tmp_path / "runs" / "kept" / "notes.txt").read_text() == "mine"  # not its folder


def test_limit_takes_a_fraction_or_a_count_of_the_batches(tmp_path):
    run_train(tmp_path, "debug=limit", "trainer.max_epochs=2", "run_name=quarter")
    assert read_metrics(tmp_path / "runs" / "quarter")["global_step"] == 2 * (
        20 // 4
    )  # a quarter of 20
    run_train(tmp_path, "trainer.limit_train_batches=3", "trainer.max_epochs=2", "run_name=three")
    assert read_metrics(tmp_path / "runs" / "three")["global_step"] == 6
    bad = run_train(tmp_path, "trainer.limit_train_batches=1.5", ok=False)
    assert bad.returncode == 2 and "at most 1.0" in bad.stderr


def test_overfit_passes_on_a_working_model_and_fails_on_a_broken_one(tmp_path):
    run_train(tmp_path, "debug=overfit", "run_name=fits")
    assert read_metrics(tmp_path / "runs" / "fits")["train/loss"] < 0.05
    # A model whose output ignores its input cannot fit even four batches.
    broken = run_train(
        tmp_path, "debug=overfit", "model=mlp", "model._target_=signalling_model.constant", ok=False
    )
    assert broken.returncode == 2
    assert "overfit check failed" in broken.stderr and "Traceback" not in broken.stderr


def test_anomaly_mode_names_the_op_that_made_a_nan(tmp_path):
    result = run_train(
        tmp_path, "debug=anomaly", *FAULTY, ok=False, env={"FAULT": "nan", "FAULT_AT": "3"}
    )
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: autograd anomaly: Function '") and "returned nan" in error
    assert "several times slower" in result.stdout + result.stderr


def test_profile_writes_a_trace_and_a_table_of_top_operators(tmp_path):
    result = run_train(tmp_path, "debug=profile", "run_name=prof")
    assert "top operators by self CPU time" in result.stdout
    assert "aten::" in result.stdout
    assert list((tmp_path / "runs" / "prof" / "profile").glob("*.pt.trace.json"))


def test_shapes_prints_each_layer_and_exits(tmp_path):
    result = run_train(tmp_path, "debug=shapes", "model=cnn", "run_name=shapes")
    assert "layers for input [N, 1, 8, 8]" in result.stdout
    assert "Conv2d" in result.stdout and "[N, 10]" in result.stdout
    assert not (tmp_path / "runs" / "shapes" / "metrics.json").exists()


def test_the_lr_finder_suggests_a_sane_lr_and_leaves_the_model_as_it_was(tmp_path):
    result = run_train(tmp_path, "tune=lr", "run_name=lr")
    suggested = float(result.stdout.split("suggested optim.lr=")[1].split(";")[0])
    assert 1e-4 <= suggested <= 1e-1  # AdamW on an MLP: around 1e-3
    assert (tmp_path / "runs" / "lr" / "lr_finder.png").stat().st_size > 1000
    assert "tune/smoothed_loss" in scalars(tmp_path / "runs" / "lr")
    assert not (tmp_path / "runs" / "lr" / "metrics.json").exists()  # nothing was trained


def test_lr_range_test_restores_weights_and_optimizer():
    from data.arrays.synthetic import load_synthetic

    data = load_synthetic(
        num_samples=512,
        shape=[1, 8, 8],
        num_classes=4,
        noise=0.5,
        val_size=64,
        test_size=64,
        seed=0,
        batch_size=32,
        eval_batch_size=64,
        mean=[0.5],
        std=[0.29],
        augment={"crop_padding": 0, "horizontal_flip": False},
    )
    model = mlp((1, 8, 8), 4, [16], 0.0, "default")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    batches = data.batches("train", Placement(torch.device("cpu")), seed=0)
    precision = Precision("float32", torch.device("cpu"))
    lrs, losses, suggested = lr_range_test(
        model, optimizer, batches, precision, F.cross_entropy, RangeTest(50)
    )
    assert len(lrs) == len(losses) > 10 and lrs == sorted(lrs)
    assert math.isfinite(suggested) and lrs[0] <= suggested <= lrs[-1]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert optimizer.param_groups[0]["lr"] == 1e-3 and not optimizer.state


def test_the_batch_size_finder_doubles_then_bisects_under_a_memory_limit(tmp_path):
    # The model raises CUDA's out-of-memory error for batches above 300 samples.
    result = run_train(
        tmp_path, "tune=batch_size", *FAULTY, env={"FAULT": "oom_above", "FAULT_AT": "300"}
    )
    assert "data.batch_size=300" in result.stdout.replace("\n", "")
    tried = [
        int(line.split()[1].rstrip(":"))
        for line in result.stdout.splitlines()
        if line.startswith("batch ")
    ]
    assert tried[:9] == [1, 2, 4, 8, 16, 32, 64, 128, 256] and 512 in tried


def test_find_batch_size_caps_at_the_limit_and_reports_nothing_fits():
    assert find_batch_size(lambda n: True, start=1, limit=1000) == 1000
    assert find_batch_size(lambda n: n <= 37, start=1, limit=1000) == 37
    assert find_batch_size(lambda n: False, start=1, limit=1000) == 0


def test_a_forgotten_super_init_is_translated_into_its_fix(tmp_path):
    result = run_train(
        tmp_path, "model=mlp", "model._target_=signalling_model.forgot_super_init", ok=False
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "make super().__init__() the first line" in result.stderr


@pytest.mark.parametrize("scheme", ["xavier", "kaiming", "orthogonal"])
def test_model_init_schemes_set_weights_and_zero_biases(scheme):
    torch.manual_seed(0)
    default = mlp((1, 8, 8), 10, [32], 0.0, "default")
    torch.manual_seed(0)
    model = initialize(mlp((1, 8, 8), 10, [32], 0.0, "default"), scheme)
    linear = model[1]
    assert not torch.equal(linear.weight, default[1].weight)
    assert torch.count_nonzero(linear.bias) == 0
    if scheme == "orthogonal":  # rows orthonormal
        gram = linear.weight @ linear.weight.T
        torch.testing.assert_close(gram, torch.eye(32), atol=1e-5, rtol=0)
    with pytest.raises(UserError, match=r"model\.init='uniformish'"):
        initialize(model, "uniformish")


def test_a_grid_of_training_samples_and_per_layer_grad_norms_reach_tensorboard(tmp_path):
    run_train(
        tmp_path,
        "trainer.max_epochs=1",
        "trainer.log_every_n_steps=5",
        "trainer.log_grad_norms=per_layer",
        "run_name=seen",
    )
    events = read_events(tmp_path / "runs" / "seen")
    assert "train/samples" in events.Tags()["images"]
    logged = scalars(tmp_path / "runs" / "seen")
    assert {"grad_norm/1.weight", "grad_norm/4.bias"} <= set(logged)
    assert len(logged["grad_norm/1.weight"]) == 20 // 5


def test_the_sample_grid_is_torchvisions_make_grid_without_torchvision():
    from torchvision.utils import make_grid

    from utils.run.report import image_grid

    for images in (torch.rand(16, 3, 8, 8), torch.rand(13, 1, 5, 7)):
        assert torch.equal(image_grid(images, columns=8), make_grid(images, nrow=8, pad_value=1.0))
