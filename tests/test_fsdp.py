"""trainer.strategy=fsdp through the real launcher (torchrun, gloo on the CPU): it trains as DDP
does with half the bytes a process holds, writes sharded checkpoints (last/, best/) that
resume bit-identically after a kill -9, continue as one process, are evaluated and predicted
from without torchrun, and are read as data only: a planted metadata pickle runs nothing."""

from __future__ import annotations

import json
import pickle

import pytest
import torch
from conftest import (
    EVALUATE,
    NEEDS_GLOO,
    PREDICT,
    error_line,
    killed_at,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
    torchrun,
)

from utils.checkpoint.load import load_checkpoint
from utils.checkpoint.sharded_index import read_metadata

pytestmark = NEEDS_GLOO

# Blocks of the MLP (three linear layers) sharded across two processes; no dropout, so DDP and
# FSDP differ only in who holds which parameters. 1,248 training digits: whole global batches.
JOB = (
    "data.val_size=189",
    "model=mlp",
    "model.hidden_sizes=[64,64]",
    "model.dropout=0",
    "trainer.max_epochs=2",
    "trainer.accumulate_grad_batches=2",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.gradient_clip_val=1.0",  # the global norm, over every shard
)


def weights(cwd, run, name="last"):
    """A run's weights: of its sharded folder, or of its file (DDP)."""
    path = cwd / "checkpoints" / run / name
    return load_checkpoint(path if path.exists() else path.with_suffix(".pt"))["model"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("fsdp")
    torchrun(cwd, *JOB, "data.batch_size=16", "trainer.strategy=fsdp", "run_name=fsdp")
    torchrun(cwd, *JOB, "data.batch_size=16", "trainer.strategy=ddp", "run_name=ddp")
    return cwd


def test_fsdp_trains_as_ddp_does_holding_half_the_bytes_in_each_process(runs):
    fsdp, ddp = read_metrics(runs / "runs/fsdp"), read_metrics(runs / "runs/ddp")
    for key in ("test/acc", "val/acc", "test/loss"):
        assert abs(fsdp[key] - ddp[key]) <= 0.02, (key, fsdp[key], ddp[key])
    for key in ("memory/param_bytes_per_process", "memory/optimizer_bytes_per_process"):
        assert 0.45 <= fsdp[key] / ddp[key] <= 0.55, (key, fsdp[key], ddp[key])
    sharded = runs / "checkpoints/fsdp"
    assert sorted(p.name for p in (sharded / "last").iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "state.pt",
    ]
    assert (sharded / "best" / "state.pt").is_file() and not (sharded / "last.pt").exists()
    for name, tensor in weights(runs, "ddp").items():  # the same steps, sums in another order
        torch.testing.assert_close(weights(runs, "fsdp")[name], tensor, rtol=1e-4, atol=1e-5)


def test_evaluate_and_predict_read_the_sharded_best_without_torchrun(runs):
    tested = read_metrics(runs / "runs/fsdp")["test/acc"]
    best = str(runs / "checkpoints/fsdp/best")
    run_evaluate(runs, f"ckpt={best}")
    figures = json.loads(next((runs / "runs/eval").rglob("metrics.json")).read_text())
    assert figures[best]["test/acc"] == tested
    from PIL import Image

    folder = runs / "new"
    folder.mkdir()
    for index in range(5):  # 8×8 grey images, as the digits are
        Image.new("L", (8, 8), color=index * 50).save(folder / f"{index}.png")
    run_python(runs, str(PREDICT), "ckpt=checkpoints/fsdp", "input=new", "out=predicted.csv")
    assert len((runs / "predicted.csv").read_text().strip().splitlines()) == 6


@pytest.mark.slow
def test_a_kill_9_resumes_bit_identically_and_one_process_continues_the_stream(runs):
    job = (*JOB, "model._target_=signalling_model.mlp", "trainer.strategy=fsdp")
    torchrun(runs, *job, "data.batch_size=16", "run_name=straight")
    kill = killed_at(60)  # epoch 2, step 30
    for run in ("killed", "alone"):
        killed = torchrun(runs, *job, "data.batch_size=16", f"run_name={run}", ok=False, env=kill)
        assert killed.returncode != 0
    saved = load_checkpoint(runs / "checkpoints/killed/last", whole_weights=False)
    assert saved["global_step"] == 28 and saved["world_size"] == 2  # 19 steps an epoch
    torchrun(runs, *job, "data.batch_size=16", "run_name=killed", "resume=auto")
    straight, resumed = weights(runs, "straight"), weights(runs, "killed")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)  # bit for bit
    alone = run_train(runs, *job, "data.batch_size=32", "run_name=alone", "resume=auto")
    said = alone.stdout + alone.stderr
    assert "same global batch (32 samples): it continues the same sample stream" in said
    for name, tensor in straight.items():  # the same samples; sums in another order
        torch.testing.assert_close(weights(runs, "alone")[name], tensor, rtol=1e-4, atol=1e-5)


class _Runs:
    """A pickle that would run a command when loaded."""

    def __reduce__(self):
        import os

        return (os.system, ("touch PWNED",))


def test_a_planted_metadata_pickle_runs_nothing_and_is_one_line(runs, tmp_path):
    import shutil

    planted = tmp_path / "checkpoints" / "run" / "best"
    shutil.copytree(runs / "checkpoints/fsdp/best", planted)
    (planted / ".metadata").write_bytes(pickle.dumps(_Runs()))
    from PIL import Image

    Image.new("L", (8, 8)).save(tmp_path / "x.png")
    for script, extra in ((EVALUATE, ()), (PREDICT, ("input=x.png",))):
        result = run_python(tmp_path, str(script), f"ckpt={planted}", *extra, ok=False)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "would import posix.system" in error_line(result)
    result = run_train(tmp_path, "trainer.strategy=fsdp", f"resume={planted}", ok=False)
    assert result.returncode == 2 and "would import posix.system" in error_line(result)
    assert not (tmp_path / "PWNED").exists()
    assert sorted(p.name for p in planted.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "state.pt",
    ]  # nothing deleted


def _edit_index(metadata, change):
    """One edit of a sharded checkpoint's index, as a hostile or careless hand would make it."""
    import dataclasses

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    tensors = metadata.state_dict_metadata
    key = next(key for key in tensors if key.startswith("model.") and key.endswith("weight"))
    entry = tensors[key]
    chunk = entry.chunks[0]
    if change == "escape":
        for info in metadata.storage_data.values():
            info.relative_path = "../../etc/passwd"
    elif change == "object":
        tensors["model.extra"] = BytesStorageMetadata()
    elif change == "complex":
        entry.properties = dataclasses.replace(entry.properties, dtype=torch.complex64)
    elif change == "outside":
        chunk.sizes = torch.Size(n + 1 for n in chunk.sizes)
    elif change == "gap":  # chunks that leave most of the tensor unread
        chunk.sizes = torch.Size(1 for _ in chunk.sizes)
    elif change == "unstored":  # the second process's chunk moved up a row
        last = entry.chunks[-1]
        last.offsets = torch.Size([last.offsets[0] - 1, *last.offsets[1:]])
    elif change == "long":
        for info in metadata.storage_data.values():
            info.length += 10**6
    elif change == "overlap":  # the second process's rows read over the first's: half unread
        from torch.distributed.checkpoint.metadata import MetadataIndex

        last = entry.chunks[-1]
        stored = metadata.storage_data.pop(MetadataIndex(key, last.offsets))
        last.offsets = torch.Size(0 for _ in last.offsets)
        metadata.storage_data[MetadataIndex(key, last.offsets)] = stored
        entry.chunks[0].sizes, last.sizes = last.sizes, entry.chunks[0].sizes  # sums kept
    elif change == "shared":  # every entry names the largest record: counted once per entry
        largest = max(metadata.storage_data.values(), key=lambda info: info.length)
        for info in metadata.storage_data.values():
            info.relative_path, info.offset, info.length = (
                largest.relative_path,
                largest.offset,
                largest.length,
            )
    elif change == "vast":  # a size claimed far beyond the record that holds it
        entry.size = torch.Size([entry.size[0] * 4096, *entry.size[1:]])
        for chunk in entry.chunks:
            chunk.offsets = torch.Size([chunk.offsets[0] * 4096, *chunk.offsets[1:]])
            chunk.sizes = torch.Size([chunk.sizes[0] * 4096, *chunk.sizes[1:]])


@pytest.mark.parametrize(
    "change, said",
    [
        ("escape", "outside the folder"),
        ("object", "pickled object"),
        ("complex", "has the dtype torch.complex64"),
        ("outside", "has a chunk outside its size"),
        ("gap", "has chunks of"),
        ("unstored", "stored nowhere"),
        ("long", "shorter than its index says"),
        ("overlap", "that overlap"),
        ("shared", "records overlap"),
        ("vast", "of more values than its record holds"),
    ],
)
def test_an_edited_index_is_refused_in_one_line_before_a_tensor_is_read(
    runs, tmp_path, change, said
):
    """Each part of DCP's index a load relies on is checked first (an edit once gave a
    traceback, or read a tensor's unread part as zeros in silence)."""
    import shutil

    from utils.errors import UserError

    folder = tmp_path / "checkpoints" / "run" / "last"
    shutil.copytree(runs / "checkpoints/fsdp/last", folder)
    metadata = read_metadata(folder)
    _edit_index(metadata, change)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    with pytest.raises(UserError, match=said):
        read_metadata(folder)
    if change in ("complex", "long", "overlap"):  # and through the entry point, exit 2
        result = run_evaluate(tmp_path, f"ckpt={folder}", ok=False)
        assert result.returncode == 2 and said in error_line(result)


@pytest.mark.parametrize("damage", ["cut", "overwritten", "a byte changed"])
def test_a_damaged_tensor_file_is_one_line_and_nothing_is_lost(runs, tmp_path, damage):
    """A .distcp file cut short by a copy, overwritten at its start, or with one byte changed
    amid a tensor's values (read as another weight without a word before each tensor's
    checksums were checked): refused in one line by evaluate.py and by a resume (DCP's own
    error is a BaseException that once escaped as a traceback), the folder as it was."""
    import shutil

    folder = tmp_path / "checkpoints" / "run" / "best"
    shutil.copytree(runs / "checkpoints/fsdp/best", folder)
    shard = folder / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    if damage == "cut":
        data = data[:-100]
    elif damage == "overwritten":
        data[10:60] = b"x" * 50
    else:  # the middle of the file's largest tensor
        stored = read_metadata(folder).storage_data.values()
        item = max((i for i in stored if i.relative_path == shard.name), key=lambda i: i.length)
        data[item.offset + item.length // 2] ^= 0x5A
    shard.write_bytes(bytes(data))
    said = "shorter than its index says" if damage == "cut" else "damaged or were edited"
    result = run_evaluate(tmp_path, f"ckpt={folder}", ok=False)
    assert result.returncode == 2 and said in error_line(result), result.stderr[-2000:]
    job = (*JOB, "data.batch_size=16", "trainer.strategy=fsdp")
    resumed = run_train(tmp_path, *job, f"resume={folder}", ok=False)
    assert resumed.returncode == 2 and said in error_line(resumed)
    assert shard.read_bytes() == bytes(data)
    assert sorted(p.name for p in folder.iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
        "state.pt",
    ]


def test_a_save_cut_short_leaves_the_previous_checkpoint_whole(tmp_path):
    """The moments a kill can hit a save: the new folder half-written; the old one renamed
    aside before the new one took its name. Each time a whole one is found and read."""
    from utils.checkpoint.sharded import METADATA, STATE_FILE, complete_folder, replace_folder

    def whole(path, tag):
        path.mkdir()
        (path / METADATA).write_text(tag)
        (path / STATE_FILE).write_text(tag)

    last = tmp_path / "last"
    whole(last, "old")
    partial = tmp_path / "last.partial"
    partial.mkdir()
    (partial / METADATA).write_text("new")  # DCP done, the state not yet written
    assert complete_folder(last) == last
    (partial / STATE_FILE).write_text("new")
    last.rename(tmp_path / "last.old")  # killed between the two renames
    assert complete_folder(last) == tmp_path / "last.old"
    replace_folder(partial, last)  # the next save
    assert (last / STATE_FILE).read_text() == "new" and not (tmp_path / "last.old").exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("trainer.ema.decay=0.99", "trainer.ema.decay"),
        ("trainer.keep_top_k=2", "trainer.keep_top_k"),
        ("trainer.compile=true", "trainer.compile"),
        ("precision=fp16", "precision=fp16"),
    ],
)
def test_what_fsdp_does_not_carry_is_refused_at_start_up(tmp_path, override, key):
    result = run_train(tmp_path, "trainer.strategy=fsdp", override, ok=False)
    assert result.returncode == 2 and key in error_line(result)
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").rglob("*"))


def test_one_process_shards_over_a_group_of_one_and_every_run_reports_its_bytes(tmp_path):
    run_train(tmp_path, "trainer.strategy=fsdp", "trainer.max_epochs=1", "run_name=one")
    run_train(tmp_path, "trainer.max_epochs=1", "run_name=plain")
    one, plain = read_metrics(tmp_path / "runs/one"), read_metrics(tmp_path / "runs/plain")
    assert one["memory/param_bytes_per_process"] == plain["memory/param_bytes_per_process"] > 0
    assert (
        plain["memory/optimizer_bytes_per_process"] >= 2 * plain["memory/param_bytes_per_process"]
    )
    assert (tmp_path / "checkpoints/one/last/state.pt").is_file()


def test_activation_checkpointing_keeps_the_loss_and_consolidate_writes_one_whole_file(tmp_path):
    pytest.importorskip("safetensors")
    job = ("trainer.strategy=fsdp", "trainer.max_epochs=1", "model=mlp", "model.dropout=0")
    run_train(tmp_path, *job, "run_name=plain", "trainer.fsdp.consolidate=true")
    run_train(tmp_path, *job, "run_name=recomputed", "trainer.activation_checkpointing=true")
    plain, recomputed = weights(tmp_path, "plain"), weights(tmp_path, "recomputed")
    for name, tensor in plain.items():  # recomputed activations: the same gradients
        torch.testing.assert_close(recomputed[name], tensor, rtol=0, atol=1e-6)
    whole = tmp_path / "checkpoints/plain/best.safetensors"
    run_evaluate(tmp_path, f"ckpt={whole}")
    figures = json.loads(next((tmp_path / "runs/eval").rglob("metrics.json")).read_text())
    assert figures[str(whole)]["test/acc"] == read_metrics(tmp_path / "runs/plain")["test/acc"]
