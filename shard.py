"""Write any data torchloom reads as Parquet shards, locally or to object storage, so a run
can read it with ``data=parquet`` (data/shards/parquet.py; pip install -e ".[shards]").

    python shard.py out=digits-shards rows_per_group=256           # the bundled digits
    python shard.py data=imagefolder data.root=flowers data.image_size=[96,96] \\
        out=s3://bucket/flowers images=png                         # an image folder, encoded
    python shard.py data=csv data.path=houses.csv data.target=price task=regression out=houses
    python shard.py data=corpus data.path=books/ data.tokenizer=bpe out=s3://bucket/books

Each split the data has becomes ``out/<split>/part-NNNNN.parquet`` (rows in the order the data
holds them: the order of training is the reader's), with ``out/torchloom.json`` naming the
columns and the input shape. The images are written as the run would see them (resized, in
uint8); a table as its encoded features (one-hot categories, gaps filled as training fills
them). A corpus (``data=corpus``) as its token ids, ``tokens_per_row`` ids a row in a
``tokens`` column, its vocabulary in ``out/vocabulary.json``; then
``python train.py task=causal_lm model=gpt data=corpus data.path=<out> data.tokens=tokens``
reads them with that vocabulary. An ``out`` that already holds shards is refused: nothing is
replaced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf

from data.batching.targets import TASK_OF, target_kinds
from data.corpus.parquet import VOCABULARY
from data.shards.storage import arrow, filesystem, retried
from data.shards.writer import STREAM_COLUMN, split_table, token_tables, write_shards
from utils.config.build import build, builder_of
from utils.errors import UserError
from utils.run.cli import one_line_errors, run_cli

CHUNK = 4096  # samples decoded and converted at a time


@hydra.main(version_base="1.3", config_path="conf", config_name="shard")
def main(cfg: DictConfig) -> None:
    one_line_errors(shard, cfg)


def shard(cfg: DictConfig) -> None:
    """Check ``out`` and the sizes → build the data as a run would → each split in chunks of
    samples → Parquet files → torchloom.json."""
    arrow()  # the extra, named in one line when missing
    out = str(cfg.out).rstrip("/")
    for key in ("rows_per_group", "rows_per_file", "tokens_per_row"):
        if cfg[key] < 1:
            raise UserError(f"{key}={cfg[key]} must be 1 or more")
    if cfg.images not in ("pixels", "png"):
        raise UserError(f"images={cfg.images!r} must be pixels or png")
    refuse_written(out)
    task = task_of(cfg)
    data = build(cfg.data, **task.data_arguments(cfg.data))
    names = data.targets.class_names  # class or label names; None for values
    counts, written = {}, set()  # written: the columns the shards hold (an image, or x)
    for name, split in data.splits.items():
        if split is None:
            continue
        size, unit, tables = tables_of(split, names, cfg)
        tables = (written.update(table.column_names) or table for table in tables)
        files = write_shards(tables, f"{out}/{name}", cfg.rows_per_group, cfg.rows_per_file)
        counts[name] = {unit: size, "files": len(files)}
        print(f"{name}: {size:,} {unit} in {len(files)} files under {out}/{name}/")
    uint8 = "image" in written
    described = {
        "image": "image" if uint8 else None,
        "shape": list(data.input_shape),
        "target": "label",
        "classes": names,
        "source": data.name,
        "splits": counts,
        "images": cfg.images if uint8 else None,
    }
    command = f"data=parquet data.path={out}"
    if STREAM_COLUMN in written:  # ids mean nothing without the vocabulary that made them
        described |= {"tokens": STREAM_COLUMN, "vocabulary": VOCABULARY, "target": None}
        described["shape"] = None
        written_file(f"{out}/{VOCABULARY}", json.dumps(data.inputs.record()))
        command = (
            f"task=causal_lm model=gpt data=corpus data.path={out} data.tokens={STREAM_COLUMN}"
        )
    written_file(f"{out}/torchloom.json", json.dumps(described, indent=2))
    print(f"described in {out}/torchloom.json; train on it: python train.py {command}")


def tables_of(split, names: list | None, cfg: DictConfig) -> tuple[int, str, iter]:
    """(its size, in what, its Arrow tables) of a split: a stream of token ids (a corpus) in
    rows of ``tokens_per_row`` ids; samples, :data:`CHUNK` at a time."""
    if getattr(split, "held", None) == "stream":
        tables = token_tables(split.tokens, cfg.tokens_per_row, CHUNK)
        return len(split.tokens), "tokens", tables
    tables = (split_table(*chunk, names, cfg.images) for chunk in samples_of(split))
    return len(split), "samples", tables


def task_of(cfg: DictConfig):
    """The task named; or, where the data reads one kind of target only and not the named
    task's (a corpus: the next tokens), that kind's task: the shards hold the same either way."""
    task = build(cfg.task)
    kinds = target_kinds(builder_of(cfg.data))
    if task.targets not in kinds and len(kinds) == 1:
        task = build(OmegaConf.create({"_target_": f"utils.tasks.{TASK_OF[kinds[0]]}"}))
    return task


def written_file(url: str, text: str) -> None:
    system, root = filesystem(url)
    with system.open_output_stream(root) as f:
        f.write(text.encode())


def refuse_written(out: str) -> None:
    """``out`` may be new or empty, never a folder that already holds shards."""
    fs, _ = arrow()
    system, root = filesystem(out)
    info = retried(lambda: system.get_file_info(root), out)
    if info.type == fs.FileType.Directory:
        held = retried(lambda: system.get_file_info(fs.FileSelector(root, recursive=True)), out)
        if any(entry.type == fs.FileType.File for entry in held):
            raise UserError(
                f"out={out} already holds files; choose a new folder (nothing was written)"
            )
    elif info.type == fs.FileType.File:
        raise UserError(f"out={out} is a file; name a folder")


def samples_of(split) -> iter:
    """(inputs, targets) of ``split`` in order, :data:`CHUNK` samples at a time, as the run
    holds them: whole tensors, a memory-mapped cache, or files decoded here."""
    for start in range(0, len(split), CHUNK):
        stop = min(start + CHUNK, len(split))
        if hasattr(split, "inputs"):
            yield split.inputs[start:stop], split.labels[start:stop]
        elif hasattr(split, "images"):
            yield torch.from_numpy(split.images[start:stop].copy()), split.labels[start:stop]
        else:
            pairs = [split[index] for index in range(start, stop)]
            yield torch.stack([image for image, _ in pairs]), split.targets[start:stop]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    run_cli(main, "shard")
