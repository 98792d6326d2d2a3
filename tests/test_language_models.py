"""Language models (task=causal_lm, model=gpt, data=corpus) through the real entry points: a
GPT trained on a corpus, its whole-split figures, exact resume after kill -9, sampling from a
prompt with the same text for the same seed, the order its windows are read in, and the bad
inputs of a corpus, a prompt and a stored vocabulary."""

from __future__ import annotations

import gzip
import html
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import (
    NEEDS_GLOO,
    PREDICT,
    SHARD,
    checkpoint,
    error_line,
    killed_at,
    read_metrics,
    run_evaluate,
    run_python,
    run_train,
    torchrun,
)
from hydra import compose, initialize_config_dir

from data.batching.batches import BatchPlan
from data.corpus.stream import StreamBatches, TokenStream
from data.corpus.vocabulary import Vocabulary
from utils.checkpoint.load import load_checkpoint
from utils.config.schema import CONF
from utils.errors import EXIT_USER_ERROR, UserError
from utils.evaluation.sampling import generated

ASSET = Path(__file__).resolve().parents[1] / "data" / "assets" / "tinyshakespeare.txt.gz"
LM = ["task=causal_lm", "model=gpt", "data=corpus", "data.path=corpus.txt"]
TINY = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "model.block_size=16",
    "data.batch_size=4",
    "trainer.max_steps=12",
    "trainer.val_every_n_steps=4",
    "scheduler.warmup_steps=2",
    "trainer.log_every_n_steps=4",
]


def shakespeare(chars: int) -> str:
    return gzip.decompress(ASSET.read_bytes()).decode("utf-8")[:chars]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    (tmp_path / "corpus.txt").write_text(shakespeare(6000), encoding="utf-8")
    return tmp_path


def test_a_gpt_trains_on_a_corpus_and_reports_whole_split_figures(corpus):
    result = run_train(corpus, *LM, *TINY, "run_name=lm", "report=true")
    metrics = read_metrics(corpus / "runs" / "lm")
    assert metrics["global_step"] == 12 and metrics["epochs"] == 3  # rounds of 4 steps
    assert metrics["test_split"] == "val"
    # bits per character are the loss in bits, perplexity e to the loss
    assert metrics["test/bpc"] == pytest.approx(metrics["test/loss"] / math.log(2))
    assert metrics["test/ppl"] == pytest.approx(math.exp(metrics["test/loss"]))
    assert metrics["train/tokens_per_second"] > 0
    assert metrics["test/loss"] < math.log(metrics["samples"]["train"] and 60)  # below uniform
    assert "val/bpc" in result.stdout
    # its report: the loss curves, and 300 characters the model wrote, each one of the corpus's
    page = (corpus / "runs" / "lm" / "report.html").read_text()
    written = html.unescape(re.search(r"<pre>(.*?)</pre>", page, re.S).group(1))
    assert len(written) == 301 and set(written) <= set(shakespeare(6000))
    assert "learning curves" in page and page.count("data:image/png;base64,") == 1
    assert metrics["samples_per_step"] == 4  # its curves are drawn against 4 × 16 tokens a step
    assert "tokens (64 an optimizer step)" in page
    # the val figure is over every token of the val split, the same for any batch size
    again = run_evaluate(corpus, "ckpt=checkpoints/lm/best.pt", "data.batch_size=3")
    assert f"{metrics['test/loss']:.4f}" in again.stdout


def test_a_killed_run_resumes_to_the_same_weights_and_the_same_text(corpus):
    run = [*LM, *TINY, "model._target_=signalling_model.gpt"]
    run_train(corpus, *run, "run_name=straight")
    first = run_train(
        corpus,
        *run,
        "run_name=killed",
        "trainer.checkpoint_every_n_steps=3",
        ok=False,
        env=killed_at(7),
    )
    assert first.returncode in (-9, 137), first.stderr[-2000:]
    assert checkpoint(corpus, "killed")["global_step"] == 6  # the step-interval save
    run_train(corpus, *run, "run_name=killed", "trainer.checkpoint_every_n_steps=3", "resume=auto")
    a, b = checkpoint(corpus, "straight"), checkpoint(corpus, "killed")
    assert a["global_step"] == b["global_step"] == 12
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for key in ("exp_avg", "exp_avg_sq"):
        for index in a["optimizer"]["state"]:
            assert torch.equal(
                a["optimizer"]["state"][index][key], b["optimizer"]["state"][index][key]
            )


def sample(cwd: Path, run: str, *options: str, ok: bool = True):
    return run_python(
        cwd, str(PREDICT), f"ckpt=checkpoints/{run}", "max_new_tokens=40", *options, ok=ok
    )


def test_the_same_seed_and_prompt_give_the_same_text(corpus):
    run_train(corpus, *LM, *TINY, "run_name=lm")
    texts = {}
    for name, seed in (("one", 1), ("two", 1), ("other", 2)):
        result = sample(corpus, "lm", "prompt=ROMEO:", f"seed={seed}", f"out={name}.txt")
        texts[name] = (corpus / f"{name}.txt").read_text(encoding="utf-8")
        assert texts[name].strip() in result.stdout  # printed, and written to out=
    assert texts["one"] == texts["two"] and texts["one"] != texts["other"]
    assert texts["one"].startswith("ROMEO:") and len(texts["one"]) > len("ROMEO:") + 20
    (corpus / "prompts.txt").write_text("ROMEO:\nFirst Citizen:\n", encoding="utf-8")
    sample(corpus, "lm", "prompts=prompts.txt", "seed=1", "out=both.txt")
    both = (corpus / "both.txt").read_text(encoding="utf-8")
    assert both.startswith(texts["one"].strip()) and "\n\nFirst Citizen:" in both


def test_the_key_value_cache_samples_what_the_whole_window_samples():
    torch.manual_seed(0)
    from models.gpt import GPT

    model = GPT(
        vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True
    )

    class Options:
        max_new_tokens, temperature, top_k = 20, 0, None

    prompt = torch.tensor([1, 2, 3])
    cached = generated(model, prompt, Options, torch.Generator(), 12)

    class Plain(torch.nn.Module):  # the same weights, no cache: every step reads the window again
        def forward(self, ids):
            return model(ids)

    assert cached == generated(Plain(), prompt, Options, torch.Generator(), 12)


@pytest.mark.parametrize("windows", ["passes", "random"])
def test_windows_are_drawn_as_asked_and_processes_share_one_stream(windows):
    stream = TokenStream(torch.arange(1000), 10, windows=windows)
    plan = BatchPlan(batch_size=8, train=True, seed=3)
    batches = StreamBatches(stream, plan, transform=type("T", (), {"device": "cpu"}))
    targets = torch.cat([y.flatten() for _, y in batches.epoch(0)])
    starts = torch.cat([x[:, 0] for x, _ in batches.epoch(0)])
    assert len(targets) == len(batches) * 8 * 10 and int(starts.max()) + 10 < 1000
    if windows == "passes":  # one offset a pass, no position twice in it
        assert len(targets) == len(set(targets.tolist()))
        assert len(set((starts % 10).tolist())) == 1
    else:  # anywhere, drawn anew: windows at many offsets, some text read twice
        assert len(set((starts % 10).tolist())) == 10
        assert len(set(targets.tolist())) < len(targets)
    again = StreamBatches(stream, plan, transform=type("T", (), {"device": "cpu"}))
    assert torch.equal(starts, torch.cat([x[:, 0] for x, _ in again.epoch(0)]))  # (seed, pass)
    for x, y in batches.epoch(1):
        assert torch.equal(x + 1, y)  # each target the next token
    halves = [
        StreamBatches(
            stream,
            BatchPlan(batch_size=4, train=True, seed=3, rank=r, world_size=2),
            transform=type("T", (), {"device": "cpu"}),
        )
        for r in (0, 1)
    ]
    for whole, (a, b) in zip(
        batches.epoch(1), zip(halves[0].epoch(1), halves[1].epoch(1), strict=True), strict=True
    ):
        assert torch.equal(whole[0], torch.cat([a[0], b[0]]))  # one global order, split


@pytest.mark.parametrize("windows", ["passes", "random"])
def test_rounds_continue_the_stream_across_passes(windows):
    stream = TokenStream(torch.arange(300), 10, round_batches=4, windows=windows)
    plan = BatchPlan(batch_size=2, train=True, seed=0)
    rounds = stream.batches(plan, type("T", (), {"device": "cpu"}))
    assert len(rounds) == 4
    passes = StreamBatches(
        TokenStream(torch.arange(300), 10, windows=windows),
        plan,
        transform=type("T", (), {"device": "cpu"}),
    )
    by_rounds = [x for r in range(7) for x, _ in rounds.epoch(r)]
    by_passes = [x for p in range(3) for x, _ in passes.epoch(p)][: len(by_rounds)]
    assert all(torch.equal(a, b) for a, b in zip(by_rounds, by_passes, strict=True))


def test_characters_bytes_and_a_fitted_bpe_read_back_their_text():
    text = "ROMEO: O, she doth teach the torches to burn bright!\nJULIET: Ay me. ü"
    char = Vocabulary("char", chars="".join(sorted(set(text))))
    assert char.decode(char.encode(text, "t").tolist()) == text
    byte = Vocabulary("byte")
    assert byte.decode(byte.encode(text, "t").tolist()) == text
    pytest.importorskip("tokenizers")
    from data.corpus.vocabulary import fitted

    bpe = fitted("bpe", shakespeare(20000), shakespeare(20000), 300, "corpus")
    assert bpe.decode(bpe.encode(text, "t").tolist()) == text  # byte-level: nothing unknown


@pytest.mark.parametrize(
    "content, said",
    [
        (b"", "holds no text"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not UTF-8"),
        (b"plain\x00text that is binary " * 20, "holds a NUL byte"),
        ("caf\xe9 au lait ".encode("latin-1") * 50, "byte 0xe9 is not UTF-8"),
        (b"too short", "fewer than one window"),
    ],
)
def test_a_corpus_that_is_not_one_is_one_line_and_nothing_written(tmp_path, content, said):
    (tmp_path / "corpus.txt").write_bytes(content)
    result = run_train(tmp_path, *LM, *TINY, ok=False)
    assert result.returncode == EXIT_USER_ERROR, result.stderr[-2000:]
    assert said in error_line(result) and "corpus.txt" in error_line(result)
    assert not list(tmp_path.rglob("*.pt"))


def test_a_window_longer_than_the_val_split_the_model_or_a_batch_is_refused(corpus):
    result = run_train(corpus, *LM, *TINY, "data.split.val_share=0.001", ok=False)
    assert result.returncode == EXIT_USER_ERROR
    assert "the val split" in error_line(result) and "data.block_size" in error_line(result)
    result = run_train(corpus, *LM, *TINY, "data.block_size=32", ok=False)
    assert "more than model.block_size=16" in error_line(result)
    result = run_train(corpus, *LM, *TINY, "data.windows=tiles", ok=False)
    assert result.returncode == EXIT_USER_ERROR
    assert "data.windows='tiles' must be one of random, passes" in error_line(result)
    few = TokenStream(torch.arange(100), 10)  # 9 windows; 2 processes of 8: none to train on
    plan = BatchPlan(batch_size=8, train=True, seed=0, world_size=2)
    with pytest.raises(UserError, match="fewer than one global batch of 16"):
        few.batches(plan, type("T", (), {"device": "cpu"}))


def test_a_prompt_the_vocabulary_lacks_and_an_edited_vocabulary_are_refused(corpus):
    run_train(corpus, *LM, *TINY, "run_name=lm")
    result = sample(corpus, "lm", 'prompt="ROMEO: 😀"', ok=False)
    assert result.returncode == EXIT_USER_ERROR
    assert "'😀'" in error_line(result) and "not in the model's vocabulary" in error_line(result)
    stored = torch.load(corpus / "checkpoints/lm/best.pt", weights_only=True)
    chars = stored["inputs"]["corpus"]["chars"]
    stored["inputs"]["corpus"]["chars"] = chars[1:] + chars[0]  # ids shifted, sha256 kept
    torch.save(stored, corpus / "edited.pt")
    result = run_python(corpus, str(PREDICT), "ckpt=edited.pt", "prompt=ROMEO:", ok=False)
    assert result.returncode == EXIT_USER_ERROR
    assert "edited.pt" in error_line(result) and "sha256" in error_line(result)
    # edited with its sha256 made again: fewer ids than the model predicts (a traceback
    # from the first id past them before), or more
    for edited in (chars[:10], chars + "\u00e9\u00ea"):
        stored["inputs"]["corpus"] = Vocabulary("char", chars=edited).record()
        torch.save(stored, corpus / "edited.pt")
        result = run_python(corpus, str(PREDICT), "ckpt=edited.pt", 'prompt="!:"', ok=False)
        assert result.returncode == EXIT_USER_ERROR
        said = error_line(result)
        assert "edited.pt" in said and f"holds {len(edited)} tokens" in said, said


def test_a_classifier_checkpoint_has_no_prompt_and_a_language_model_no_input(corpus):
    run_train(corpus, *LM, *TINY, "run_name=lm")
    result = run_python(corpus, str(PREDICT), "ckpt=checkpoints/lm", "input=corpus.txt", ok=False)
    assert result.returncode == EXIT_USER_ERROR and "prompt=" in error_line(result)
    result = run_train(corpus, "task=classification", "model=mlp", "data=corpus", ok=False)
    assert "task=causal_lm" in error_line(result)


@pytest.mark.slow
def test_activation_checkpointing_of_the_blocks_keeps_the_loss_without_fsdp(corpus):
    run_train(corpus, *LM, *TINY, "run_name=plain")
    run_train(corpus, *LM, *TINY, "run_name=recomputed", "trainer.activation_checkpointing=true")
    plain, recomputed = checkpoint(corpus, "plain"), checkpoint(corpus, "recomputed")
    for name, tensor in plain["model"].items():  # recomputed activations: the same gradients
        torch.testing.assert_close(recomputed["model"][name], tensor, rtol=0, atol=1e-6)


@pytest.mark.slow
@NEEDS_GLOO
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_under_torchrun_a_kill_9_resumes_bit_identically_and_one_process_goes_on(corpus, strategy):
    job = [*LM, *TINY, "model._target_=signalling_model.gpt", f"trainer.strategy={strategy}"]
    job += ["data.batch_size=2", "trainer.checkpoint_every_n_steps=3"]  # 2 × 2 processes
    torchrun(corpus, *job, "run_name=straight")
    for run in ("killed", "alone"):
        killed = torchrun(corpus, *job, f"run_name={run}", ok=False, env=killed_at(8))
        assert killed.returncode != 0
    torchrun(corpus, *job, "run_name=killed", "resume=auto")
    straight, resumed = weights_of(corpus, "straight"), weights_of(corpus, "killed")
    assert straight.keys() == resumed.keys()
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)  # bit for bit
    # one process at the same global batch (4 windows) reads the same windows on
    alone = run_train(corpus, *job, "data.batch_size=4", "run_name=alone", "resume=auto")
    assert "it continues the same sample stream" in alone.stdout + alone.stderr
    for name, tensor in straight.items():  # the same tokens; sums in another order
        torch.testing.assert_close(weights_of(corpus, "alone")[name], tensor, rtol=1e-4, atol=1e-5)
    if strategy == "fsdp":  # a sharded checkpoint of the plain model: its text repeats
        torchrun(corpus, *LM, *TINY, "trainer.strategy=fsdp", "run_name=plain")
        assert (corpus / "checkpoints/plain/best").is_dir()
        texts = [sample(corpus, "plain", "prompt=ROMEO:", f"seed={s}").stdout for s in (3, 3, 4)]
        assert texts[0] == texts[1] != texts[2] and "ROMEO:" in texts[0]


def weights_of(cwd: Path, run: str) -> dict:
    """A run's last weights: of its sharded folder (FSDP), or of its file."""
    path = cwd / "checkpoints" / run / "last"
    return load_checkpoint(path if path.exists() else path.with_suffix(".pt"))["model"]


def test_fsdp_shards_a_gpt_by_its_blocks_and_never_a_bare_container():
    from models.gpt import GPT
    from utils.system.sharding import blocks_of

    one_block = GPT(
        vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, dropout=0, bias=True
    )
    assert blocks_of(one_block, "auto") == list(one_block.blocks)  # its own, even a single one

    class Stack(torch.nn.Module):  # a single entry in a list: the list has no forward
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Sequential(torch.nn.Linear(4, 4))])
            self.head = torch.nn.Linear(4, 2)

    found = blocks_of(Stack(), "auto")
    assert not any(isinstance(m, torch.nn.ModuleList) for m in found) and len(found) == 2


def test_a_corpus_in_parquet_shards_reads_a_text_or_a_token_id_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    lines = shakespeare(6000).splitlines()
    shards = tmp_path / "shards"
    shards.mkdir()
    for part in range(2):  # two files, rows in order: the same text as corpus.txt's
        rows = lines[part * len(lines) // 2 : (part + 1) * len(lines) // 2]
        ids = [list(line.encode("utf-8")) for line in rows]
        table = pa.table({"text": rows, "ids": ids, "n": list(range(len(rows)))})
        pq.write_table(table, shards / f"part-{part}.parquet", row_group_size=50)
    (tmp_path / "corpus.txt").write_text("\n".join(lines), encoding="utf-8")
    byte = ["data.tokenizer=byte"]
    run_train(tmp_path, *LM, *TINY, *byte, "run_name=text_file")
    run_train(tmp_path, *LM, *TINY, *byte, "data.path=shards", "run_name=text_column")
    a, b = checkpoint(tmp_path, "text_file"), checkpoint(tmp_path, "text_column")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])  # the same text
    run_train(tmp_path, *LM, *TINY, *byte, "data.path=shards", "data.tokens=ids", "run_name=ids")
    assert read_metrics(tmp_path / "runs/ids")["test/bpb"] > 0
    bad = run_train(tmp_path, *LM, *TINY, *byte, "data.path=shards", "data.text=n", ok=False)
    assert bad.returncode == EXIT_USER_ERROR and "not texts" in error_line(bad)
    chars = run_train(tmp_path, *LM, *TINY, "data.path=shards", "data.tokens=ids", ok=False)
    assert chars.returncode == EXIT_USER_ERROR and "name that tokenizer" in error_line(chars)


def test_shard_py_writes_a_corpus_as_token_shards_that_train_as_the_text_does(corpus):
    pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shard = ["data=corpus", "data.path=corpus.txt", "out=shards", "tokens_per_row=500"]
    written = run_python(corpus, str(SHARD), *shard, "rows_per_group=4")
    assert "data.tokens=tokens" in written.stdout  # the command that trains on them
    train = pq.read_table(corpus / "shards" / "train").column("tokens").to_pylist()
    assert [len(row) for row in train] == [500] * 10 + [400]  # 5,400 ids: the first 90%
    run_train(corpus, *LM, *TINY, "run_name=text")
    tokens = ["data.path=shards", "data.tokens=tokens"]
    run_train(corpus, *LM, *TINY, *tokens, "run_name=shards")  # the vocabulary they carry
    a, b = checkpoint(corpus, "text"), checkpoint(corpus, "shards")
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    again = run_python(corpus, str(SHARD), *shard, ok=False)  # nothing is replaced
    assert "already holds files" in error_line(again)
    vocabulary = corpus / "shards" / "vocabulary.json"
    vocabulary.write_text(vocabulary.read_text().replace('"chars": "\\n ', '"chars": " \\n'))
    edited = run_train(corpus, *LM, *TINY, *tokens, "run_name=edited", "data.cache=off", ok=False)
    assert "vocabulary.json" in error_line(edited) and not (corpus / "runs/edited").exists()


@pytest.mark.parametrize(
    ("preset", "width", "context", "batch", "steps", "lr", "dropout"),
    [
        ("shakespeare_char_cpu", 128, 64, 12, 2000, 1e-3, 0.0),  # nanoGPT's README CPU command
        ("shakespeare_char_cpu_tuned", 128, 64, 12, 2000, 3e-3, 0.0),  # its cost, a larger LR
        ("shakespeare_char", 384, 256, 64, 5000, 1e-3, 0.2),  # config/train_shakespeare_char.py
    ],
)
def test_the_presets_are_nanogpts_configurations(preset, width, context, batch, steps, lr, dropout):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"experiment={preset}"])
    assert (cfg.task._target_, cfg.model._target_) == ("utils.tasks.causal_lm", "models.gpt.gpt")
    assert (cfg.model.n_embd, cfg.model.block_size, cfg.data.block_size) == (
        width,
        context,
        context,
    )
    assert (cfg.data.batch_size, cfg.trainer.max_steps, cfg.optim.lr) == (batch, steps, lr)
    assert cfg.model.dropout == dropout and list(cfg.optim.betas) == [0.9, 0.99]
    assert (cfg.scheduler.warmup_steps, cfg.scheduler.min_lr_ratio) == (100, 0.1)
    assert cfg.data.path is None and cfg.data.tokenizer == "char"  # the bundled corpus
