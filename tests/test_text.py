"""data=text: texts in a CSV, a JSON-lines file or class folders train with a tokenizer fitted
to the train split, resume on the tokenizer the checkpoint stored (never trained again), and
predict.py reads raw strings as training did; files from elsewhere that are not text are one
line each."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
import torch
from conftest import (
    EVALUATE,
    PREDICT,
    assert_same_run,
    checkpoint,
    error_line,
    killed_at,
    read_metrics,
    run_python,
    run_train,
    slow,
    write_rows,
)
from texts import FILLER, GOOD, export_matches_predict, review, write_reviews

pytest.importorskip("tokenizers")

TEXT = ["data=text", "data.text=review", "data.target=sentiment", "data.tokenizer_cache=cache"]
QUICK = ["trainer.max_epochs=4", "data.batch_size=16", "logger=csv"]


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("text")
    write_reviews(cwd / "reviews.csv")
    write_reviews(cwd / "test.csv", rows=80, seed=1)
    result = run_train(
        cwd,
        *TEXT,
        *QUICK,
        "data.path=reviews.csv",
        "data.split.test_path=test.csv",
        "run_name=first",
    )
    return cwd, result


def test_the_first_command_learns_texts_and_says_where_its_tokenizer_came_from(reviews):
    cwd, result = reviews
    said = result.stdout + result.stderr
    assert "tokenizer: trained (bpe)" in said
    assert "model=auto: the bag of token and bigram embeddings (text_bag) for texts" in said
    assert read_metrics(cwd / "runs" / "first")["test/acc"] >= 0.9
    stored = checkpoint(cwd, "first", "best.pt")["inputs"]["text"]
    assert json.loads(stored["tokenizer"])["model"]["type"] == "BPE"
    assert stored["columns"] == ["review"] and stored["max_length"] == 256
    # data.tokenizer names a file, not a credential: recorded as given, and its value ("auto")
    # not scrubbed out of what the run writes (the secret filter once matched "token" in it)
    config = checkpoint(cwd, "first", "best.pt")["config"]["data"]
    assert (config["tokenizer"], config["tokenizer_kind"]) == ("auto", "bpe")
    assert "model=auto: the bag" in (cwd / "runs" / "first" / "train.log").read_text()


def test_predict_on_raw_strings_reproduces_the_test_figure(reviews):
    cwd, _ = reviews
    run_python(cwd, str(PREDICT), "ckpt=checkpoints/first", "input=test.csv", "out=p.csv")
    with open(cwd / "p.csv", newline="") as f:
        predicted = [row["class1"] for row in csv.DictReader(f)]
    with open(cwd / "test.csv", newline="") as f:
        truth = [row["sentiment"] for row in csv.DictReader(f)]
    accuracy = sum(p == t for p, t in zip(predicted, truth, strict=True)) / len(truth)
    assert accuracy == pytest.approx(read_metrics(cwd / "runs" / "first")["test/acc"], abs=1e-6)
    folder = cwd / "new"
    folder.mkdir()
    (folder / "a.txt").write_text("A wonderful brilliant film.")
    (folder / "b.txt").write_text("The plot was dull and tedious.")
    result = run_python(cwd, str(PREDICT), "ckpt=checkpoints/first", "input=new", "out=q.csv")
    assert "a.txt: pos" in result.stdout and "b.txt: neg" in result.stdout


def test_a_killed_run_resumes_on_its_stored_tokenizer_to_the_same_weights(tmp_path):
    write_reviews(tmp_path / "reviews.csv", rows=160)
    run = [*TEXT, *QUICK[:2], "data.path=reviews.csv", "model=text_bag"]  # TensorBoard on
    run += ["trainer.log_every_n_steps=5"]
    run += ["model._target_=signalling_model.text_bag"]
    run += ["model.dim=32", "model.hidden=0", "model.dropout=0.5", "model.bigram_buckets=64"]
    run_train(tmp_path, *run, "run_name=straight")
    first = run_train(tmp_path, *run, "run_name=killed", ok=False, env=killed_at(13))
    assert first.returncode == -9 or first.returncode == 137, first.stderr[-2000:]
    for cached in (tmp_path / "cache").rglob("*.json"):
        cached.unlink()  # the resume must not need it
    resumed = run_train(tmp_path, *run, "run_name=killed", "resume=auto")
    said = resumed.stdout + resumed.stderr
    assert "tokenizer: from the checkpoint" in said and "tokenizer: trained" not in said
    assert not list((tmp_path / "cache").rglob("*.json"))  # nothing was trained, nor cached
    assert_same_run(tmp_path, "straight", "killed")


def test_class_folders_and_json_lines_read_as_a_csv_does(tmp_path):
    rng = random.Random(3)
    lines = []
    for n in range(60):
        for label, good in (("pos", True), ("neg", False)):
            text = review(rng, good)
            folder = tmp_path / "folders" / label
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{n}.txt").write_text(text)
            lines.append(json.dumps({"body": text, "tags": [label, "film"]}))
    (tmp_path / "t.jsonl").write_text("\n".join(lines) + "\n")
    copies = tmp_path / "folders" / "pos" / ".ipynb_checkpoints"  # a notebook's copies: no data
    copies.mkdir()
    for n in range(5):
        (copies / f"{n}-checkpoint.txt").write_text(review(rng, False))
    result = run_train(tmp_path, "data=text", "data.path=folders", *QUICK[1:], "run_name=folders")
    assert "data.path=folders: 5 hidden .txt files skipped" in result.stdout + result.stderr
    assert read_metrics(tmp_path / "runs" / "folders")["test/acc"] >= 0.9
    run_train(
        tmp_path,
        "data=text",
        "data.path=t.jsonl",
        "data.text=body",
        "data.target=tags",
        "task=multilabel",
        *QUICK,
        "run_name=tags",
    )
    inputs = checkpoint(tmp_path, "tags", "best.pt")["inputs"]
    assert inputs["targets"]["names"] == ["film", "neg", "pos"]


def test_a_text_only_csv_under_data_csv_names_data_text(tmp_path):
    write_reviews(tmp_path / "r.csv", rows=60)
    with open(tmp_path / "r.csv", newline="") as f:
        rows = list(csv.reader(f))
    write_rows(tmp_path / "only.csv", ["review", "sentiment"], [r[:2] for r in rows[1:]])
    line = error_line(
        run_train(tmp_path, "data=csv", "data.path=only.csv", "data.target=sentiment", ok=False)
    )
    assert "column 'review' holds text" in line and "data=text data.path=only.csv" in line


def corrupt(path: Path, how: str) -> None:
    data = path.read_bytes().split(b"\n")
    if how == "latin-1":
        data[4] = data[4].replace(b"film", b"fil\xe9m")
    elif how == "nul":
        data[4] = data[4].replace(b"film", b"fi\x00lm")
    elif how == "huge line":
        data[4] = b'"' + b"word " * 250_000 + b'",pos,1'
    path.write_bytes(b"\n".join(data))


@pytest.mark.parametrize(
    "how, said",
    [
        ("latin-1", "line 5: byte 0xe9 is not UTF-8"),
        *slow(
            ("nul", "line 5: holds a NUL byte"),
            ("huge line", "line 5: field larger than field limit (1000001)"),
        ),
    ],
)
def test_a_file_that_is_not_text_is_one_line_naming_its_line(tmp_path, how, said):
    write_reviews(tmp_path / "reviews.csv", rows=40)
    corrupt(tmp_path / "reviews.csv", how)
    result = run_train(tmp_path, *TEXT, *QUICK, "data.path=reviews.csv", ok=False)
    assert said in error_line(result)
    assert not (tmp_path / "checkpoints").exists() or not list(
        (tmp_path / "checkpoints").rglob("*.pt")
    )


def test_a_stored_or_given_tokenizer_is_untrusted(reviews, tmp_path):
    cwd, _ = reviews
    stored = torch.load(cwd / "checkpoints" / "first" / "best.pt", weights_only=True)
    text = stored["inputs"]["text"]
    vast = json.loads(text["tokenizer"])
    vast["model"]["vocab"] = {f"t{i}": i for i in range(1_000_001)}
    edited = {
        **stored,
        "inputs": {**stored["inputs"], "text": {**text, "tokenizer": json.dumps(vast)}},
    }
    torch.save(edited, tmp_path / "vast.pt")
    result = run_python(
        cwd, str(PREDICT), f"ckpt={tmp_path / 'vast.pt'}", "input=test.csv", "out=v.csv", ok=False
    )
    assert "the tokenizer holds 1,000,001 tokens, more than 1,000,000" in error_line(result)
    assert not (cwd / "v.csv").exists()
    swapped = {**text, "tokenizer": text["tokenizer"].replace("[UNK]", "[UNKNOWN]", 1)}
    torch.save({**stored, "inputs": {**stored["inputs"], "text": swapped}}, tmp_path / "swap.pt")
    result = run_python(
        cwd, str(PREDICT), f"ckpt={tmp_path / 'swap.pt'}", "input=test.csv", "out=s.csv", ok=False
    )
    assert "does not match its sha256" in error_line(result)
    padded = {**text, "pad_id": 999_999_999}  # derivable from the tokenizer: never trusted
    torch.save({**stored, "inputs": {**stored["inputs"], "text": padded}}, tmp_path / "pad.pt")
    result = run_python(
        cwd, str(PREDICT), f"ckpt={tmp_path / 'pad.pt'}", "input=test.csv", "out=d.csv", ok=False
    )
    assert "pad_id=999999999 is not its tokenizer's (0)" in error_line(result)
    backtracking = json.loads(text["tokenizer"])
    backtracking["pre_tokenizer"] = {
        "type": "Split",
        "pattern": {"Regex": "(a+)+$"},
        "behavior": "Isolated",
        "invert": False,
    }
    (tmp_path / "tok.json").write_text(json.dumps(backtracking))
    result = run_train(
        cwd,
        *TEXT,
        *QUICK,
        "data.path=reviews.csv",
        f"data.tokenizer={tmp_path / 'tok.json'}",
        ok=False,
    )
    assert "runs a regular expression ('(a+)+$'" in error_line(result)


def _edited_tokenizer(cwd, how: str) -> dict:
    """The first run's tokenizer JSON, edited as a hostile or careless file would be."""
    stored = torch.load(cwd / "checkpoints" / "first" / "best.pt", weights_only=True)
    parsed = json.loads(stored["inputs"]["text"]["tokenizer"])
    if how == "expanding":  # 12 replacements, each doubling: 4,096 characters of each "e"
        chain = [{"type": "Replace", "pattern": {"String": "e"}, "content": "ee"}] * 12
        parsed["normalizer"] = {"type": "Sequence", "normalizers": chain}
    elif how == "unbounded kind":
        parsed["normalizer"] = {"type": "SomethingNew"}
    elif how == "unparsable":  # JSON the library cannot build a tokenizer from
        parsed["model"]["type"] = "NotAModel"
    elif how == "padding outside":
        parsed["padding"] = {
            "strategy": "BatchLongest",
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 10**6,
            "pad_type_id": 0,
            "pad_token": "[PAD]",
        }
    elif how == "dropout":
        parsed["model"]["dropout"] = 0.5
    return parsed


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("expanding", "normalizers can make more than 256 characters of one"),
        ("unbounded kind", "normalizer 'SomethingNew' is not one torchloom can bound"),
        ("unparsable", "the tokenizers library cannot read it ("),
        ("padding outside", "padding id 1000000 is outside its"),
    ],
)
def test_a_given_tokenizer_that_would_blow_up_or_not_build_is_one_line(
    reviews, tmp_path, how, said
):
    """A 3 kB file of chained expanding normalizers exhausted the memory in seconds; one the
    library cannot parse, and a padding id past the vocabulary, were tracebacks."""
    cwd, _ = reviews
    (tmp_path / "tok.json").write_text(json.dumps(_edited_tokenizer(cwd, how)))
    given = f"data.tokenizer={tmp_path / 'tok.json'}"
    result = run_train(cwd, *TEXT, *QUICK, "data.path=reviews.csv", given, ok=False)
    assert result.returncode == 2 and said in error_line(result), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_bpe_dropout_is_switched_off_so_predictions_repeat(reviews, tmp_path):
    """A given tokenizer with BPE dropout made two predict.py runs on the same texts differ on
    every row. It is switched off (said), and a stored one holding it is refused as edited."""
    cwd, _ = reviews
    (tmp_path / "drop.json").write_text(json.dumps(_edited_tokenizer(cwd, "dropout")))
    given = f"data.tokenizer={tmp_path / 'drop.json'}"
    result = run_train(cwd, *TEXT, *QUICK, "data.path=reviews.csv", given, "run_name=dropout")
    assert "applies BPE dropout (0.5): switched off" in result.stdout + result.stderr
    best = cwd / "checkpoints" / "dropout" / "best.pt"
    for out in ("a.csv", "b.csv"):
        run_python(cwd, str(PREDICT), f"ckpt={best}", "input=test.csv", f"out={out}")
    assert (cwd / "a.csv").read_text() == (cwd / "b.csv").read_text()
    stored = torch.load(best, weights_only=True)
    text = stored["inputs"]["text"]
    dropped = json.loads(text["tokenizer"])
    assert dropped["model"]["dropout"] is None
    dropped["model"]["dropout"] = 0.5
    again = json.dumps(dropped)
    import hashlib

    edited = {**text, "tokenizer": again, "sha256": hashlib.sha256(again.encode()).hexdigest()}
    torch.save({**stored, "inputs": {**stored["inputs"], "text": edited}}, tmp_path / "e.pt")
    refused = run_python(
        cwd, str(PREDICT), f"ckpt={tmp_path / 'e.pt'}", "input=test.csv", "out=c.csv", ok=False
    )
    assert "applies BPE dropout (model.dropout=0.5)" in error_line(refused)


def test_the_transformer_learns_the_same_texts(reviews):
    cwd, _ = reviews
    small = ["model=text_transformer", "model.width=32", "model.layers=1", "model.heads=2"]
    run_train(cwd, *TEXT, *QUICK, "data.path=reviews.csv", *small, "run_name=encoder")
    assert read_metrics(cwd / "runs" / "encoder")["test/acc"] >= 0.8


def test_bucketed_batches_are_a_pure_function_of_seed_and_epoch_with_less_padding():
    from data.batching.order import bucketed, permutation

    lengths = torch.randint(1, 200, (1000,), generator=torch.Generator().manual_seed(0))
    order = bucketed(permutation(1000, 7, 3), lengths, 32, 7, 3)
    assert torch.equal(order, bucketed(permutation(1000, 7, 3), lengths, 32, 7, 3))
    assert sorted(order.tolist()) == list(range(1000))  # every text once
    assert not torch.equal(order, bucketed(permutation(1000, 7, 4), lengths, 32, 7, 4))
    whole = order[: 1000 // 32 * 32].view(-1, 32)
    padded = (lengths[whole].max(1).values * 32).sum() / lengths[whole].sum()
    shuffled = permutation(1000, 7, 3)[: 1000 // 32 * 32].view(-1, 32)
    plain = (lengths[shuffled].max(1).values * 32).sum() / lengths[shuffled].sum()
    assert padded < 1.15 < plain  # tokens held per real token: bucketed against shuffled


def test_mixing_token_ids_is_refused_and_text_models_refuse_images(reviews):
    cwd, _ = reviews
    mixed = run_train(
        cwd, *TEXT, *QUICK, "data.path=reviews.csv", "data.augment.mixup_alpha=0.2", ok=False
    )
    assert "MixUp and CutMix blend images or numbers, not texts" in error_line(mixed)
    images = run_train(cwd, "model=text_transformer", *QUICK, ok=False)  # the digits
    assert "model=text_transformer takes texts (data=text" in error_line(images)


def test_a_score_of_texts_regresses_and_cross_validates(tmp_path):
    rng = random.Random(5)
    rows = []
    for _ in range(160):
        good = rng.randint(0, 3)
        words = [rng.choice(FILLER) for _ in range(6)] + [rng.choice(GOOD) for _ in range(good)]
        rng.shuffle(words)
        rows.append([" ".join(words), f"{good + rng.random() * 0.1:.3f}"])
    write_rows(tmp_path / "scores.csv", ["text", "score"], rows)
    scored = ["data=text", "data.path=scores.csv", "data.target=score", "task=regression"]
    run_train(tmp_path, *scored, *QUICK[1:], "cv=2", "run_name=cv")
    folds = [read_metrics(tmp_path / "runs" / "cv" / f"fold-{k}") for k in (0, 1)]
    assert all(fold["test/mae"] < 0.5 for fold in folds)  # the scores span 0 to 3.1
    assert (tmp_path / "runs" / "cv" / "oof.csv").is_file()


@pytest.mark.parametrize("suffix", ["onnx", *slow("pt2")])
def test_an_export_fed_strings_tokenized_without_torchloom_matches_predict(reviews, suffix):
    cwd, _ = reviews
    export_matches_predict(cwd, "first", suffix, "review")


def test_the_batch_size_finder_tries_full_length_texts(reviews):
    cwd, _ = reviews
    result = run_train(cwd, *TEXT, "data.path=reviews.csv", "tune=batch_size", "logger=csv")
    assert "largest batch that fits for TextBag" in result.stdout + result.stderr


def test_calibration_callbacks_and_trackers_work_on_texts_unchanged(tmp_path):
    table = write_reviews(tmp_path / "reviews.csv", rows=300).read_text().splitlines()
    flipped = {"pos": "neg", "neg": "pos"}  # every 8th label wrong: val is not all right
    for n in range(1, len(table), 8):
        text, label, extra = table[n].rsplit(",", 2)
        table[n] = f"{text},{flipped[label]},{extra}"
    (tmp_path / "reviews.csv").write_text("\n".join(table) + "\n")
    write_reviews(tmp_path / "test.csv", rows=80, seed=1)
    # a callback stops the run at its target, and two trackers record every epoch
    run = [*TEXT, "data.path=reviews.csv", "data.split.test_path=test.csv", "data.batch_size=16"]
    stop = ["callbacks=stop_at_target", "callbacks.stop_at_target.target=0.75"]
    run_train(
        tmp_path, *run, *stop, "trainer.max_epochs=30", "logger=[csv,tensorboard]", "run_name=t"
    )
    metrics = read_metrics(tmp_path / "runs" / "t")
    assert metrics["epochs"] < 30 and metrics["best_metric"] >= 0.75
    assert list((tmp_path / "runs" / "t").rglob("events.out.tfevents.*"))
    with open(tmp_path / "runs" / "t" / "metrics.csv", newline="") as f:
        assert len({row["epoch"] for row in csv.DictReader(f)}) == metrics["epochs"]
    # a temperature fitted on val; predict.py and the export both apply it
    fitted = run_python(tmp_path, str(EVALUATE), "ckpt=checkpoints/t", "calibrate=temperature")
    assert "calibration fitted on val, shown on test: temperature" in fitted.stdout
    stored = checkpoint(tmp_path, "t", "best.pt")["inputs"]["calibration"]
    assert stored["split"] == "val" and stored["temperature"] != 1.0
    export_matches_predict(tmp_path, "t", "onnx", "review")


@pytest.mark.slow  # a compile of the text model on the CPU
def test_trainer_compile_compiles_a_text_model_on_its_token_ids(tmp_path):
    # The compile was proven on a float batch of zeros, which a text model's embedding cannot
    # look up: it fell back to eager with a warning. It is proven on the kind's example now.
    write_reviews(tmp_path / "reviews.csv", rows=160)
    run = [*TEXT, *QUICK[:2], "data.path=reviews.csv", "model=text_bag", "trainer.compile=true"]
    result = run_train(tmp_path, *run, "run_name=compiled")
    assert "torch.compile failed" not in result.stdout + result.stderr
