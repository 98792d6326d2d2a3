"""Checkpoints that can be trusted: safe loading, refusing hostile files, surviving crashes,
retention, and evaluate.py reproducing what training reported."""

from __future__ import annotations

import errno
import json
import math
import re
import shutil
import socket
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, error_line, read_metrics, run_evaluate, run_train
from omegaconf import OmegaConf

from utils.checkpoint import load as checkpoint_module
from utils.checkpoint.load import load_checkpoint
from utils.config.trust import check_stored_config
from utils.errors import EXIT_USER_ERROR, UserError, print_error
from utils.files import save_atomic
from utils.model.weights import load_weights, strip_wrapper_prefixes

EVALUATE = ROOT / "evaluate.py"
SHORT = ["trainer.max_epochs=3", "model.hidden_sizes=[64]"]


def only_error_line(result) -> str:
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    cwd = tmp_path_factory.mktemp("trained")
    run_train(cwd, *SHORT, "run_name=base", "trainer.keep_top_k=2")
    return cwd


# --- evaluate.py ---------------------------------------------------------------------------


def test_evaluate_reproduces_trainings_test_accuracy(trained):
    result = run_evaluate(trained, "ckpt=checkpoints/base")  # the run's folder → its best.pt
    (eval_dir,) = (trained / "runs" / "eval").iterdir()
    evaluated = json.loads((eval_dir / "metrics.json").read_text())["checkpoints/base/best.pt"]
    assert evaluated["test/acc"] == read_metrics(trained / "runs" / "base")["test/acc"]
    assert {"test/loss", "test/acc_top5", "test/macro_f1", "per_class", "confusion"} <= set(
        evaluated
    )
    assert sum(evaluated["support"]) == 360 and len(evaluated["per_class"]["f1"]) == 10
    csv = (eval_dir / "confusion.csv").read_text().splitlines()
    assert len(csv) == 11 and sum(int(v) for row in csv[1:] for v in row.split(",")[1:]) == 360
    assert "per class" in result.stdout and "rows: true class; columns: predicted" in result.stdout
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(eval_dir))
    events.Reload()
    assert sorted(events.Tags()["images"]) == ["confusion/0", "reliability/0"]


def test_evaluate_compares_several_checkpoints(trained):
    result = run_evaluate(
        trained, "ckpt=[checkpoints/base/best.pt,checkpoints/base/last.pt]", "split=val", "runs=cmp"
    )
    assert "comparison — val" in result.stdout
    (eval_dir,) = (trained / "cmp" / "eval").iterdir()
    assert len(json.loads((eval_dir / "metrics.json").read_text())) == 2


def test_a_safetensors_export_round_trips_and_a_byte_changed_in_it_is_one_line(trained, tmp_path):
    pytest.importorskip("safetensors")
    exported = tmp_path / "model.safetensors"
    run_evaluate(
        trained, "ckpt=checkpoints/base/best.pt", f"export={exported}", f"runs={tmp_path}/a"
    )
    run_evaluate(trained, f"ckpt={exported}", f"runs={tmp_path}/b")
    (a,), (b,) = (tmp_path / "a" / "eval").iterdir(), (tmp_path / "b" / "eval").iterdir()
    accuracy = [
        next(iter(json.loads((d / "metrics.json").read_text()).values()))["test/acc"]
        for d in (a, b)
    ]
    assert accuracy[0] == accuracy[1]
    weight = next(iter(load_checkpoint(trained / "checkpoints/base/best.pt")["model"].values()))
    damaged = flip_a_byte_of(exported, weight)  # the format holds no checksum; the export does
    line = error_line(run_evaluate(trained, f"ckpt={exported}", f"runs={tmp_path}/c", ok=False))
    assert f"{exported} is damaged: its weights do not match the sha256" in line
    assert exported.read_bytes() == damaged


def test_a_config_file_with_yaml_aliases_or_too_large_is_refused_before_it_is_loaded(
    trained, tmp_path
):
    """config= (an export's config, from elsewhere): a YAML whose aliases expand tenfold a
    level (seven levels kept the load going past 5 minutes) or a file larger than any config
    is refused in one line before it is loaded; the same config written plainly is read."""
    pytest.importorskip("safetensors")
    exported = tmp_path / "model.safetensors"
    run_evaluate(trained, "ckpt=checkpoints/base/best.pt", f"export={exported}", "runs=r")
    config = load_checkpoint(trained / "checkpoints/base/best.pt")["config"]
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 8)]
    files = {
        "bomb.yaml": "\n".join(levels) + "\n" + yaml.safe_dump(config),
        "large.yaml": yaml.safe_dump({**config, "notes": "x" * 2**20}),
        "plain.yaml": yaml.safe_dump(config),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    for name in ("bomb.yaml", "large.yaml"):
        result = run_evaluate(trained, f"ckpt={exported}", f"config={tmp_path / name}", ok=False)
        assert "not a config torchloom writes" in only_error_line(result)
    run_evaluate(trained, f"ckpt={exported}", f"config={tmp_path / 'plain.yaml'}", "runs=r")


@pytest.mark.parametrize(
    "target",
    [
        "os.system",
        "builtins.eval",
        "subprocess.run",
        "torch.hub.load",
        "torch.nn.functional.os.system",
        "models.mlp.math.prod",
        "torch.nn.Linear",  # a real torch builder, but none of torchloom's YAML files names it
    ],
)
def test_untrusted_targets_are_refused_naming_the_key(target):
    with pytest.raises(UserError, match=r"model\.inner\._target_"):
        check_stored_config({"model": {"inner": {"_target_": target}}}, "x.pt")


def test_project_and_torch_targets_are_trusted():
    check_stored_config({"model": {"_target_": "models.cnn.cnn"}}, "x.pt")
    check_stored_config({"data": {"_target_": "data.images.digits.load_digits"}}, "x.pt")
    check_stored_config({"optim": {"_target_": "torch.optim.SGD"}}, "x.pt")


# --- Loading safely ------------------------------------------------------------------------


def test_wrapper_prefixes_are_stripped_in_any_combination():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    state = model.state_dict()
    for prefix in ("module.", "_orig_mod.", "module._orig_mod.", "_orig_mod.module."):
        fresh = torch.nn.Sequential(torch.nn.Linear(2, 3))
        load_weights(fresh, {prefix + k: v for k, v in state.items()})
        assert all(torch.equal(fresh.state_dict()[k], state[k]) for k in state)
    assert set(strip_wrapper_prefixes({"module.0.weight": 1})) == {"0.weight"}


def test_mismatched_weights_show_a_table_and_an_all_mismatch_is_an_error(capsys):
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 4))
    other = {"0.weight": torch.zeros(5, 2), "0.bias": torch.zeros(5), "9.weight": torch.zeros(1)}
    with pytest.raises(UserError, match="2 missing, 1 unexpected, 2 of another shape"):
        load_weights(model, other)
    assert "0.weight" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"\(0 of 4 fit\)"):
        load_weights(model, other, strict=False)
    partial = {"1.weight": torch.ones(4, 3), "1.bias": torch.ones(4)}
    load_weights(model, partial, strict=False)
    assert torch.equal(model[1].weight, torch.ones(4, 3))


# --- Crashes, retention, resume choices ----------------------------------------------------


def test_resume_auto_falls_back_when_the_newest_checkpoint_is_unreadable(trained, tmp_path):
    shutil.copytree(trained / "checkpoints" / "base", tmp_path / "checkpoints" / "base")
    (tmp_path / "checkpoints" / "base" / "last.pt").write_bytes(b"\0" * 100)
    result = run_train(tmp_path, *SHORT, "run_name=base", "resume=auto", "trainer.max_epochs=4")
    assert "warning: not a readable checkpoint" in result.stdout
    assert "resumed from checkpoints/base/" in result.stdout
    assert load_checkpoint(tmp_path / "checkpoints" / "base" / "last.pt")["epoch"] == 4


def flip_a_byte_of(path: Path, values: torch.Tensor) -> bytes:
    """``path`` (a torch.save file) with one byte changed amid ``values``' bytes, as a disk's
    rot or a bad copy leaves it; the file's new bytes."""
    data = bytearray(path.read_bytes())
    at = bytes(data).find(values.contiguous().numpy().tobytes()[:64])
    assert at > 0
    data[at + 33] ^= 0x5A
    path.write_bytes(bytes(data))
    return bytes(data)


@pytest.mark.parametrize("command", ["evaluate", "resume", "resume=auto"])
def test_a_byte_changed_in_a_checkpoint_is_one_line_naming_its_record(trained, tmp_path, command):
    """torch.load does not check the CRC-32 a checkpoint's archive holds for each record: a
    byte changed amid a weight was evaluated and resumed as another weight without a word.
    Now: one line naming the file and the record, exit 2, the file as it was; resume=auto
    says it and resumes from the checkpoint beside it."""
    folder = tmp_path / "checkpoints" / "base"
    shutil.copytree(trained / "checkpoints" / "base", folder)
    path = folder / ("best.pt" if command == "evaluate" else "last.pt")
    weight = next(iter(load_checkpoint(path)["model"].values()))
    damaged = flip_a_byte_of(path, weight)
    if command == "evaluate":
        result = run_evaluate(tmp_path, f"ckpt={path}", ok=False)
    else:
        resume = "resume=auto" if command == "resume=auto" else f"resume={path}"
        result = run_train(
            tmp_path,
            *SHORT,
            "run_name=base",
            resume,
            "trainer.max_epochs=4",
            ok=command != "resume",
        )
    said = f"{path.relative_to(tmp_path)} is damaged: archive/data/"  # the weight's record
    if command == "resume=auto":
        assert said in result.stdout and "trying the previous checkpoint" in result.stdout
        assert "resumed from checkpoints/base/" in result.stdout
    else:
        line = error_line(result)
        assert said in line and "does not match the checksum" in line, line
        assert path.read_bytes() == damaged


def test_a_byte_changed_in_a_tensors_file_is_one_line(tmp_path):
    """A data=tensors .pt file is checked as a checkpoint is."""
    x = torch.randn(64, 5)
    torch.save({"x": x, "y": torch.arange(64) % 2}, tmp_path / "arrays.pt")
    flip_a_byte_of(tmp_path / "arrays.pt", x)
    result = run_train(tmp_path, "data=tensors", "data.path=arrays.pt", ok=False)
    assert "arrays.pt is damaged: arrays/data/0 in it" in error_line(result)


def test_a_checkpoint_whose_records_overlap_is_refused_before_it_is_read(tmp_path):
    """A crafted archive whose record "a" holds record "b" whole (both with the right names and
    checksums): n such records make a check, or torch.load, read the file n times over. The
    records' sizes together pass the file's: refused unread, as torch.save never writes it."""
    import copy
    import io
    import zipfile

    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as archive:
        archive.writestr("b", b"y" * 4096)
        b = copy.copy(archive.getinfo("b"))
    inner_bytes = inner.getvalue()[: inner.getvalue().rindex(b"PK\x01\x02")]  # b's header, data
    path = tmp_path / "crafted.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a", inner_bytes)
        a = archive.getinfo("a")
        b.header_offset = a.header_offset + 30 + len(a.filename) + len(a.extra)  # inside a's data
        archive.filelist.append(b)
        archive.NameToInfo["b"] = b
    with zipfile.ZipFile(path) as archive:  # what a check that trusts the directory reads
        assert archive.read("b") == b"y" * 4096 and archive.testzip() is None
    with pytest.raises(UserError, match=r"crafted\.pt is damaged: its records overlap"):
        load_checkpoint(path)


def test_resume_auto_starts_fresh_when_there_is_nothing_to_resume(tmp_path):
    result = run_train(tmp_path, "run_name=new", "resume=auto", "trainer.max_epochs=1")
    assert "no checkpoint in checkpoints/new yet; starting fresh" in result.stdout


def test_a_save_killed_before_its_rename_leaves_the_previous_checkpoint(trained, tmp_path):
    """The state SIGKILL leaves between writing the temporary file and renaming it."""
    folder = tmp_path / "checkpoints" / "base"
    shutil.copytree(trained / "checkpoints" / "base", folder)
    before = (folder / "last.pt").read_bytes()
    # Its writer's name: this machine, a process that is gone.
    leftover = f".last.pt.{socket.gethostname()}-999999999.x7Kq2.tmp"
    (folder / leftover).write_bytes(before[: len(before) // 3])
    assert load_checkpoint(folder / "last.pt")["epoch"] == 3
    run_train(tmp_path, *SHORT, "run_name=base", "resume=auto", "trainer.max_epochs=4")
    assert not list(folder.glob(".*.tmp"))  # the leftover was cleaned up


def test_a_failed_save_says_where_and_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "last.pt"
    save_atomic({"model": {}, "epoch": 1}, path)

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_module.torch, "save", disk_full)
    with pytest.raises(
        UserError,
        match=rf"could not write checkpoint {path}: No space left on device; the previous",
    ):
        save_atomic({"model": {}, "epoch": 2}, path)
    monkeypatch.undo()
    assert load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_keep_top_k_keeps_the_best_files(trained):
    folder = trained / "checkpoints" / "base"
    top = sorted(p.name for p in folder.glob("epoch=*.pt"))
    assert len(top) == 2
    last = load_checkpoint(folder / "last.pt")
    kept = sorted(name for _, name in last["top_k"])
    assert kept == top
    values = [value for value, _ in last["top_k"]]
    assert values[0] == last["best_metric"] == max(values)


def test_resume_refuses_a_changed_architecture_listing_the_keys(trained, tmp_path):
    shutil.copytree(trained / "checkpoints" / "base", tmp_path / "checkpoints" / "base")
    line = only_error_line(
        run_train(
            tmp_path,
            "trainer.max_epochs=3",
            "model.hidden_sizes=[32]",
            "data.batch_size=32",
            "resume=checkpoints/base/last.pt",
            ok=False,
        )
    )
    assert "model.hidden_sizes: [64] -> [32]" in line and "data.batch_size: 64 -> 32" in line
    assert "resume_allow_changes=true" in line
    allowed = run_train(
        tmp_path,
        *SHORT,
        "data.augment.crop_padding=1",
        "trainer.max_epochs=4",
        "resume=checkpoints/base/last.pt",
        "resume_allow_changes=true",
    )
    assert "resumed from" in allowed.stdout


def test_init_from_loads_weights_only(trained, tmp_path):
    result = run_train(
        tmp_path,
        *SHORT,
        "run_name=finetune",
        "trainer.max_epochs=1",
        f"init_from={trained / 'checkpoints' / 'base' / 'best.pt'}",
    )
    assert "optimizer, schedule and counters start fresh" in result.stdout
    metrics = read_metrics(tmp_path / "runs" / "finetune")
    assert metrics["epochs"] == 1 and metrics["global_step"] == math.ceil(1257 / 64)
    assert metrics["test/acc"] > 0.9  # started from trained weights, not from scratch


@pytest.mark.gpu
def test_a_cuda_checkpoint_evaluates_on_the_cpu(tmp_path):
    run_train(tmp_path, "run_name=gpu", "trainer.device=cuda", "trainer.max_epochs=1")
    trained_on_gpu = read_metrics(tmp_path / "runs" / "gpu")["test/acc"]
    run_evaluate(tmp_path, "ckpt=checkpoints/gpu", "device=cpu")
    (eval_dir,) = (tmp_path / "runs" / "eval").iterdir()
    on_cpu = next(iter(json.loads((eval_dir / "metrics.json").read_text()).values()))["test/acc"]
    assert on_cpu == pytest.approx(trained_on_gpu, abs=1 / 360)


def test_evaluate_finds_moved_data_through_data_root(tmp_path, mnist_root):
    moved = tmp_path / "moved"
    shutil.copytree(mnist_root, tmp_path / "original")
    run_train(
        tmp_path,
        "run_name=m",
        "data=mnist",
        f"data.root={tmp_path / 'original'}",
        "data.val_size=32",
        "data.download=false",
        "trainer.max_epochs=1",
        "data.batch_size=16",
    )
    (tmp_path / "original").rename(moved)
    missing = run_evaluate(tmp_path, "ckpt=checkpoints/m", ok=False)
    assert "mnist not found in" in only_error_line(missing)
    run_evaluate(tmp_path, "ckpt=checkpoints/m", f"data.root={moved}", "data.batch_size=7")
    line = only_error_line(
        run_evaluate(tmp_path, "ckpt=checkpoints/m", "data.path=x.csv", ok=False)
    )
    assert "data.path does not apply to data.images.mnist.load_mnist" in line


def test_evaluate_follows_the_split_training_tested_on(tmp_path):
    """An image folder without test/ tests on val (test_split: val); evaluate.py with its
    defaults failed on it. It follows the record; split=test is one line naming the fix."""
    from conftest import write_imagefolder

    write_imagefolder(tmp_path / "images", per_class=6, test=False)
    folder = ("data=imagefolder", "data.root=images", "data.image_size=[12,10]", "model=mlp")
    run_train(tmp_path, *folder, "trainer.max_epochs=1", "data.num_workers=0", "run_name=v")
    trained = read_metrics(tmp_path / "runs" / "v")
    assert trained["test_split"] == "val"
    run_evaluate(tmp_path, "ckpt=checkpoints/v", "runs=e")
    (eval_dir,) = (tmp_path / "e" / "eval").iterdir()
    evaluated = next(iter(json.loads((eval_dir / "metrics.json").read_text()).values()))
    assert evaluated["val/acc"] == trained["test/acc"]  # training's final test was on val
    line = only_error_line(run_evaluate(tmp_path, "ckpt=checkpoints/v", "split=test", ok=False))
    assert "has no test split (training tested on val); pass split=val" in line


def test_an_error_line_with_a_vast_value_keeps_its_start_and_end(capsys):
    """Any error line, whatever value from a file it names, stays a line a person can read:
    its start (the key) and its end (the fix), with the count of characters left out."""
    print_error(f"key=[{'8, ' * 100_000}8]; pass the fix")
    line = capsys.readouterr().err
    assert line.startswith("error: key=[8, 8,") and line.endswith("8]; pass the fix\n")
    assert "(298,022 characters left out)" in line and len(line) < 2100  # of 300,021


def test_a_stored_config_asking_for_a_vast_number_of_layers_is_refused_quickly(trained, tmp_path):
    """100,000 hidden layers of 8: a few megabytes of parameters, but a million Python objects
    to make, and 19 s of config handling before the build's count of tensors refused it: a
    stored model node that large is refused as it is read, naming the key (as are 100,000
    keys of its own, and a million values under data, 111 s before); 1,024 layers, within
    that bound, by the count of tensors the build makes, before the weights are compared.
    Resuming it is refused in a line that shows the list's start and end, not 300,000
    characters."""
    stored = torch.load(trained / "checkpoints" / "base" / "best.pt", weights_only=True)
    original = stored["config"]
    edits = {
        "model.hidden_sizes": {"model": {**original["model"], "hidden_sizes": [8] * 100_000}},
        "model.k": {"model": {**original["model"], **{f"k{i}": 1 for i in range(10**5)}}},
        "data.junk": {"data": {**original["data"], "junk": [1] * 10**6}},
    }
    for key, edit in edits.items():
        torch.save({**stored, "config": {**original, **edit}}, tmp_path / "vast.pt")
        line = only_error_line(run_evaluate(trained, f"ckpt={tmp_path / 'vast.pt'}", ok=False))
        node = "model node holds more than 4,096" if key != "data.junk" else "config holds"
        # (model.k...: the key where the count passed, which moves as model=auto gains keys)
        assert f"its {node}" in line and f"keys and values (counted up to {key}" in line
    stored["config"]["model"]["hidden_sizes"] = [8] * 1024
    torch.save(stored, tmp_path / "deeper.pt")
    line = only_error_line(run_evaluate(trained, f"ckpt={tmp_path / 'deeper.pt'}", ok=False))
    assert "the stored model config builds more than" in line and "was it edited?" in line
    stored["config"]["model"]["hidden_sizes"] = [8] * 100_000
    torch.save(stored, tmp_path / "last.pt")
    again = ("trainer.max_epochs=4", "model.hidden_sizes=[64]", f"resume={tmp_path / 'last.pt'}")
    line = only_error_line(run_train(trained, *again, "run_name=deep", ok=False))
    assert "model.hidden_sizes: [8, 8, 8" in line and "characters left out) ... , 8, 8" in line
    assert "8, 8] -> [64]" in line
    assert line.endswith("resume_allow_changes=true to resume anyway") and len(line) < 1000


# What a hostile stored config would put at each key that says where, or how much, a command
# writes, deletes or starts.
HOSTILE_LOCAL = {
    "download": True,
    "cache": "disk",
    "cache_dir": "/home/someone/important",
    "cache_max_gb": 10**6,
    "shard_cache_gb": 10**6,
    "shard_cache_dir": "/home/someone/important",
    "num_workers": 40,
    "tokenizer_cache": "/home/someone/important",
}


def test_every_key_naming_a_folder_a_size_or_a_process_count_is_this_command_lines():
    """The list is complete: every data key of conf/data/ that names a folder to write, a
    cache, a download or workers is in it; and each is replaced, unless given here."""
    import yaml

    from utils.checkpoint.stored import LOCAL_DATA_KEYS, data_config

    local = re.compile(r"cache|dir$|download|workers")
    keys = {
        key
        for path in (ROOT / "conf" / "data").glob("*.yaml")
        for key in yaml.safe_load(path.read_text())
        if local.search(key) and key != "cache_size"  # cache_size: pixels, not bytes
    }
    assert keys == LOCAL_DATA_KEYS.keys() == HOSTILE_LOCAL.keys()
    none_given = OmegaConf.create(dict.fromkeys(LOCAL_DATA_KEYS))
    node = data_config({"_target_": "data.x", **HOSTILE_LOCAL}, none_given)
    assert OmegaConf.to_container(node) == {"_target_": "data.x", **LOCAL_DATA_KEYS}
    given = OmegaConf.create({**dict.fromkeys(LOCAL_DATA_KEYS), "num_workers": 3})
    assert data_config({"_target_": "data.x", **HOSTILE_LOCAL}, given).num_workers == 3


def test_a_data_path_read_from_the_environment_is_given_on_the_command_line(tmp_path):
    """data.path=${oc.env:DIGITS} is recorded as the interpolation: evaluate.py refused the
    checkpoint, and data.path=... could not replace it. Now it is one line naming the key, and
    the key given here evaluates it; the environment is never read for it."""
    from data.images.digits import BUNDLED

    run_train(tmp_path, "data.path=${oc.env:DIGITS}", *SHORT, env={"DIGITS": str(BUNDLED)})
    best = next((tmp_path / "checkpoints").rglob("best.pt"))
    refused = run_evaluate(tmp_path, f"ckpt={best}", ok=False)
    assert refused.returncode == 2
    assert error_line(refused).startswith("error: data.path=${oc.env:DIGITS}: training read it")
    assert "give data.path=... on this command line" in error_line(refused)
    given = run_evaluate(tmp_path, f"ckpt={best}", f"data.path={BUNDLED}")
    assert "test/acc" in given.stdout


def test_evaluate_reads_each_checkpoint_once(trained, monkeypatch):
    """It read the file twice: once to rebuild, once more for its provenance."""
    from utils.checkpoint import stored as stored_module

    read, real = [], checkpoint_module.load_checkpoint

    def counted(path, *args, **kwargs):
        read.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "load_checkpoint", counted)
    monkeypatch.setattr(stored_module, "load_checkpoint", counted)
    result = run_evaluate(trained, "ckpt=checkpoints/base/best.pt")
    assert "test/acc" in result.stdout and read == ["best.pt"]
