"""Write any data torchloom reads as Parquet shards, locally or to object storage, so a run
can read it with ``data=parquet`` (data/shards/parquet.py; pip install -e ".[shards]").

    python shard.py out=digits-shards rows_per_group=256           # the bundled digits
    python shard.py data=imagefolder data.root=flowers data.image_size=[96,96] \\
        out=s3://bucket/flowers images=png                         # an image folder, encoded
    python shard.py data=csv data.path=houses.csv data.target=price task=regression out=houses

Each split the data has becomes ``out/<split>/part-NNNNN.parquet`` (rows in the order the data
holds them: the order of training is the reader's), with ``out/torchloom.json`` naming the
columns and the input shape. The images are written as the run would see them (resized, in
uint8); a table as its encoded features (one-hot categories, gaps filled as training fills
them). An ``out`` that already holds shards is refused: nothing is replaced.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from data.shards.storage import arrow, filesystem, retried
from data.shards.writer import split_table, write_shards
from utils.config.build import build
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
    for key in ("rows_per_group", "rows_per_file"):
        if cfg[key] < 1:
            raise UserError(f"{key}={cfg[key]} must be 1 or more")
    if cfg.images not in ("pixels", "png"):
        raise UserError(f"images={cfg.images!r} must be pixels or png")
    refuse_written(out)
    task = build(cfg.task)
    data = build(cfg.data, **task.data_arguments(cfg.data))
    names = data.targets.class_names  # class or label names; None for values
    counts, written = {}, set()  # written: the columns the shards hold (an image, or x)
    for name, split in data.splits.items():
        if split is None:
            continue
        tables = (split_table(*chunk, names, cfg.images) for chunk in samples_of(split))
        tables = (written.update(table.column_names) or table for table in tables)
        files = write_shards(tables, f"{out}/{name}", cfg.rows_per_group, cfg.rows_per_file)
        counts[name] = (len(split), len(files))
        print(f"{name}: {len(split):,} samples in {len(files)} files under {out}/{name}/")
    uint8 = "image" in written
    described = {
        "image": "image" if uint8 else None,
        "shape": list(data.input_shape),
        "target": "label",
        "classes": names,
        "source": data.name,
        "splits": {name: {"samples": n, "files": f} for name, (n, f) in counts.items()},
        "images": cfg.images if uint8 else None,
    }
    system, root = filesystem(f"{out}/torchloom.json")
    with system.open_output_stream(root) as f:
        f.write(json.dumps(described, indent=2).encode())
    print(
        f"described in {out}/torchloom.json; train on it: python train.py data=parquet data.path={out}"
    )


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
