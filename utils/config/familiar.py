"""Names a user brings from Lightning, timm's train.py and argparse scripts, and torchloom's
own for the same thing: a typo's suggestion names ours, never a key nothing reads.

    python train.py fast_dev_run=true     # error: ...; torchloom's is debug=fast_dev_run
    python train.py --lr 0.01             # error: ...; torchloom's is optim.lr=0.01
"""

from __future__ import annotations

import re

# The last part of a key (or a flag's name) → what torchloom calls it.
FAMILIAR = {
    "fast_dev_run": "debug=fast_dev_run",
    "overfit_batches": "debug=overfit",
    "max_epochs": "trainer.max_epochs",
    "epochs": "trainer.max_epochs",
    "seed_everything": "seed",
    "seed": "seed",
    "lr": "optim.lr",
    "learning_rate": "optim.lr",
    "weight_decay": "optim.weight_decay",
    "wd": "optim.weight_decay",
    "opt": "optim=<name>",
    "optimizer": "optim=<name>",
    "sched": "scheduler=<name>",
    "lr_scheduler": "scheduler=<name>",
    "warmup_epochs": "scheduler.warmup_steps (in optimizer steps)",
    "batch_size": "data.batch_size",
    "workers": "data.num_workers",
    "num_workers": "data.num_workers",
    "accelerator": "trainer.device",
    "devices": "trainer.device (and torchrun --nproc_per_node for several)",
    "gpus": "trainer.device (and torchrun --nproc_per_node for several)",
    "precision": "precision=<fp32|fp16|bf16|auto>",
    "amp": "precision=<fp16|bf16|auto>",
    "gradient_clip_val": "trainer.gradient_clip_val",
    "clip_grad": "trainer.gradient_clip_val",
    "accumulate_grad_batches": "trainer.accumulate_grad_batches",
    "check_val_every_n_epoch": "trainer.val_every_n_epochs",
    "log_every_n_steps": "trainer.log_every_n_steps",
    "limit_train_batches": "trainer.limit_train_batches",
    "limit_val_batches": "trainer.limit_eval_batches",
    "deterministic": "trainer.deterministic",
    "default_root_dir": "paths.runs and paths.checkpoints",
    "output": "paths.runs",
    "ckpt_path": "resume=<checkpoint>",
    "resume_from_checkpoint": "resume=<checkpoint>",
    "resume": "resume=<checkpoint>",
    "model_ema": "trainer.ema.decay",
    "model_ema_decay": "trainer.ema.decay",
    "smoothing": "task.label_smoothing",
    "label_smoothing": "task.label_smoothing",
    "mixup": "data.augment.mixup_alpha",
    "cutmix": "data.augment.cutmix_alpha",
    "hflip": "data.augment.horizontal_flip",
    "patience": "trainer.early_stopping.patience",
    "compile": "trainer.compile",
}
# Hydra's own flags, which are not a user's misplaced keys.
HYDRA_FLAGS = re.compile(
    r"--(multirun|cfg|help|hydra-help|version|package|info|run|resolve|config-path|"
    r"config-name|config-dir|experimental-rerun|shell-completion)(=.*)?"
)


def ours(key: str) -> str | None:
    """torchloom's name for a familiar ``key`` (its last part), or None."""
    return FAMILIAR.get(key.lstrip("+~-").rsplit(".", 1)[-1].replace("-", "_"))


def flag_error(argv: list[str]) -> str | None:
    """The one line for an argparse-style flag (``--lr 0.01``, ``--lr=0.01``) on a command
    line of ``key=value`` overrides, naming torchloom's key; None when there is none."""
    for at, arg in enumerate(argv):
        if not arg.startswith("--") or HYDRA_FLAGS.fullmatch(arg):
            continue
        name, equals, value = arg[2:].partition("=")
        if not equals and at + 1 < len(argv) and not argv[at + 1].startswith("-"):
            value = argv[at + 1]
        mapped = ours(name)
        key = (mapped or name).split(" ", 1)[0]
        example = key if "=" in key else f"{key}={value or '...'}"
        said = f"torchloom's is {example}" if mapped else f"write {example}"
        return (
            f"{arg}: torchloom takes key=value overrides, not --flags; {said} "
            "(python train.py --help lists the groups; conf/ shows every key)"
        )
    return None
