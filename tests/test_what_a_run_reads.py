"""What a run reads, as an attacker or a careless user would give it (what it stores is in
tests/test_what_a_run_stores.py): values that would hang a step, outputs that would replace
inputs, runs of one name at once, caches that evict each other or lie about their pixels, tables
that leak the answer or drop a column, arrays that lie about their size, names that are markup
or formulas, messages that name the cause, and costs out of proportion."""

from __future__ import annotations

import csv
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    EVALUATE,
    HELPERS,
    PREDICT,
    ROOT,
    classes_table,
    error_line,
    read_metrics,
    run_python,
    run_train,
    slow,
    write_idx,
    write_imagefolder,
    write_rows,
)

from utils.system.claim import CLAIM_FILE

TINY = ("model.hidden_sizes=[16]", "data.batch_size=64", "trainer.max_epochs=1")
CACHED = (
    "data=imagefolder",
    "data.image_size=[10,12]",
    "data.batch_size=6",
    "data.num_workers=0",
    "data.cache=disk",
    "model=cnn",
    "trainer.max_epochs=1",
    "scheduler=none",
)


# --- 1. Hangs: values bounded where they enter; a stop signal answered by long phases ----------


@pytest.mark.parametrize(
    "override",
    [
        "trainer.gradient_clip_val=inf",
        *slow(
            "data.augment.mixup_alpha=inf",
            "data.augment.cutmix_alpha=1e308",
            "data.augment.mixup_alpha=nan",
            "data.augment.mix_prob=nan",
            "task.label_smoothing=nan",
        ),
    ],
)
def test_an_infinite_or_nan_value_is_refused_before_any_step(tmp_path, override):
    # The first in a separate process under a timeout: before the fix, an infinite alpha
    # never finished a step and ignored SIGTERM.
    alone = override == "data.augment.mixup_alpha=inf"
    result = run_train(tmp_path, *TINY, override, ok=False, process=alone, timeout=120)
    assert override.split("=")[0] in error_line(result)


def test_a_second_sigterm_ends_whatever_is_running(tmp_path):
    from utils.system.signals import StopRequest

    with StopRequest() as stop, pytest.raises(SystemExit) as exited:
        os.kill(os.getpid(), signal.SIGTERM)  # the first: finish the step, then save
        assert stop.requested
        os.kill(os.getpid(), signal.SIGTERM)  # the second: a step that never ends is ended
    assert exited.value.code == 128 + signal.SIGTERM


def stopped_while_setting_up(cwd: Path, run_name: str, *overrides: str) -> str:
    """``train.py OVERRIDES`` sent SIGTERM once it has claimed its folder (set up, nothing
    decoded yet: the signal is held until the first long phase reads it); exit 3, its output.
    The run is held after its claim until the signal is sent (tests/helpers/held_start.py), so
    no start-up is too quick for it."""
    go = cwd / f"{run_name}.go"
    held = ("+hydra.callbacks.held._target_=held_start.HeldStart",)
    run = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *overrides, f"run_name={run_name}", *held],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(HELPERS), "HELD_UNTIL": str(go)},
    )
    wait_for_claim(cwd / "runs" / run_name)
    run.send_signal(signal.SIGTERM)
    go.touch()
    out, err = run.communicate(timeout=300)
    assert run.returncode == 3, err[-3000:]
    return out + err


@pytest.mark.slow  # its own processes
def test_a_stop_during_an_image_cache_build_ends_it_and_keeps_nothing(tmp_path):
    root = write_imagefolder(tmp_path / "images", per_class=4)
    said = stopped_while_setting_up(
        tmp_path, "c", *CACHED, f"data.root={root}", f"data.cache_dir={tmp_path}/cache"
    )
    assert "SIGTERM received while decoding train once into the cache (0/" in said
    assert "the next run builds the cache again" in said
    # no step ran, and none is finished: the line at the signal said one was
    assert "SIGTERM received during set-up, before any step" in said
    assert "finishing this step" not in said
    assert not list((tmp_path / "cache").iterdir())  # no cache, no temporary file
    assert not (tmp_path / "checkpoints" / "c" / "last.pt").exists()


@pytest.mark.slow  # its own processes
def test_a_stop_during_the_statistics_pass_without_a_cache_names_no_cache(tmp_path):
    root = write_imagefolder(tmp_path / "images", per_class=4)
    uncached = [o for o in CACHED if not o.startswith("data.cache=")]
    said = stopped_while_setting_up(
        tmp_path, "s", *uncached, "data.cache=off", f"data.root={root}", "data.mean=auto"
    )
    assert "SIGTERM received while decoding train for data.mean/std=auto (0/" in said
    assert "cache" not in next(line for line in said.splitlines() if "received while" in line)


# --- 2. Outputs never replace inputs; one run per folder at a time ---------------------------


@pytest.fixture(scope="module")
def table_run(tmp_path_factory) -> Path:
    """A finished tiny run on a CSV table (checkpoints/t), with a folder beside it."""
    cwd = tmp_path_factory.mktemp("table")
    classes_table(cwd / "table.csv", ["x", "z"])
    run_train(cwd, "data=csv", "data.path=table.csv", "data.target=y", *TINY, "run_name=t")
    (cwd / "pictures").mkdir()
    return cwd


@pytest.mark.parametrize(
    "out",
    [
        "table.csv",
        "checkpoints/t/best.pt",
        *slow("pictures", "p.json", "./checkpoints/../table.csv"),
    ],
)
def test_predict_refuses_to_write_over_its_own_inputs(table_run, out):
    before = {
        p: p.read_bytes() for p in (table_run / "table.csv", table_run / "checkpoints/t/best.pt")
    }
    result = run_python(
        table_run,
        str(PREDICT),
        "ckpt=checkpoints/t/best.pt",
        "input=table.csv",
        f"out={out}",
        ok=False,
    )
    assert f"out={Path(out)}" in error_line(result)
    assert {p: p.read_bytes() for p in before} == before


HOLDER = """
import sys, time
sys.path.insert(0, {root!r})
from pathlib import Path
from utils.system.claim import RunClaim
RunClaim.take(Path(sys.argv[1]), sys.argv[2])
print("claimed", flush=True)
time.sleep(600)
"""


def hold_claim(folder: Path, what: str = "run") -> subprocess.Popen:
    """Another process that holds ``folder``'s claim as a run of train.py does, until killed."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(root=str(ROOT)), str(folder), what],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "claimed"
    return holder


def wait_for_claim(run_dir: Path) -> Path:
    """The claim file of ``run_dir`` once a starting ``train.py`` has written it: the run has
    imported torch and caught stop signals, and built nothing yet."""
    claim = run_dir / CLAIM_FILE
    for _ in range(1200):
        if claim.is_file() and claim.read_text():
            return claim
        time.sleep(0.1)
    raise AssertionError(f"{claim} was never written")


def test_two_runs_of_one_name_at_once_one_runs_the_other_names_it(tmp_path):
    first = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *TINY, "run_name=x"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    claim = wait_for_claim(tmp_path / "runs" / "x")
    first.send_signal(signal.SIGSTOP)  # held mid-run, however fast this machine is
    try:
        second = run_train(tmp_path, *TINY, "run_name=x", ok=False)
        line = error_line(second)
        assert f"in use by a run (process {first.pid} on {socket.gethostname()}" in line
        resumed = run_train(tmp_path, *TINY, "run_name=x", "resume=auto", ok=False)
        assert "in use by a run" in error_line(resumed)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-3000:]
    assert read_metrics(tmp_path / "runs" / "x")["status"] == "completed"
    assert claim.read_text() == ""  # a clean end lets go


@pytest.mark.slow  # its own processes
def test_a_killed_holder_leaves_a_claim_the_next_run_takes_over_in_one_line(tmp_path):
    holder = hold_claim(tmp_path / "runs" / "y")
    holder.kill()
    holder.wait()
    result = run_train(tmp_path, *TINY, "run_name=y")
    taken = [
        line
        for line in result.stderr.splitlines() + result.stdout.splitlines()
        if "taking over the claim" in line
    ]
    assert len(taken) == 1 and f"process {holder.pid}" in taken[0]


@pytest.mark.slow
def test_a_sweep_of_a_name_in_use_stops_before_any_job(tmp_path):
    holder = hold_claim(tmp_path / "runs" / "s", "sweep")
    try:
        result = run_train(tmp_path, "-m", *TINY, "run_name=s", "seed=0,1", ok=False)
        assert "runs/s is in use by a sweep" in error_line(result)
        assert not (tmp_path / "runs" / "s" / "0").exists()
        single = run_train(tmp_path, *TINY, "run_name=s", ok=False)  # its folder too
        assert "in use by a sweep" in error_line(single)
    finally:
        holder.kill()
        holder.wait()


def test_a_checkpoint_folder_is_claimed_whatever_paths_runs_says(tmp_path):
    # Another paths.runs with the same paths.checkpoints is the same checkpoint folder: one
    # run's best.pt would replace the other's.
    holder = hold_claim(tmp_path / "checkpoints" / "x")
    try:
        result = run_train(tmp_path, *TINY, "run_name=x", "paths.runs=elsewhere", ok=False)
        assert "checkpoints/x is in use by a run" in error_line(result)
        assert not list((tmp_path / "checkpoints" / "x").glob("*.pt"))
    finally:
        holder.kill()
        holder.wait()


def test_a_resume_never_continues_over_another_run(tmp_path):
    run_train(tmp_path, *TINY, "run_name=a")
    run_train(tmp_path, *TINY, "run_name=b")
    b = tmp_path / "checkpoints" / "b"
    before = {
        p.name: p.read_bytes()
        for p in (*b.glob("*.pt"), tmp_path / "runs/b/metrics.csv")
        if p.is_file()
    }
    result = run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=2",
        "run_name=b",
        "resume=checkpoints/a/last.pt",
        ok=False,
    )
    line = error_line(result)
    assert "checkpoints/b: that folder holds another run" in line and "run_name=a" in line
    after = {
        p.name: p.read_bytes()
        for p in (*b.glob("*.pt"), tmp_path / "runs/b/metrics.csv")
        if p.is_file()
    }
    assert after == before
    # A moved copy of the same run continues it (the same tracking token).
    (tmp_path / "backup").mkdir()
    (tmp_path / "backup" / "last.pt").write_bytes((tmp_path / "checkpoints/a/last.pt").read_bytes())
    run_train(tmp_path, *TINY, "trainer.max_epochs=2", "run_name=a", "resume=backup/last.pt")
    assert read_metrics(tmp_path / "runs" / "a")["epochs"] == 2


def test_two_evaluations_in_one_second_keep_their_own_folders(tmp_path):
    run_train(tmp_path, *TINY, "run_name=e")
    same_second = {"TORCHLOOM_RUN_TIMESTAMP": "2026-01-01_00-00-00"}
    for split in ("test", "val"):
        run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/e", f"split={split}", env=same_second)
    folders = sorted((tmp_path / "runs" / "eval").iterdir())
    assert [f.name for f in folders] == ["2026-01-01_00-00-00", "2026-01-01_00-00-00_2"]
    splits = [next(iter(read_metrics(f).values())) for f in folders]
    assert "test/acc" in splits[0] and "val/acc" in splits[1]


# --- 2b. Image caches: own temporaries cleaned, one source per file name, content checked ----


def cache_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_image_folders_sharing_a_cache_dir_keep_their_own_caches(tmp_path):
    for name in ("a", "b"):
        write_imagefolder(tmp_path / name, per_class=3, test=False)
    shared = tmp_path / "shared"
    dead = shared / f".train-3x10x12-x.u8.{socket.gethostname()}-999999999.abc.tmp"
    shared.mkdir()
    dead.write_bytes(b"half a cache")  # a killed build's temporary file
    for name in ("a", "b", "a"):
        run_train(
            tmp_path,
            *CACHED,
            f"data.root={name}",
            f"data.cache_dir={shared}",
            f"run_name={name}",
            "overwrite=true",
        )
    names = cache_files(shared)
    assert len(names) == 4, names  # train and val of each folder: none evicted the other's
    assert not dead.exists()
    second = run_train(tmp_path, *CACHED, "data.root=b", f"data.cache_dir={shared}", "run_name=b2")
    assert "decoding" not in second.stdout + second.stderr  # b's caches were still there


def test_a_stale_manifest_cache_is_replaced_not_kept(tmp_path):
    from PIL import Image

    (tmp_path / "pics").mkdir()
    rows = []
    for i in range(24):
        Image.fromarray(torch.full((10, 12, 3), 9 * i, dtype=torch.uint8).numpy()).save(
            tmp_path / "pics" / f"{i}.png"
        )
        rows.append([f"pics/{i}.png", "ab"[i % 2]])
    write_rows(tmp_path / "labels.csv", ["path", "label"], rows)
    run = (
        "data=image_csv",
        "data.root=.",
        "data.manifest=labels.csv",
        "data.image_size=[10,12]",
        "data.batch_size=6",
        "data.num_workers=0",
        "data.cache=disk",
        "model=cnn",
        "trainer.max_epochs=1",
        "overwrite=true",
        "run_name=m",
    )
    run_train(tmp_path, *run)
    first = cache_files(tmp_path / ".torchloom-cache")
    Image.fromarray(torch.zeros(10, 12, 3, dtype=torch.uint8).numpy()).save(tmp_path / "pics/0.png")
    os.utime(tmp_path / "pics/0.png", ns=(1, 1))  # changed: another mtime and content
    run_train(tmp_path, *run)
    second = cache_files(tmp_path / ".torchloom-cache")
    assert len(second) == len(first) and second != first  # the stale ones were removed


@pytest.mark.parametrize("cache", ["disk", "auto"])
def test_a_touched_image_leaves_one_cache_of_its_split(tmp_path, cache):
    write_imagefolder(tmp_path / "a", per_class=3, test=False)
    run = [
        *[o for o in CACHED if not o.startswith("data.cache=")],
        f"data.cache={cache}",
        "data.root=a",
        "overwrite=true",
        "run_name=t",
    ]
    run_train(tmp_path, *run)
    first = cache_files(tmp_path / "a" / ".torchloom-cache")
    touched = next((tmp_path / "a" / "train").rglob("*.png"))
    later = time.time_ns() + 10**9
    os.utime(touched, ns=(later, later))  # a new mtime, the same name and pixels
    result = run_train(tmp_path, *run)
    assert "the image folder changed" in result.stdout + result.stderr
    second = cache_files(tmp_path / "a" / ".torchloom-cache")
    assert len([n for n in second if n.startswith("train-")]) == 1, second
    assert len(second) == len(first) and second != first


def test_a_planted_cache_of_the_right_size_but_other_pixels_is_rebuilt(tmp_path):
    write_imagefolder(tmp_path / "a", per_class=3, test=False)
    run_train(tmp_path, *CACHED, "data.root=a", "run_name=p")
    cache = tmp_path / "a" / ".torchloom-cache"
    train = next(p for p in cache.iterdir() if p.name.startswith("train-"))
    original = train.read_bytes()
    planted = original[:4096] + bytes(255 - b for b in original[4096:])  # same header and size
    train.write_bytes(planted)
    result = run_train(tmp_path, *CACHED, "data.root=a", "run_name=p2")
    said = result.stdout + result.stderr
    assert "is damaged (its image 0 does not match the hash written with it" in said
    assert "rebuilding it" in said and train.read_bytes() == original


# --- 3. Silently wrong results are refused, or right --------------------------------------


@pytest.mark.parametrize(
    "header, extra, message",
    [
        (["a", "b", "a", "y"], [], "names column 'a' 2 times"),
        (["a", "b", "y"], ["data.categorical=[y]"], "also listed in data.categorical"),
        *slow(
            (["a", "b", "y"], ["data.features=[a,y]"], "also listed in data.features"),
            (["a", "b", "y"], ["data.features=[]"], "data.features=[] names no column"),
        ),
    ],
)
def test_a_table_that_would_leak_or_drop_a_column_is_refused(tmp_path, header, extra, message):
    rows = [
        [str(i % 7), str(i % 3)] + ([str(i)] if len(header) == 4 else []) + ["pq"[i % 2]]
        for i in range(60)
    ]
    write_rows(tmp_path / "t.csv", header, rows)
    result = run_train(
        tmp_path, "data=csv", "data.path=t.csv", "data.target=y", *TINY, *extra, ok=False
    )
    assert message in error_line(result)


def test_a_bom_is_not_part_of_the_first_column_name(tmp_path):
    classes_table(tmp_path / "t.csv", ["x", "z"], encoding="utf-8-sig")
    run_train(
        tmp_path,
        "data=csv",
        "data.path=t.csv",
        "data.target=y",
        "data.features=[a,b]",
        *TINY,
        "run_name=bom",
    )
    classes_table(tmp_path / "new.csv", ["x", "z"], rows=5)  # no BOM: the same columns
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/bom", "input=new.csv", "out=p.csv")


@pytest.mark.parametrize("source", ["csv", *slow("imagefolder", "tensors")])
def test_a_classifier_with_one_class_is_refused_naming_where(tmp_path, source):
    if source == "csv":
        classes_table(tmp_path / "t.csv", ["only"])
        how, where = ["data=csv", "data.path=t.csv", "data.target=y"], "column 'y' hold 1 classes"
    elif source == "imagefolder":
        write_imagefolder(tmp_path / "f", classes=("cat",), per_class=4, test=False)
        how = ["data=imagefolder", "data.root=f", "data.image_size=[10,12]", "data.batch_size=2"]
        where = "1 classes ('cat')"
    else:
        torch.save(
            {"x": torch.randn(80, 3), "y": torch.zeros(80, dtype=torch.long)}, tmp_path / "a.pt"
        )
        how, where = ["data=tensors", "data.path=a.pt", "data.batch_size=8"], "1 classes"
    result = run_train(tmp_path, *TINY, *how, ok=False)
    assert where in error_line(result) and "needs 2 or more" in error_line(result)


def test_an_idx_file_with_more_images_than_labels_is_refused(tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    write_idx(raw / "train-images-idx3-ubyte", torch.zeros(40, 28, 28).numpy())
    write_idx(raw / "train-labels-idx1-ubyte", (torch.arange(30) % 10).numpy())
    write_idx(raw / "t10k-images-idx3-ubyte", torch.zeros(10, 28, 28).numpy())
    write_idx(raw / "t10k-labels-idx1-ubyte", (torch.arange(10) % 10).numpy())
    result = run_train(tmp_path, "data=mnist", "data.root=.", *TINY, ok=False)
    assert "40 images and its labels file 30 labels" in error_line(result)


def test_predicted_values_are_written_in_full(tmp_path):
    rows = [[repr(i / 10), repr(1.2e8 + 1000 * i + 0.25)] for i in range(80)]
    write_rows(tmp_path / "r.csv", ["a", "price"], rows)
    run_train(
        tmp_path,
        "task=regression",
        "data=csv",
        "data.path=r.csv",
        "data.target=price",
        *TINY,
        "data.batch_size=16",
        "trainer.max_epochs=3",
        "run_name=r",
    )
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/r", "input=r.csv", "out=p.csv")
    with open(tmp_path / "p.csv") as f:
        values = [row["price"] for row in csv.DictReader(f)]
    assert all(float(v) == float(repr(float(v))) and "e+" not in v for v in values)
    assert len(set(values)) > 40  # not one rounded 1.2e+08 for every row


def test_an_early_stopped_run_resumed_without_patience_trains_on(tmp_path):
    stopping = ("trainer.early_stopping.patience=1", "trainer.early_stopping.min_delta=1.0")
    run_train(tmp_path, *TINY, "trainer.max_epochs=6", *stopping, "run_name=e")
    assert read_metrics(tmp_path / "runs/e")["stopped_early_at_epoch"] == 2
    resumed = run_train(
        tmp_path,
        *TINY,
        "trainer.max_epochs=4",
        "run_name=e",
        "resume=auto",
        "trainer.early_stopping.patience=null",
    )
    assert "now lets it go on" in resumed.stdout + resumed.stderr
    metrics = read_metrics(tmp_path / "runs/e")
    assert metrics["epochs"] == 4 and metrics["early_stopping"] is None


# --- 3b. Arrays: one width, labels that are indices, views backed by bytes ------------


@pytest.mark.parametrize(
    "arrays, message",
    [
        (
            {
                "x": torch.randn(80, 4),
                "y": torch.arange(80) % 2,
                "x_val": torch.randn(20, 5),
                "y_val": torch.arange(20) % 2,
            },
            "x_val has samples of shape [5]",
        ),
        *slow(
            (
                {
                    "x": torch.randn(80, 4),
                    "y": torch.cat([torch.arange(79) % 2, torch.tensor([10**9])]),
                },
                "1,000,000,001 classes",
            ),
            (
                {
                    "x": torch.zeros(4).as_strided((10**6, 10**6), (0, 0)),
                    "y": torch.zeros(10**6, dtype=torch.long),
                },
                "declares 1,000,000,000,000 values",
            ),
        ),
    ],
)
def test_arrays_of_another_width_a_vast_label_or_a_hollow_view_are_refused(
    tmp_path, arrays, message
):
    torch.save(arrays, tmp_path / "a.pt")
    result = run_train(
        tmp_path, "data=tensors", "data.path=a.pt", *TINY, "data.batch_size=8", ok=False
    )
    assert message in error_line(result)


# --- 4. Names from data are text on the terminal and in spreadsheets -------------------------

HOSTILE_NAMES = ["[/b]", "[cat]", "=1+1", "@cmd", "red\x1b[31m"]


def test_class_names_are_shown_escaped_and_written_as_spreadsheet_text(tmp_path):
    classes_table(tmp_path / "t.csv", HOSTILE_NAMES, rows=200)
    run_train(tmp_path, "data=csv", "data.path=t.csv", "data.target=y", *TINY, "run_name=n")
    evaluated = run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/n")
    for name in ("[/b]", "[cat]", "=1+1", "@cmd", "red\\x1b[31m"):
        assert name in evaluated.stdout
    assert "\x1b[31m" not in evaluated.stdout
    predicted = run_python(
        tmp_path, str(PREDICT), "ckpt=checkpoints/n", "input=t.csv", "out=p.csv", "topk=5"
    )
    assert "\x1b[31m" not in predicted.stdout and "[/b]" in predicted.stdout
    with open(tmp_path / "p.csv") as f:
        cells = {cell for row in list(csv.reader(f))[1:] for cell in row[1::2]}
    assert {"'=1+1", "'@cmd", "[/b]", "[cat]"} <= cells
    assert not any(cell.startswith(("=", "+", "-", "@")) for cell in cells)


def test_predicts_unseen_flags_are_spreadsheet_text_too(tmp_path):
    """The 'unseen' column names a category column and the value training never saw: both
    come from CSV files, so a column named like a formula is written as text there too."""
    header = ['=HYPERLINK("http://x")', "@size", "y"]
    rows = [[["red", "blue"][i % 2], str(i % 5), "ab"[i % 2]] for i in range(60)]
    write_rows(tmp_path / "t.csv", header, rows)
    run_train(tmp_path, "data=csv", "data.path=t.csv", "data.target=y", *TINY, "run_name=u")
    write_rows(tmp_path / "new.csv", header, [["green", "-3", "a"], ["red", "1", "b"]])
    run_python(tmp_path, str(PREDICT), "ckpt=checkpoints/u", "input=new.csv", "out=p.csv")
    with open(tmp_path / "p.csv") as f:
        written = list(csv.reader(f))
    assert written[0][-1] == "unseen"
    assert written[1][-1] == '\'=HYPERLINK("http://x")=green' and written[2][-1] == ""
    assert not any(cell.startswith(("=", "+", "@")) for row in written for cell in row)


# --- 7. Messages that name the cause -------------------------------------------------------


def test_empty_label_sets_and_infinite_class_weights_name_the_data_and_the_key(tmp_path):
    write_rows(tmp_path / "m.csv", ["a", "tags"], [[str(i % 7), ""] for i in range(60)])
    empty = run_train(
        tmp_path,
        "task=multilabel",
        "data=csv",
        "data.path=m.csv",
        "data.target=tags",
        *TINY,
        "data.batch_size=8",
        ok=False,
    )
    assert "column 'tags' hold 0 label sets" in error_line(empty)
    weights = run_train(tmp_path, *TINY, "task.class_weights=[1,1,1,1,1,1,1,1,1,inf]", ok=False)
    assert "task.class_weights" in error_line(weights)


# --- 8. Cost in proportion ------------------------------------------------------------------


def test_the_confusion_image_stays_small_for_many_classes():
    from utils.evaluation.tables import MAX_IMAGE_SIDE, confusion_image

    assert confusion_image(torch.ones(10, 10, dtype=torch.long)).shape == (1, 120, 120)
    assert max(confusion_image(torch.ones(600, 600, dtype=torch.long)).shape) <= MAX_IMAGE_SIDE
    assert confusion_image(torch.ones(1000, 1000, dtype=torch.long)).shape == (1, 1000, 1000)
