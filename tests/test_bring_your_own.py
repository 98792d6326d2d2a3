"""Bring your own model and optimizer: one Python file and one YAML each, nothing else. The
dataset's ``input_shape`` and ``num_classes`` go only to builders that take them; optional
optimizer keys have their documented defaults (utils/model/optim.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import (
    EVALUATE,
    assert_same_run,
    error_line,
    interrupt_and_resume,
    read_metrics,
    run_python,
    run_train,
    user_conf,
    write_table,
)

from data.batching.batches import Placement
from utils.checkpoint.load import load_checkpoint


def test_the_pytorch_examples_net_trains_unchanged_with_a_one_line_yaml(tmp_path, mnist_root):
    search = user_conf(
        tmp_path,
        {
            "model/examples_net.yaml": "_target_: examples_net.Net\n",
            "optim/adadelta.yaml": "_target_: torch.optim.Adadelta\n_partial_: true\nlr: 1.0\n",
        },
    )
    result = run_train(
        tmp_path,
        search,
        "model=examples_net",
        "optim=adadelta",
        "data=mnist",
        f"data.root={mnist_root}",
        "data.val_size=16",
        "data.batch_size=16",
        "scheduler=step",
        "trainer.max_epochs=2",
        "run_name=net",
    )
    assert "input_shape" not in result.stderr
    metrics = read_metrics(tmp_path / "runs" / "net")
    assert metrics["epochs"] == 2 and metrics["status"] == "completed" and "test/acc" in metrics
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "net" / "last.pt")
    assert "fc2.weight" in checkpoint["model"]
    groups = checkpoint["optimizer"]["param_groups"]
    # No weight_decay key: Adadelta's own default (0); decay_bias_and_norm's default (false)
    # keeps biases in their own group.
    assert [g["weight_decay"] for g in groups] == [0.0, 0.0] and groups[0]["lr"] > 0


def test_a_target_given_on_the_command_line_drops_the_replaced_options_keys(tmp_path, mnist_root):
    """model._target_=... kept the default model's keys (hidden_sizes) and failed on them; a
    key given on the command line is still the builder's to refuse."""
    data = ("data=mnist", f"data.root={mnist_root}", "data.val_size=16", "data.batch_size=16")
    result = run_train(
        tmp_path, "model._target_=examples_net.Net", *data, "trainer.max_epochs=1", "run_name=t"
    )
    said = " ".join(result.stdout.split())
    assert (
        "model._target_=examples_net.Net replaces the builder of the model option, so its keys hidden_sizes"
        in said
    )
    assert read_metrics(tmp_path / "runs" / "t")["epochs"] == 1
    refused = run_train(
        tmp_path, "model._target_=examples_net.Net", "model.dropout=0.5", *data, ok=False
    )
    assert "dropout" in error_line(refused)


def test_builders_that_take_the_shapes_still_get_them():
    from utils.model.modules import accepted_by

    shapes = {"input_shape": (1, 8, 8), "num_classes": 10}
    assert accepted_by("models.mlp.mlp", shapes) == shapes
    assert accepted_by("examples_net.Net", shapes) == {}
    assert accepted_by("torch.nn.Linear", {"in_features": 3, "num_classes": 2}) == {
        "in_features": 3
    }


# --- Bring your own data: a CSV table, arrays in a file ------------------------------------


CSV_RUN = [
    "data=csv",
    "data.path=table.csv",
    "data.target=kind",
    "data.categorical=[colour]",
    "data.batch_size=16",
    "model.hidden_sizes=[16]",
]


def test_a_csv_table_trains_evaluates_and_keeps_its_class_names(tmp_path):
    write_table(tmp_path / "table.csv")
    result = run_train(tmp_path, *CSV_RUN, "trainer.max_epochs=8", "run_name=csv")
    assert "4 features (size, weight, colour=b, colour=g, colour=r)" not in result.stdout
    assert "5 features (size, weight, colour=b, colour=g, colour=r), 2 classes" in result.stdout
    metrics = read_metrics(tmp_path / "runs" / "csv")
    assert metrics["test/acc"] > 0.8  # the rule is learnable from standardised features
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "csv" / "best.pt")
    assert checkpoint["classes"] == ["big", "small"]
    evaluated = run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/csv/best.pt", "runs=eval")
    assert f"{metrics['test/acc']:.4f}" in evaluated.stdout


def test_csv_features_are_standardised_with_the_train_split_alone(tmp_path):
    from data.tables.tabular import load_csv

    write_table(tmp_path / "table.csv")
    split = {"val_path": None, "test_path": None, "val": 0.25, "test": 0.25, "seed": 0}
    data = load_csv(
        str(tmp_path / "table.csv"),
        "kind",
        None,
        ["colour"],
        split,
        batch_size=8,
        eval_batch_size=64,
        augment={"crop_padding": 0, "horizontal_flip": False},
    )
    train = data.splits["train"].inputs
    everything = torch.cat([train, data.splits["val"].inputs, data.splits["test"].inputs])
    assert data.mean == pytest.approx(train.mean(dim=0).tolist(), rel=1e-5)
    assert data.mean != pytest.approx(everything.mean(dim=0).tolist(), rel=1e-5)
    assert data.sizes() == {"train": 120, "val": 60, "test": 60}
    batch, _ = next(data.batches("train", Placement(torch.device("cpu")), seed=0).epoch(0))
    assert batch.shape == (8, 5) and batch[:, 1].abs().max() < 10  # weight ~500 is rescaled


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace("0.", "zero.", 1),
            "line 2, column 'size': 'zero.",
        ),
        (lambda t: t.replace(",r,", ",,", 1).replace("colour", "colour", 1), None),
    ],
)
def test_a_value_that_is_not_a_number_names_its_column_and_line(tmp_path, edit, message):
    table = write_table(tmp_path / "table.csv")
    table.write_text(edit(table.read_text()))
    listed = [o if "categorical" not in o else "data.categorical=[]" for o in CSV_RUN]
    overrides = CSV_RUN if message else listed
    result = run_train(tmp_path, *overrides, "trainer.max_epochs=1", ok=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    if message:
        assert message in line and "is not a number" in line
    else:  # colour holds letters: not a number when data.categorical lists none
        assert "column 'colour'" in line and "data.categorical" in line


def test_separate_tsv_files_for_val_and_test_and_an_unknown_label(tmp_path):
    for name, seed in (("train.tsv", 0), ("val.tsv", 1), ("test.tsv", 2)):
        write_table(tmp_path / name, rows=80, seed=seed, delimiter="\t")
    files = [
        "data=csv",
        "data.path=train.tsv",
        "data.split.val_path=val.tsv",
        "data.split.test_path=test.tsv",
        "data.target=kind",
        "data.categorical=[colour]",
    ]
    result = run_train(tmp_path, *files, "trainer.max_epochs=1", "run_name=tsv")
    assert "{'train': 80, 'val': 80, 'test': 80}" in result.stdout
    test = tmp_path / "test.tsv"
    test.write_text(test.read_text().replace("\tbig\n", "\thuge\n", 1))
    bad = run_train(tmp_path, *files, "trainer.max_epochs=1", "run_name=bad", ok=False)
    assert "test.tsv line" in bad.stderr and "kind='huge' is not a class" in bad.stderr


def test_arrays_from_npz_and_pt_files_train(tmp_path):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    np.savez(tmp_path / "table.npz", x=x, y=(x[:, 0] + x[:, 1] > 0).astype(np.int64))
    run_train(
        tmp_path,
        "data=tensors",
        "data.path=table.npz",
        "trainer.max_epochs=3",
        "model=mlp",  # three epochs: what is tested is the file's reading, not model=auto's pace
        "run_name=npz",
    )
    assert read_metrics(tmp_path / "runs" / "npz")["test/acc"] > 0.75
    images = {
        "x": torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8),
        "y": torch.randint(0, 3, (64,)),
        "x_test": torch.zeros(8, 1, 8, 8, dtype=torch.uint8),
        "y_test": torch.zeros(8, dtype=torch.long),
    }
    torch.save(images, tmp_path / "images.pt")
    result = run_train(
        tmp_path,
        "data=tensors",
        "data.path=images.pt",
        "model=cnn",
        "data.batch_size=8",
        "trainer.max_epochs=1",
        "run_name=pt",
    )
    assert "{'train': 54, 'val': 10, 'test': 8}" in result.stdout


class Touch:
    """Unpickling this calls ``Path.touch``: what a hostile file would do with os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_tensors_file_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    torch.save({"x": torch.zeros(4, 3), "y": Touch(marker)}, tmp_path / "evil.pt")
    result = run_train(
        tmp_path, "data=tensors", "data.path=evil.pt", "trainer.max_epochs=1", ok=False
    )
    assert result.returncode == 2 and "cannot read" in result.stderr and "evil.pt" in result.stderr
    assert not marker.exists()


def test_an_interrupted_csv_run_resumes_bit_identically(tmp_path):

    write_table(tmp_path / "table.csv")
    run = [
        *CSV_RUN,
        "model=mlp",
        "model._target_=signalling_model.mlp",
        "model.dropout=0.3",
        "trainer.max_epochs=3",
        "trainer.log_every_n_steps=2",
    ]
    run_train(tmp_path, *run, "run_name=straight")
    position = interrupt_and_resume(tmp_path, run, "cut", at=13)  # 11 batches an epoch
    assert (position["epoch"], position["batch_in_epoch"]) == (1, 2)
    assert_same_run(tmp_path, "straight", "cut")


# --- torchvision models ----------------------------------------------------------------------


def test_a_torchvision_model_is_fitted_to_the_data_from_a_local_state_dict(tmp_path):
    import torchvision

    from models.pretrained import torchvision_model

    saved = torchvision.models.resnet18().state_dict()
    torch.save(saved, tmp_path / "resnet18.pth")
    model = torchvision_model((1, 8, 8), 10, "resnet18", str(tmp_path / "resnet18.pth"), 0)
    state = model.model.state_dict()
    torch.testing.assert_close(state["conv1.weight"], saved["conv1.weight"].sum(1, keepdim=True))
    assert state["fc.weight"].shape == (10, 512) and model.head == "fc"
    for key in ("layer1.0.conv1.weight", "layer4.1.bn2.running_var"):
        assert torch.equal(state[key], saved[key])
    assert model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    two = torchvision_model((2, 8, 8), 10, "resnet18", str(tmp_path / "resnet18.pth"), 0)
    rgb = saved["conv1.weight"]
    torch.testing.assert_close(two.model.conv1.weight, rgb.repeat(1, 1, 1, 1)[:, :2] * 1.5)


def test_a_torchvision_weight_name_is_read_from_the_hub_cache_never_downloaded(
    tmp_path, monkeypatch
):
    import torchvision

    from models.pretrained import torchvision_model
    from utils.errors import UserError

    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    for name in ("DEFAULT", "ResNet18_Weights.IMAGENET1K_V1"):  # torchvision's own spellings
        with pytest.raises(UserError, match=r"resnet18-f37072fd.pth is not in the torch hub cache"):
            torchvision_model((3, 32, 32), 5, "resnet18", name, 0)
    saved = torchvision.models.resnet18().state_dict()
    (tmp_path / "hub" / "checkpoints").mkdir(parents=True)
    torch.save(saved, tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth")
    for name in ("IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1", "ResNet18_Weights.DEFAULT"):
        model = torchvision_model((3, 32, 32), 5, "resnet18", name, 0)
        assert torch.equal(model.model.conv1.weight, saved["conv1.weight"])
    for name in ("IMAGENET9", "VGG16_Weights.IMAGENET1K_V1"):  # unknown; another model's
        with pytest.raises(UserError, match=rf"'{name}' is not a weight of resnet18"):
            torchvision_model((3, 32, 32), 5, "resnet18", name, 0)


# 160 synthetic 8×8 images in batches of 32: 5 batches an epoch.
FROZEN = [
    "model=torchvision",
    "model.name=mobilenet_v3_small",
    "model.freeze_backbone_epochs=1",
    "optim.backbone_lr_scale=0.1",
    "data=synthetic",
    "data.shape=[1,8,8]",
    "data.num_samples=160",
    "data.val_size=32",
    "data.test_size=32",
    "data.batch_size=32",
    "scheduler=none",
]


@pytest.mark.parametrize("layer_decay", [pytest.param(None, marks=pytest.mark.slow), 0.8])
def test_a_frozen_backbone_keeps_its_weights_and_statistics_then_thaws_exactly(
    tmp_path, layer_decay
):
    import torchvision

    torch.save(torchvision.models.mobilenet_v3_small().state_dict(), tmp_path / "m.pth")
    frozen = [
        *FROZEN,
        "model.weights=m.pth",
        "trainer.max_epochs=2",
        "trainer.keep_top_k=2",
        f"optim.layer_decay={'null' if layer_decay is None else layer_decay}",
    ]
    shown = run_train(tmp_path, *frozen, "run_name=straight").stdout
    saved = torch.load(tmp_path / "m.pth", weights_only=True)
    (epoch_1,) = (tmp_path / "checkpoints" / "straight").glob("epoch=001-*.pt")
    after = load_checkpoint(epoch_1)
    groups = after["optimizer"]["param_groups"]
    if layer_decay is None:
        assert sorted({g["lr"] for g in groups}) == pytest.approx([0.0002, 0.002])
    else:  # the head at optim.lr; each layer below it 0.8 times the one above, times 0.1
        layers = list(dict.fromkeys(g["layer"] for g in groups))
        assert layers[-1] == "head classifier.3" and len(layers) == 15  # stem, 12, classifier
        lrs = {g["layer"]: g["lr"] for g in groups}
        expected = [0.002 * 0.1 * 0.8 ** (len(layers) - 1 - i) for i in range(len(layers) - 1)]
        assert [lrs[name] for name in layers] == pytest.approx([*expected, 0.002])
        assert "LR by layer (optim.layer_decay)" in shown
    head = "model.classifier.3."
    for key, value in after["model"].items():
        name = key.removeprefix("model.")
        if key.startswith(head) or name == "features.0.0.weight":  # new classifier, refit stem
            continue
        assert torch.equal(value, saved[name]), key  # weights and BatchNorm statistics
    assert len(after["optimizer"]["state"]) == 2  # only the classifier's weight and bias stepped
    # Resumed at the thaw, the run ends bit for bit where the one that never stopped does.
    run_train(tmp_path, *frozen, "run_name=cut", f"resume='{epoch_1}'")
    straight = load_checkpoint(tmp_path / "checkpoints" / "straight" / "last.pt")["model"]
    thawed = load_checkpoint(tmp_path / "checkpoints" / "cut" / "last.pt")["model"]
    assert all(torch.equal(straight[k], v) for k, v in thawed.items())
    assert not torch.equal(
        thawed["model.features.1.block.0.0.weight"], saved["features.1.block.0.0.weight"]
    )
    assert not torch.equal(
        thawed["model.features.1.block.0.1.running_mean"],
        saved["features.1.block.0.1.running_mean"],
    )


# --- torchvision's datasets, from their on-disk formats ------------------------------------


def write_cifar100(root: Path, per_file: int = 60, seed: int = 0) -> Path:
    """cifar-100-python/{train,test,meta}: pickled dicts, as the archive holds them."""
    import pickle

    import numpy as np

    rng = np.random.default_rng(seed)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name in ("train", "test"):
        batch = {
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            b"fine_labels": rng.integers(0, 100, per_file).tolist(),
            b"coarse_labels": rng.integers(0, 20, per_file).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"fine_label_names": [f"class{i}".encode() for i in range(100)]}
    (folder / "meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


@pytest.mark.parametrize("name", ["kmnist", "emnist_balanced", "cifar100"])
def test_torchvision_datasets_train_from_their_on_disk_formats(tmp_path, name):
    from conftest import write_idx, write_mnist

    if name == "kmnist":
        write_mnist(tmp_path / "datasets", "KMNIST")
        classes, count = 10, 10
    elif name == "emnist_balanced":
        import numpy as np

        rng = np.random.default_rng(0)
        raw = tmp_path / "datasets" / "EMNIST" / "raw"
        for part, n in (("train", 96), ("test", 32)):
            write_idx(
                raw / f"emnist-balanced-{part}-images-idx3-ubyte", rng.integers(0, 256, (n, 28, 28))
            )
            write_idx(raw / f"emnist-balanced-{part}-labels-idx1-ubyte", rng.integers(0, 47, (n,)))
        classes, count = 47, 47
    else:
        write_cifar100(tmp_path / "datasets")
        classes, count = "class0", 100
    run_train(
        tmp_path,
        "data=torchvision",
        f"data.name={name}",
        "data.val_size=16",
        "data.download=false",
        "data.batch_size=16",
        "model=cnn",
        "trainer.max_epochs=1",
        "run_name=tv",
    )
    checkpoint = load_checkpoint(tmp_path / "checkpoints" / "tv" / "last.pt")
    last_layer = [v for k, v in checkpoint["model"].items() if k.endswith("weight")][-1]
    assert len(checkpoint["classes"]) == count and last_layer.shape[0] == count
    if isinstance(classes, str):
        assert checkpoint["classes"][0] == classes


def test_svhn_reads_its_mat_files_and_names_the_extra_when_scipy_is_missing(tmp_path, monkeypatch):
    import builtins

    import numpy as np
    import scipy.io

    rng = np.random.default_rng(0)
    root = tmp_path / "datasets"
    root.mkdir()
    for split, n in (("train", 48), ("test", 16)):
        scipy.io.savemat(
            root / f"{split}_32x32.mat",
            {
                "X": rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8),
                "y": rng.integers(1, 11, (n, 1)),
            },
        )
    from data.images.torchvision_datasets import read_svhn

    split, classes = read_svhn("svhn", root, "train", download=False)
    assert split.inputs.shape == (48, 3, 32, 32) and classes == [str(d) for d in range(10)]
    assert int(split.labels.max()) <= 9  # label 10 is the digit 0
    real_import = builtins.__import__

    def no_scipy(name, *args, **kwargs):
        if name.startswith("scipy"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    with pytest.raises(Exception, match=r'needs the extra: pip install -e "\.\[svhn\]"'):
        read_svhn("svhn", root, "train", download=False)


# --- image_csv: a manifest of path,label rows ---------------------------------------------


def write_manifest(root: Path, rows: int = 40) -> Path:
    """PNGs under root/pics/ and a manifest naming them, labels as names."""
    from PIL import Image

    generator = torch.Generator().manual_seed(0)
    (root / "pics").mkdir(parents=True)
    lines = ["path,label"]
    for i in range(rows):
        label = ("cat", "dog")[i % 2]
        pixels = torch.randint(0, 128, (10, 12, 3), dtype=torch.uint8, generator=generator)
        pixels[..., 0] += 127 * (label == "dog")  # a learnable difference: dogs are redder
        Image.fromarray(pixels.numpy()).save(root / "pics" / f"{i}.png")
        lines.append(f"pics/{i}.png,{label}")
    (root / "labels.csv").write_text("\n".join(lines) + "\n")
    return root / "labels.csv"


MANIFEST = [
    "data=image_csv",
    "data.root=.",
    "data.manifest=labels.csv",
    "data.image_size=[10,12]",
    "data.batch_size=8",
    "data.num_workers=0",
    "data.augment.crop_padding=0",
    "model=cnn",
    "scheduler=none",
]


def test_a_manifest_trains_keeps_class_names_and_resumes_exactly(tmp_path):
    write_manifest(tmp_path)
    result = run_train(tmp_path, *MANIFEST, "trainer.max_epochs=2", "run_name=straight")
    assert "{'train': 28, 'val': 6, 'test': 6}" in result.stdout
    assert sorted(p.name.split("-")[1] for p in (tmp_path / ".torchloom-cache").glob("*.u8")) == [
        "test",
        "train",
        "val",
    ] and all(p.name.startswith("manifest-") for p in (tmp_path / ".torchloom-cache").glob("*.u8"))
    straight = load_checkpoint(tmp_path / "checkpoints" / "straight" / "last.pt")
    assert straight["classes"] == ["cat", "dog"]
    run_train(tmp_path, *MANIFEST, "trainer.max_epochs=1", "run_name=cut")
    run_train(tmp_path, *MANIFEST, "trainer.max_epochs=2", "run_name=cut", "resume=auto")
    cut = load_checkpoint(tmp_path / "checkpoints" / "cut" / "last.pt")
    assert all(torch.equal(cut["model"][k], v) for k, v in straight["model"].items())


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("../outside.png,cat", "line 42: '../outside.png' is outside data.root"),
        ("/etc/hostname,cat", "line 42: '/etc/hostname' is outside data.root"),
        ("pics/missing.png,dog", "line 42: no image at data/pics/missing.png"),
        ("pics/0\0.png,cat", "labels.csv line 42, column 'path': holds a NUL byte"),
        ("pics/0.png,c\0at", "labels.csv line 42, column 'label': holds a NUL byte"),
        ("pics/1.png,", "labels.csv line 42: target column 'label' is empty, a missing label"),
    ],
)
def test_a_manifest_row_outside_the_root_or_missing_is_one_line(tmp_path, row, message):
    manifest = write_manifest(tmp_path / "data")
    (tmp_path / "outside.png").write_bytes((tmp_path / "data" / "pics" / "0.png").read_bytes())
    manifest.write_text(manifest.read_text() + row + "\n")
    overrides = [
        o.replace("data.root=.", "data.root=data").replace(
            "data.manifest=labels.csv", "data.manifest=data/labels.csv"
        )
        for o in MANIFEST
    ]
    result = run_train(tmp_path, *overrides, "trainer.max_epochs=1", ok=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-500:]
    assert "Traceback" not in result.stderr


def test_a_manifest_of_numbers_regresses_on_as_many_values_as_each_row_holds(tmp_path):
    manifest = write_manifest(tmp_path)
    values = manifest.read_text().replace(",cat", ",0.5;-2").replace(",dog", ",1.5;3")
    manifest.write_text(values)
    regress = [*MANIFEST, "task=regression", "trainer.max_epochs=1"]
    run_train(tmp_path, *regress, "run_name=two")
    assert (
        load_checkpoint(tmp_path / "checkpoints" / "two" / "best.pt")["inputs"]["num_classes"] == 2
    )
    manifest.write_text(values + "pics/1.png,7\n")
    line = error_line(run_train(tmp_path, *regress, ok=False))
    assert "labels.csv: rows hold [1, 2] values in 'label'; give every row the same" in line


def test_grey_images_with_rgb_statistics_say_what_to_give(tmp_path):
    write_manifest(tmp_path)
    result = run_train(
        tmp_path,
        *MANIFEST,
        "data.channels=1",
        "data.mean=[0.485,0.456,0.406]",
        "data.std=[0.229,0.224,0.225]",
        "trainer.max_epochs=1",
        ok=False,
    )
    assert (
        result.returncode == 2
        and "data.mean has 3 values and data.std 3, but image_csv "
        "labels.csv has 1 channel(s): give one value each"
        in result.stderr
    )
