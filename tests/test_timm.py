"""model=timm: any timm architecture by name, built for the data's channels and classes,
trained, resumed and evaluated as any model; timm's own saved weights load by timm's key names
and give timm's logits; a stored checkpoint may name timm only through this builder."""

from __future__ import annotations

import pytest
import torch
from conftest import error_line, read_metrics, run_evaluate, run_train

timm = pytest.importorskip("timm")

TINY = ("model=timm", "model.name=test_resnet", "trainer.max_epochs=2")


def test_a_timm_model_by_name_trains_on_the_data_and_evaluates(tmp_path):
    result = run_train(tmp_path, *TINY, "model.drop_path_rate=0.1", "run_name=t")
    assert "test/acc" in read_metrics(tmp_path / "runs/t")
    run_evaluate(tmp_path, "ckpt=checkpoints/t")
    assert "Traceback" not in result.stderr


def test_timm_weights_saved_by_timm_load_by_its_key_names_and_give_its_logits(tmp_path):
    from models.timm_models import timm_model

    source = timm.create_model("test_resnet", num_classes=10)  # RGB, as timm's weights are
    path = tmp_path / "weights.pth"
    torch.save(source.state_dict(), path)
    loaded = timm_model((3, 8, 8), 10, "test_resnet", str(path), 0.0, 0.0)
    batch = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    source.eval(), loaded.eval()
    torch.testing.assert_close(loaded(batch), source(batch), rtol=0, atol=0)
    grey = timm_model((1, 8, 8), 4, "test_resnet", str(path), 0.0, 0.0)  # the digits' shape
    assert grey.get_classifier().out_features == 4
    summed = source.conv1[0].weight.sum(dim=1, keepdim=True)  # timm's adapt_input_conv
    torch.testing.assert_close(grey.conv1[0].weight, summed)


def test_a_checkpoint_from_timm_weights_evaluates_without_the_weights_file(tmp_path):
    source = timm.create_model("test_resnet", num_classes=10)
    torch.save(source.state_dict(), tmp_path / "weights.pth")
    run_train(tmp_path, *TINY, "trainer.max_epochs=1", "model.pretrained=weights.pth", "run_name=t")
    (tmp_path / "weights.pth").unlink()  # the checkpoint's weights replace it: never read again
    assert "test/acc" in run_evaluate(tmp_path, "ckpt=checkpoints/t").stdout


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.name=resnet_nineteen", "is not a timm model"),
        ("model.pretrained=missing.pth", "no such file"),
        ("model.drop_path_rate=1.5", "model.drop_path_rate"),
    ],
)
def test_a_wrong_timm_setting_is_one_line(tmp_path, override, said):
    result = run_train(tmp_path, *TINY, override, ok=False)
    assert result.returncode == 2 and said in error_line(result)


def test_a_stored_checkpoint_may_name_timm_only_through_its_builder(tmp_path):
    run_train(tmp_path, *TINY, "trainer.max_epochs=1", "run_name=t")
    path = tmp_path / "checkpoints/t/best.pt"
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["config"]["model"]["_target_"] = "timm.create_model"
    torch.save(checkpoint, path)
    result = run_evaluate(tmp_path, f"ckpt={path}", ok=False)
    assert result.returncode == 2 and "timm.create_model" in error_line(result)


def test_bce_loss_is_timms_binary_cross_entropy_on_hard_and_mixed_targets(tmp_path):
    from timm.loss import BinaryCrossEntropy

    from utils.tasks._classification import ClassificationLoss

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, generator=generator)
    hard = torch.randint(0, 5, (8,), generator=generator)
    mixed = torch.softmax(torch.randn(8, 5, generator=generator), dim=1)
    ours = ClassificationLoss(0.1, None, 5, "bce")
    theirs = BinaryCrossEntropy(smoothing=0.1)
    torch.testing.assert_close(ours(logits, hard), theirs(logits, hard))
    smoothed = mixed * 0.9 + 0.1 / 5  # timm's mixup_target smooths before its loss sees it
    torch.testing.assert_close(ours(logits, mixed), BinaryCrossEntropy()(logits, smoothed))
    result = run_train(tmp_path, "task.loss=bce", "trainer.max_epochs=2", "run_name=b")
    assert "binary cross-entropy per class" in result.stdout + result.stderr
    assert read_metrics(tmp_path / "runs/b")["test/acc"] > 0.5
