"""model=hf: a local Hugging Face encoder folder (a tiny randomly initialised BERT this file
saves with ``save_pretrained``, never a download) fine-tunes on texts with its own tokenizer,
under layer-wise LR decay; resumes exactly; and its checkpoints rebuild, predict and export
without the folder. What the folder or a checkpoint says of the encoder is read as data."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import (
    PREDICT,
    assert_same_run,
    checkpoint,
    error_line,
    killed_at,
    read_metrics,
    run_python,
    run_train,
    slow,
)
from texts import export_matches_predict, write_reviews

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

TEXT = ["data=text", "data.text=review", "data.target=sentiment", "data.max_length=48"]
HF = ["model=hf", "model.path=encoder", "optim.lr=0.003", "data.batch_size=16"]
QUICK = ["trainer.max_epochs=8", "logger=csv"]


def save_encoder(folder, texts) -> None:
    """A BERT of 2 layers of width 32 and a WordPiece tokenizer fitted to ``texts``, saved as
    a Hugging Face model folder is."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(texts, trainers.WordPieceTrainer(special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = transformers.BertConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("hf")
    write_reviews(cwd / "reviews.csv")
    write_reviews(cwd / "test.csv", rows=80, seed=1)
    with open(cwd / "reviews.csv") as f:
        save_encoder(cwd / "encoder", f.read().splitlines()[1:])
    result = run_train(
        cwd,
        *TEXT,
        *HF,
        *QUICK,
        "optim.layer_decay=0.5",
        "data.path=reviews.csv",
        "data.split.test_path=test.csv",
        "run_name=tuned",
    )
    return cwd, result


def test_an_encoder_folder_fine_tunes_with_its_own_tokenizer_and_layer_decay(tuned):
    cwd, result = tuned
    said = result.stdout + result.stderr
    assert "tokenizer: from a given file" in said and "encoder/tokenizer.json" in said
    assert "tokenizer: trained" not in said
    assert read_metrics(cwd / "runs" / "tuned")["test/acc"] >= 0.95
    stored = checkpoint(cwd, "tuned", "best.pt")
    assert stored["config"]["data"]["tokenizer"] == "encoder"
    architecture = stored["config"]["model"]["architecture"]
    assert architecture["model_type"] == "bert" and architecture["num_hidden_layers"] == 2
    assert "architectures" not in architecture and "transformers_version" not in architecture
    assert architecture["pad_token_id"] == 0  # an id, not a credential: recorded as it is
    # embeddings, layer.0, layer.1, head: each a factor 0.5 below the one above it
    rates = [group["initial_lr"] for group in stored["optimizer"]["param_groups"]]
    assert sorted(set(rates)) == pytest.approx([0.003 * 0.5**k for k in (3, 2, 1, 0)])


@pytest.mark.parametrize("suffix", ["onnx", *slow("pt2")])
def test_its_checkpoint_predicts_and_exports_without_the_folder(tuned, suffix):
    cwd, _ = tuned
    moved = cwd / "elsewhere"
    shutil.move(cwd / "encoder", moved)
    try:
        run_python(cwd, str(PREDICT), "ckpt=checkpoints/tuned", "input=test.csv", "out=p.csv")
        export_matches_predict(cwd, "tuned", suffix, "review")
    finally:
        shutil.move(moved, cwd / "encoder")


@pytest.mark.slow  # 12 s; the text resume test in the quick suite resumes on a stored tokenizer
def test_a_killed_fine_tuning_resumes_to_the_same_weights(tmp_path):
    write_reviews(tmp_path / "reviews.csv", rows=96)
    with open(tmp_path / "reviews.csv") as f:
        save_encoder(tmp_path / "encoder", f.read().splitlines()[1:])
    run = [*TEXT, *HF, "trainer.max_epochs=2", "data.path=reviews.csv"]
    run += ["model._target_=signalling_model.hf_model", "trainer.log_every_n_steps=2"]
    run_train(tmp_path, *run, "run_name=straight")
    first = run_train(tmp_path, *run, "run_name=killed", ok=False, env=killed_at(6))
    assert first.returncode in (-9, 137), first.stderr[-2000:]
    resumed = run_train(tmp_path, *run, "run_name=killed", "resume=auto")
    assert "tokenizer: from the checkpoint" in resumed.stdout + resumed.stderr
    assert_same_run(tmp_path, "straight", "killed")


def test_what_the_folder_or_a_checkpoint_says_of_the_encoder_is_data(tuned, tmp_path):
    cwd, _ = tuned
    base = [*TEXT, *HF, *QUICK, "data.path=reviews.csv"]
    # a stored architecture asking for a hub kernel and a quantizer: neither is taken
    stored = torch.load(cwd / "checkpoints" / "tuned" / "best.pt", weights_only=False)
    stored["config"]["model"]["architecture"].update(
        attn_implementation="kernels-community/flash-attn",
        _attn_implementation="kernels-community/flash-attn",
        quantization_config={"quant_method": "bitsandbytes", "load_in_8bit": True},
        return_dict=False,  # and outputs as a tuple: the model asks for its own form
    )
    torch.save(stored, tmp_path / "asks.pt")
    run_python(cwd, str(PREDICT), f"ckpt={tmp_path / 'asks.pt'}", "input=test.csv", "out=a.csv")
    run_python(cwd, str(PREDICT), "ckpt=checkpoints/tuned", "input=test.csv", "out=b.csv")
    assert (cwd / "a.csv").read_text() == (cwd / "b.csv").read_text()
    # a stored architecture transformers itself refuses: one line, not its traceback
    stored["config"]["model"]["architecture"]["pad_token_id"] = 10**12
    torch.save(stored, tmp_path / "pad.pt")
    line = error_line(
        run_python(cwd, str(PREDICT), f"ckpt={tmp_path / 'pad.pt'}", "input=test.csv", ok=False)
    )
    assert "model.architecture: the encoder cannot be built: Padding_idx" in line
    # a checkpoint whose stored architecture names a family that is not an encoder
    stored["config"]["model"]["architecture"]["model_type"] = "llama"
    torch.save(stored, tmp_path / "edited.pt")
    line = error_line(
        run_python(cwd, str(PREDICT), f"ckpt={tmp_path / 'edited.pt'}", "input=test.csv", ok=False)
    )
    assert "model_type='llama' is not an encoder model=hf builds" in line
    # a folder whose weights are a pickle (pytorch_model.bin) alone
    pickled = cwd / "pickled"
    shutil.copytree(cwd / "encoder", pickled)
    (pickled / "tokenizer.json").rename(pickled / "saved.json")  # and without its tokenizer
    line = error_line(run_train(cwd, *base, "model.path=pickled", ok=False))
    assert "cannot read pickled/tokenizer.json" in line and "AutoTokenizer" in line
    (pickled / "saved.json").rename(pickled / "tokenizer.json")
    state = transformers.BertModel.from_pretrained(pickled).state_dict()
    torch.save(state, pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    line = error_line(run_train(cwd, *base, "model.path=pickled", ok=False))
    assert "model.path=pickled: no model.safetensors there" in line
    # a config.json asking for code from the folder: refused by its family, never imported
    config = json.loads((pickled / "config.json").read_text())
    config.update(model_type="custom", auto_map={"AutoModel": "modeling.Evil"})
    (pickled / "config.json").write_text(json.dumps(config))
    line = error_line(run_train(cwd, *base, "model.path=pickled", ok=False))
    assert "model_type='custom' is not an encoder" in line
    # the texts tokenized with a larger vocabulary than the encoder embeds
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[PAD]": 0, "[UNK]": 1, **{f"w{i}": i + 2 for i in range(5000)}}
    wide = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    wide.pre_tokenizer = pre_tokenizers.Whitespace()
    wide.save(str(tmp_path / "wide.json"))
    line = error_line(run_train(cwd, *base, f"data.tokenizer={tmp_path / 'wide.json'}", ok=False))
    assert "the tokenizer has 5,002 tokens and the encoder embeds" in line
    # no folder given: said as any ??? key is, though data.tokenizer reads it through
    # model.tokenizer (an interpolation), and no run folder is left behind
    line = error_line(run_train(cwd, *TEXT, "model=hf", "data.path=reviews.csv", ok=False))
    assert line == "error: model.path is required (it is ??? in the config); pass model.path=..."
    # longer texts than its positions
    line = error_line(run_train(cwd, *base, "data.max_length=128", ok=False))
    assert "data.max_length=128 is more than the encoder's 64 positions" in line
    assert [p.name for p in (cwd / "checkpoints").iterdir()] == ["tuned"]  # none left behind
    # a resume on a folder whose encoder changed since: a changed config, refused by name
    saved = (cwd / "encoder" / "config.json").read_text()
    changed = {**json.loads(saved), "hidden_dropout_prob": 0.2}
    (cwd / "encoder" / "config.json").write_text(json.dumps(changed))
    try:
        again = [*base, "optim.layer_decay=0.5", "data.split.test_path=test.csv"]
        resumed = run_train(cwd, *again, "run_name=tuned", "resume=auto", ok=False)
    finally:
        (cwd / "encoder" / "config.json").write_text(saved)
    assert "model.architecture.hidden_dropout_prob: 0.1 -> 0.2" in error_line(resumed)


@pytest.mark.parametrize("lacking", ["some", "all"])
def test_an_encoder_folder_lacking_weights_is_refused_naming_them(tuned, tmp_path, lacking):
    """transformers starts what a folder's weights lack from random values, its notice
    silenced: such a folder fine-tuned a (partly) random encoder without a word."""
    from safetensors.torch import load_file, save_file

    cwd, _ = tuned
    folder = tmp_path / "partial"
    shutil.copytree(cwd / "encoder", folder)
    weights = load_file(folder / "model.safetensors")
    if lacking == "some":
        kept = {k: v for k, v in weights.items() if ".layer.1." not in k}
    else:
        kept = {"unrelated.weight": torch.zeros(1)}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    run = [*TEXT, *HF, *QUICK, "data.path=reviews.csv", f"model.path={folder}"]
    line = error_line(run_train(cwd, *run, ok=False))
    assert f"model.path={folder}: its weights lack" in line
    assert "encoder.layer.1." in line if lacking == "some" else "embeddings." in line


def test_a_tokenizer_that_is_not_the_encoders_own_is_warned_of(tuned, tmp_path):
    cwd, _ = tuned
    shutil.copy(cwd / "encoder" / "tokenizer.json", tmp_path / "other.json")
    run = [*TEXT, *HF, "trainer.max_epochs=1", "data.path=reviews.csv", "run_name=other"]
    result = run_train(cwd, *run, f"data.tokenizer={tmp_path / 'other.json'}")
    said = result.stdout + result.stderr
    assert f"data.tokenizer={tmp_path / 'other.json'} is not the encoder's own" in said
    plain = run_train(cwd, *run, "run_name=own")
    assert "is not the encoder's own" not in plain.stdout + plain.stderr
