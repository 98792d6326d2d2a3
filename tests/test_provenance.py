"""What produced a run (runs/<run>/provenance.json, checkpoint["provenance"]), and what the data
fingerprint guards: a resume on changed data, an evaluation on a split that is not the one
training held out, a prediction traced to its checkpoint and inputs; compare.py on two runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import (
    PREDICT,
    QUIET,
    ROOT,
    TRAIN,
    checkpoint,
    error_line,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
    write_imagefolder,
    write_table,
)
from PIL import Image

from data.batching.fingerprint import changes, membership, overlap, sample_hashes

TABLE = ("data=csv", "data.path=table.csv", "data.target=kind", "data.categorical=[colour]")
QUICK = ("trainer.max_epochs=1", "model.hidden_sizes=[16]")


def provenance(cwd, run_name):
    return json.loads((cwd / "runs" / run_name / "provenance.json").read_text())


def test_sample_hashes_follow_content_not_order():
    inputs = torch.arange(60, dtype=torch.uint8).reshape(10, 6)
    labels = torch.arange(10)
    hashes = sample_hashes(inputs, labels)
    assert len(set(hashes.tolist())) == 10 and hashes.dtype == torch.int64
    shuffled = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    assert membership(sample_hashes(inputs[shuffled], labels[shuffled])) == membership(hashes)
    edited = inputs.clone()
    edited[3, 2] += 1  # one byte of one sample
    assert changes(hashes, sample_hashes(edited, labels)) == (1, 1)
    relabelled = labels.clone()
    relabelled[0] = 9
    assert changes(hashes, sample_hashes(inputs, relabelled)) == (1, 1)
    assert overlap(hashes[:4], hashes[2:]) == 2
    # A memory-mapped array (an image cache) hashes as the tensor it holds, in chunks.
    assert torch.equal(sample_hashes(inputs.numpy(), labels), hashes)


def test_the_default_run_records_what_produced_it(tmp_path):
    run_train(tmp_path, *QUICK, "run_name=p", env={"API_TOKEN": "hunter2-s3cr3t"})
    record = provenance(tmp_path, "p")
    assert list(record) == ["command", "code", "packages", "machine", "data", "attempts"]
    assert record["command"]["overrides"] == [*QUICK, "run_name=p", *QUIET[str(TRAIN)]]
    assert record["command"]["seed"] == 0
    assert record["packages"]["torch"] == metadata.version("torch")
    assert record["machine"]["torch"] == torch.__version__ and record["machine"]["world_size"] == 1
    splits = record["data"]["splits"]
    assert {name: s["count"] for name, s in splits.items()} == {
        "train": 1257,
        "val": 180,
        "test": 360,
    }
    assert "digits" in record["data"]["sources"] and "samples" not in record["data"]
    assert len(record["attempts"]) == 1 and record["attempts"][0]["resumed_from"] is None
    saved = checkpoint(tmp_path, "p")["provenance"]
    assert saved["data"]["splits"] == splits and len(saved["data"]["samples"]["train"]) == 1257
    assert "hunter2" not in (tmp_path / "runs" / "p" / "provenance.json").read_text()
    # A resume keeps the first record and adds an attempt.
    run_train(
        tmp_path, "trainer.max_epochs=2", "model.hidden_sizes=[16]", "run_name=p", "resume=auto"
    )
    again = provenance(tmp_path, "p")
    assert again["command"] == record["command"] and len(again["attempts"]) == 2
    assert again["attempts"][1]["resumed_from"].endswith("last.pt")


def test_a_resume_on_changed_data_is_refused_saying_what_changed(tmp_path):
    table = write_table(tmp_path / "table.csv")
    run_train(tmp_path, *TABLE, *QUICK, "run_name=t")
    resume = (
        *TABLE,
        "trainer.max_epochs=2",
        "model.hidden_sizes=[16]",
        "run_name=t",
        "resume=auto",
    )
    lines = table.read_text().splitlines()
    # touch: the same bytes, a newer time: accepted.
    os.utime(table, (1, 1))
    run_train(tmp_path, *resume[:-2], "trainer.max_epochs=1", "run_name=t", "resume=auto")
    # One cell edited: one sample changed, in whichever split holds the row.
    size = lines[5].split(",")
    lines[5] = ",".join([f"{float(size[0]) + 1:.4f}", *size[1:]])
    table.write_text("\n".join(lines) + "\n")
    line = error_line(run_train(tmp_path, *resume, ok=False))
    assert "the data changed since" in line and "1 sample(s) added, 1 removed" in line
    assert "resume_allow_changes=true" in line
    assert checkpoint(tmp_path, "t")["epoch"] == 1  # nothing trained, nothing saved
    # Allowed: it goes on, and the attempt records the change.
    run_train(tmp_path, *resume, "resume_allow_changes=true")
    attempts = provenance(tmp_path, "t")["attempts"]
    changed = attempts[-1]["data_changes"]
    assert (
        sum(c["added"] for c in changed.values()) == 1 and checkpoint(tmp_path, "t")["epoch"] == 2
    )


def test_a_resume_on_an_image_folder_with_one_image_more_is_refused(tmp_path):
    root = write_imagefolder(tmp_path / "pics")
    folder = (
        "data=imagefolder",
        f"data.root={root}",
        "data.image_size=[8,8]",
        "data.batch_size=8",
        "model=mlp",
    )
    run_train(tmp_path, *folder, *QUICK, "run_name=i")
    pixels = np.full((10, 12, 3), 7, dtype=np.uint8)
    Image.fromarray(pixels).save(root / "train" / "cat" / "new.png")
    result = run_train(
        tmp_path,
        *folder,
        "trainer.max_epochs=2",
        "model.hidden_sizes=[16]",
        "run_name=i",
        "resume=auto",
        ok=False,
    )
    assert "train: 1 sample(s) added, 0 removed" in error_line(result)


def test_a_resume_with_data_cache_off_compares_the_images_too(tmp_path):
    """data.cache=off (read lazily, not hashed) on changed images went on without a word, and
    memory to off on unchanged images was refused as "the data changed"."""
    root = write_imagefolder(tmp_path / "pics")
    folder = ("data=imagefolder", f"data.root={root}", "data.image_size=[8,8]", "model=mlp")
    folder += ("data.batch_size=8", "data.num_workers=0")
    again = ("trainer.max_epochs=2", "model.hidden_sizes=[16]", "resume=auto")
    run_train(tmp_path, *folder, *QUICK, "run_name=m", "data.cache=memory")
    run_train(tmp_path, *folder, *again, "run_name=m", "data.cache=off")  # unchanged: goes on
    assert checkpoint(tmp_path, "m")["epoch"] == 2
    run_train(tmp_path, *folder, *QUICK, "run_name=o", "data.cache=off")
    edited = root / "train" / "dog" / "2.png"
    Image.fromarray(np.full((10, 12, 3), 9, dtype=np.uint8)).save(edited)
    lazy = error_line(
        run_train(tmp_path, *folder, *again, "run_name=o", "data.cache=off", ok=False)
    )
    assert "the data changed since" in lazy and "train: its image files differ" in lazy
    cached = error_line(
        run_train(tmp_path, *folder, *again, "run_name=m", "data.cache=memory", ok=False)
    )
    assert "train: 1 sample(s) added, 1 removed" in cached  # content against content


def test_evaluate_says_whether_the_split_is_the_one_training_held_out(tmp_path):
    table = write_table(tmp_path / "table.csv", rows=200)
    test = write_table(tmp_path / "test.csv", rows=60, seed=1)
    given = (*TABLE, "data.split.test_path=test.csv")
    run_train(tmp_path, *given, *QUICK, "run_name=e")
    best = tmp_path / "checkpoints" / "e" / "best.pt"
    result = run_evaluate(tmp_path, f"ckpt={best}", "runs=eval1")
    first = read_metrics(next((tmp_path / "eval1" / "eval").glob("*")))[str(best)]
    assert first["split_matches_training"] is True and first["overlap_with_training"] == 0
    assert "the same samples as training's test split" in result.stdout
    # Training rows appended to the test file: another split, and some of it trained on.
    test.write_text(test.read_text() + "\n".join(table.read_text().splitlines()[1:]) + "\n")
    result = run_evaluate(tmp_path, f"ckpt={best}", "runs=eval2")
    second = read_metrics(next((tmp_path / "eval2" / "eval").glob("*")))[str(best)]
    trained = checkpoint(tmp_path, "e")["provenance"]["data"]["splits"]["train"]["count"]
    assert second["split_matches_training"] is False
    assert second["overlap_with_training"] == trained
    assert f"{trained} of its {60 + 200} samples were trained on" in result.stdout


def test_a_model_of_ones_own_is_hashed_by_its_file(tmp_path):
    own = (
        "model=mlp",
        "model._target_=examples_net.linear",
        "~model.hidden_sizes",
        "~model.dropout",
    )
    run_train(tmp_path, "trainer.max_epochs=1", "run_name=own", *own, "~model.init")
    (module,) = provenance(tmp_path, "own")["code"]["modules"].values()
    assert module["path"].endswith("examples_net.py")
    assert module["sha256"] == hashlib.sha256(Path(module["path"]).read_bytes()).hexdigest()


def test_a_prediction_is_traced_to_its_checkpoint_and_inputs(tmp_path):
    run_train(tmp_path, *QUICK, "run_name=p")
    best = tmp_path / "checkpoints" / "p" / "best.pt"
    record = provenance(tmp_path, "p")
    pixels = np.zeros((8, 8), dtype=np.uint8)
    Image.fromarray(pixels).save(tmp_path / "zero.png")
    run_python(tmp_path, str(PREDICT), f"ckpt={best}", "input=zero.png", "out=p.csv")
    traced = json.loads((tmp_path / "p.csv.provenance.json").read_text())
    assert traced["checkpoint"]["sha256"] == hashlib.sha256(best.read_bytes()).hexdigest()
    assert traced["checkpoint"]["data"]["splits"] == record["data"]["splits"]
    assert traced["checkpoint"]["code"]["commit"] == record["code"]["commit"]
    assert traced["inputs"]["count"] == 1 and len(traced["inputs"]["content_sha256"]) == 64


@pytest.mark.slow  # 20 s: four runs; the record it reads is checked in the quick suite
def test_compare_prints_exactly_what_differs(tmp_path):
    run_train(tmp_path, *QUICK, "run_name=a")
    run_train(tmp_path, *QUICK, "run_name=b", "optim.lr=0.001")
    # One package at another version, as after an upgrade between the runs.
    path = tmp_path / "runs" / "b" / "provenance.json"
    record = json.loads(path.read_text())
    record["packages"]["numpy"] = "0.0.1"
    path.write_text(json.dumps(record))
    compare = str(ROOT / "compare.py")
    result = run_python(tmp_path, compare, "runs/a", "runs/b", ok=False)
    assert result.returncode == 1, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("2 difference(s)")
    assert lines[1:] == [
        "config",
        "  optim.lr: 0.002 -> 0.001",
        "packages",
        f"  numpy: {metadata.version('numpy')} -> 0.0.1",
        "curves: runs/compare/a-vs-b.png",  # the two runs' curves on common axes
    ]
    with Image.open(tmp_path / "runs" / "compare" / "a-vs-b.png") as curves:
        assert curves.format == "PNG" and curves.width > 500
    same = run_python(tmp_path, compare, "runs/a", "checkpoints/a/last.pt", ok=False)
    assert same.returncode == 0 and "the same" in same.stdout
    bad = run_python(tmp_path, compare, "runs/a", "runs/none", ok=False)
    assert bad.returncode == 2 and bad.stderr.startswith("error: runs/none")


@pytest.mark.slow
def test_the_commit_and_dirty_flag_come_from_git_and_no_git_is_no_failure(tmp_path):
    # The project as it is, committed into a repository of its own, trained from: clean, then
    # with a tracked file edited, then copied outside any repository.
    clone = tmp_path / "clone"
    skipped = (".git", "runs", "checkpoints", "*.egg-info", "__pycache__", ".*_cache", "outputs")
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(*skipped))
    git = ["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the project"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    head = head.strip()

    def trained(project, name):
        run_python(tmp_path, str(project / "train.py"), *QUICK, f"run_name={name}", process=True)
        return provenance(tmp_path, name)["code"]

    clean = trained(clone, "clean")
    assert clean["commit"] == head and clean["dirty"] is False and clean["diff_sha256"] is None
    with open(clone / "README.md", "a") as readme:
        readme.write("\nan edit\n")
    dirty = trained(clone, "dirty")
    assert dirty["commit"] == head and dirty["dirty"] is True and len(dirty["diff_sha256"]) == 64
    # A model added as docs/extending.md says, left untracked: git diff does not see it.
    subprocess.run([*git, "checkout", "-q", "README.md"], check=True)
    (clone / "models" / "tiny.py").write_text("from models.mlp import mlp as tiny\n")
    (clone / "conf" / "model" / "tiny.yaml").write_text(
        "_target_: models.tiny.tiny\nhidden_sizes: [8]\n"
    )
    untracked = trained(clone, "untracked")
    assert untracked["commit"] == head and untracked["dirty"] is True
    assert set(untracked["untracked"]) == {"models/tiny.py", "conf/model/tiny.yaml"}
    assert untracked["source_sha256"] != clean["source_sha256"]
    # A copy of the project inside another repository is no commit of that repository.
    outer = tmp_path / "outer"
    shutil.copytree(clone, outer / "project", ignore=shutil.ignore_patterns(".git"))
    subprocess.run(["git", "init", "-q", str(outer)], check=True)
    nested = trained(outer / "project", "nested")
    assert nested["commit"] is None and nested["dirty"] is None
    assert "not a git repository of its own" in nested["unavailable"]
    assert nested["source_sha256"] == untracked["source_sha256"]
    plain = tmp_path / "plain"
    shutil.copytree(clone, plain, ignore=shutil.ignore_patterns(".git"))
    outside = trained(plain, "outside")
    assert outside["commit"] is None and outside["dirty"] is None
    assert "not a git repository" in outside["unavailable"]


def test_a_hostile_provenance_record_is_refused_in_one_line(tmp_path):
    run_train(tmp_path, *QUICK, "run_name=h")
    last = tmp_path / "checkpoints" / "h" / "last.pt"
    stored = torch.load(last, weights_only=True)
    bad_records = (
        {**stored["provenance"], "code": "rm -rf"},
        {**stored["provenance"], "data": {"splits": {"train": {"sha256": "x", "count": 1}}}},
        {
            **stored["provenance"],
            "data": {**stored["provenance"]["data"], "samples": {"train": torch.zeros(2)}},
        },
    )
    first = stored["provenance"]["attempts"][0]
    sources = stored["provenance"]["data"]["sources"]
    tensors = (  # a tensor where a run writes plain data: resume and predict crashed on it
        {**stored["provenance"], "attempts": [{**first, "argv": torch.zeros(2)}]},
        {
            **stored["provenance"],
            "data": {**stored["provenance"]["data"], "sources": [sources, torch.ones(1)]},
        },
        {**stored["provenance"], "machine": {"host": "x" * (17 * 2**20)}},
    )
    for record in (*bad_records, *tensors):
        torch.save({**stored, "provenance": record}, last)
        again = ("trainer.max_epochs=2", "model.hidden_sizes=[16]", "run_name=h", "resume=auto")
        result = run_train(tmp_path, *again, ok=False)
        assert "its provenance record" in error_line(result)
    Image.fromarray(np.zeros((8, 8), dtype=np.uint8)).save(tmp_path / "zero.png")
    for record in tensors[:2]:
        torch.save({**stored, "provenance": record}, last)
        result = run_python(
            tmp_path, str(PREDICT), f"ckpt={last}", "input=zero.png", "out=p.csv", ok=False
        )
        assert "its provenance record" in error_line(result)
        assert not (tmp_path / "p.csv").exists()  # no CSV without its record


def test_training_images_moved_into_a_manifests_test_split_are_counted(tmp_path):
    generator = torch.Generator().manual_seed(0)
    (tmp_path / "pics").mkdir()
    rows = {"train": [], "val": [], "test": []}
    for i in range(72):
        label = ("cat", "dog")[i % 2]
        pixels = torch.randint(0, 256, (10, 12, 3), dtype=torch.uint8, generator=generator)
        Image.fromarray(pixels.numpy()).save(tmp_path / "pics" / f"{i}.png")
        rows["train" if i < 48 else "val" if i < 60 else "test"].append(f"pics/{i}.png,{label}")

    def write(split, lines):
        (tmp_path / f"{split}.csv").write_text("path,label\n" + "\n".join(lines) + "\n")

    for split, lines in rows.items():
        write(split, lines)
    manifest = (
        "data=image_csv",
        "data.root=.",
        "data.manifest=train.csv",
        "data.split.val_path=val.csv",
        "data.split.test_path=test.csv",
        "data.image_size=[10,12]",
        "data.batch_size=8",
        "model=mlp",
    )
    run_train(tmp_path, *manifest, *QUICK, "run_name=m")
    best = tmp_path / "checkpoints" / "m" / "best.pt"
    write("train", rows["train"][20:])  # 20 training images moved to the test manifest
    write("test", rows["test"] + rows["train"][:20])
    result = run_evaluate(tmp_path, f"ckpt={best}", "runs=eval")
    found = read_metrics(next((tmp_path / "eval" / "eval").glob("*")))[str(best)]
    assert found["split_matches_training"] is False, result.stdout[-3000:] + result.stderr[-2000:]
    assert found["overlap_with_training"] == 20
    assert "20 of its 32 samples were trained on" in result.stdout


def test_compare_refuses_a_record_nested_past_what_a_run_writes_in_one_line(tmp_path):
    deep = nested = {}
    for _ in range(500):  # walked recursively, this would end in a RecursionError
        nested["a"] = {}
        nested = nested["a"]
    for name, text in (("deep", json.dumps({"machine": deep})), ("deeper", "[" * 10**5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "provenance.json").write_text(text)
        result = run_python(tmp_path, str(ROOT / "compare.py"), name, name, ok=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert result.stderr.startswith(f"error: {name}")


def test_no_credential_reaches_a_file_the_run_writes(tmp_path):
    """A value read from the environment (``${oc.env:SLACK_TOKEN}``) is recorded as that
    interpolation, and a secret-named key's value given on the command line as <redacted>,
    in every file the run writes: provenance (command and attempts), metrics.json, .hydra/,
    the log, the CSV history and the checkpoints. The callback itself gets the real values."""
    from_env, typed = "xoxb-FROM-THE-ENVIRONMENT-31337", "typed-on-the-COMMAND-LINE-4242"
    # A URL's password, in any key, and keys named passphrase, pwd, auth: they leaked before.
    in_url = "URL-PASSWORD-777"
    webhook = f"https://bot:{in_url}@hooks.example/x"
    named = {"passphrase": "PASSPHRASE-1234", "pwd": "PWD-5678", "auth": "AUTH-9012"}
    expected = ",".join([from_env, typed, webhook, *named.values(), "Ada"])
    env = {"SLACK_TOKEN": from_env, "EXPECTED_TOKENS": expected}
    result = run_train(
        tmp_path,
        *QUICK,
        "run_name=secret",
        "logger=[csv]",
        "+callbacks.chat._target_=probe_callbacks.Notifier",
        "+callbacks.chat.channel=${oc.env:SLACK_TOKEN}",
        f"+callbacks.chat.api_token={typed}",
        f"+callbacks.chat.webhook={webhook}",
        *(f"+callbacks.chat.{key}={value}" for key, value in named.items()),
        "+callbacks.chat.author=Ada",  # not a credential
        env=env,
    )
    secrets = [from_env, typed, in_url, *named.values()]
    assert not [s for s in secrets if s in result.stdout + result.stderr]
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) > 8
    for path in written:
        data = path.read_bytes()
        assert not [s for s in secrets if s.encode() in data], path
    record = provenance(tmp_path, "secret")
    assert "+callbacks.chat.api_token=<redacted>" in record["command"]["argv"]
    config = record["attempts"][0]["config"]["callbacks"]["chat"]
    assert config == {
        "_target_": "probe_callbacks.Notifier",
        "channel": "${oc.env:SLACK_TOKEN}",
        "api_token": "<redacted>",
        "webhook": "https://bot:<redacted>@hooks.example/x",
        **dict.fromkeys(named, "<redacted>"),
        "author": "Ada",
    }
    stored = checkpoint(tmp_path, "secret")["config"]["callbacks"]["chat"]
    assert stored["channel"] == "${oc.env:SLACK_TOKEN}" and stored["api_token"] == "<redacted>"


def test_a_key_named_like_a_tokenizer_or_a_token_id_is_not_a_credential():
    from utils.config.secrets import names_a_secret

    assert not names_a_secret("data.tokenizer") and not names_a_secret("data.tokenizer_kind")
    # an encoder's architecture (model=hf): ids and counts of tokens, recorded as they are
    for key in ("model.architecture.pad_token_id", "token_type_ids", "max_new_tokens"):
        assert not names_a_secret(key), key
    assert names_a_secret("logger.mlflow.token") and names_a_secret("hf_token")
    assert names_a_secret("callbacks.chat.api_token") and names_a_secret("TOKEN")


def test_a_urls_password_is_in_no_error_line(tmp_path):
    """An error naming a path that holds a URL's password printed it whole."""
    from utils.text import without_url_passwords

    url = "data.path=s3://AKIAEXAMPLE:S3CRET-PASSWORD@bucket/t.csv"
    result = run_train(tmp_path, "data=csv", "data.target=y", url, ok=False)
    said = result.stdout + result.stderr
    assert "no CSV file at s3:/AKIAEXAMPLE:<redacted>@bucket/t.csv" in said  # a path's form
    assert result.returncode == 2 and "S3CRET-PASSWORD" not in said
    quoted = "got a URI: 'AKIAEXAMPLE:S3CRET-PASSWORD@bucket/t'"  # as pyarrow quotes it
    assert "S3CRET-PASSWORD" in without_url_passwords(quoted)  # not on this command line,
    with pytest.MonkeyPatch.context() as patch:  # but on the one that named it
        patch.setattr(sys, "argv", ["train.py", url])
        assert without_url_passwords(quoted) == "got a URI: 'AKIAEXAMPLE:<redacted>@bucket/t'"
