"""Train a model from composed Hydra configs (conf/train.yaml).

    python train.py                       # MLP on the bundled 8×8 digits: seconds on a CPU
    python train.py model=cnn optim=sgd scheduler=cosine precision=bf16 trainer.max_epochs=20
    python train.py data=cifar10 model=resnet18 data.batch_size=256
    python train.py resume=checkpoints/<run_name>/last.pt          # continue a run exactly
    python train.py run_name=job7 resume=auto                     # what a requeued job runs
    python train.py -m optim=sgd,adamw optim.lr=0.01,0.001
    torchrun --nproc_per_node=8 train.py model=resnet18 data=cifar10   # DDP; batch per process
    tensorboard --logdir runs

Outputs: runs/<run_name>/ (config, log, TensorBoard events, metrics.json) and
checkpoints/<run_name>/ (last.pt after every epoch and on SIGTERM/SIGUSR1/Ctrl-C, best.pt when
the monitored metric improves).
"""

from __future__ import annotations

from utils.signals import catch_early_signals

catch_early_signals()  # first: a SIGTERM while torch is still importing is acted on, not lost

import itertools
import logging
import sys
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from utils import debug, distributed, report, sweep
from utils.checkpoint import (
    load_checkpoint,
    load_weights,
    remove_files,
)
from utils.checkpointer import Checkpointer, Parts
from utils.compilation import compile_or_eager
from utils.config import build, check_config, run_cli
from utils.device import configure_device, configure_threads, resolve_device, wants_channels_last
from utils.errors import EXIT_USER_ERROR, UserError
from utils.evaluation import evaluate
from utils.finders import tune
from utils.guards import run_guards
from utils.loop import Loop
from utils.loss_sums import LossSums
from utils.memory import collect_cycles, cycle_collection_by_the_loop
from utils.model_check import check_forward
from utils.monitor import Monitor
from utils.nonfinite import NonFiniteWatch
from utils.optim import build_optimizer
from utils.progress import TrainingProgress, data_wait_advice
from utils.run import start_run
from utils.seeding import configure_determinism, seed_everything
from utils.signals import EXIT_INTERRUPTED, Interrupted, StopRequest, continue_command
from utils.state import TrainState

log = logging.getLogger("torchloom")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Returns the best monitored value, so Hydra sweepers (Optuna) can optimise it. In a
    sweep (-m) a failed job is recorded and returns the worst value; the sweep goes on."""
    try:
        with StopRequest() as stop:
            try:
                return train(cfg, stop)
            except Interrupted:  # last.pt holds the exact position
                stop.hand_on()  # a job scheduler's requeue, now that the checkpoint is safe
                sys.exit(EXIT_INTERRUPTED)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        if not sweep.in_sweep() or isinstance(error, sweep.ForeignJob):
            sys.exit(EXIT_USER_ERROR)
        failure = error
    except Exception as error:
        if not sweep.in_sweep():
            raise
        log.exception("job failed")
        failure = error
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    return sweep.record_failure(run_dir, failure, sweep.job_monitor_mode(cfg))


def train(cfg: DictConfig, stop: StopRequest) -> float:
    started = time.perf_counter()
    check_config(cfg)
    trainer = OmegaConf.to_object(cfg.trainer)  # a plain dataclass: the loop reads it every step
    monitor = Monitor.from_config(trainer.monitor, trainer.monitor_mode)
    run = start_run(cfg, trainer)
    if run.finished is not None:  # a re-run sweep skips the jobs it finished
        return run.finished
    processes, run_dir, checkpoint_dir = run.processes, run.run_dir, run.checkpoint_dir
    config, overrides = run.record.resolved, run.record.overrides
    console = Console(quiet=not processes.is_main)
    console.print(report.config_tree(config))
    log.info("run dir: %s\ncheckpoints: %s", run_dir, checkpoint_dir)

    # --- Seed, device, precision -----------------------------------------------------------
    seed_everything(cfg.seed)
    configure_determinism(trainer.deterministic)
    device = distributed.join(processes, resolve_device(trainer.device))
    configure_device(device)
    threads = configure_threads(trainer.cpu_threads, sweep.parallel_jobs())
    log.info("device: %s, %d CPU threads, %d process(es)", device, threads, processes.world_size)
    precision = build(cfg.precision, device=device)

    # --- Data and model: shapes flow from the dataset to the model -----------------------
    data = build(cfg.data)
    monitors = ["val/loss", "val/acc"] + (["val/acc_top5"] if data.num_classes > 5 else [])
    if trainer.monitor not in monitors:
        raise UserError(
            f"trainer.monitor={trainer.monitor!r} is not measured; use one of {monitors}"
        )
    model = build(cfg.model, input_shape=data.input_shape, num_classes=data.num_classes)
    channels_last = wants_channels_last(model, device, trainer.channels_last)
    model = model.to(device, memory_format=torch.channels_last if channels_last else None)
    check_forward(model, data.input_shape, data.num_classes, device)
    report.print_model_summary(console, model, data.input_shape, data.num_classes)
    if trainer.shapes_only:  # debug=shapes
        console.print(debug.shape_table(model, data.input_shape, device))
        return debug.NO_RESULT
    step_model = distributed.wrap(model, processes, device, trainer.sync_batchnorm)
    if trainer.compile:
        step_model = compile_or_eager(step_model, data.input_shape, device, trainer.compile_mode)
    # Evaluation shards need not have equal batch counts: no DDP collectives there.
    eval_model = step_model if not processes.enabled else model

    shard = {"rank": processes.rank, "world_size": processes.world_size}
    train_batches = data.batches("train", device, cfg.seed, channels_last, **shard)
    val_batches = data.batches("val", device, cfg.seed, channels_last, **shard)
    if trainer.overfit_batches:  # debug=overfit: the same few batches every epoch
        train_batches = debug.Fixed(train_batches, trainer.overfit_batches)
    train_batches = debug.limited(train_batches, trainer.limit_train_batches, "limit_train_batches")
    val_batches = debug.limited(val_batches, trainer.limit_eval_batches, "limit_eval_batches")
    first_batches = list(itertools.islice(train_batches.epoch(0), 2))
    run_guards(model, data.input_shape, data.batch_size, first_batches, trainer.silence_guards)
    steps_per_epoch = len(train_batches) // trainer.accumulate_grad_batches
    if steps_per_epoch == 0:
        raise UserError(
            f"{len(train_batches)} training batches cannot fill one step of "
            f"trainer.accumulate_grad_batches={trainer.accumulate_grad_batches}; lower it"
        )
    total_steps = steps_per_epoch * trainer.max_epochs
    global_batch = data.batch_size * trainer.accumulate_grad_batches * processes.world_size
    log.info("data %s: %s samples; %d per optimizer step (batch %d per process × %d "
             "accumulated × %d processes)", data.name, data.sizes(), global_batch,
             data.batch_size, trainer.accumulate_grad_batches, processes.world_size)  # fmt: skip

    # --- Optimizer and schedule: finished here because they need the model and step counts
    optimizer = build_optimizer(model, cfg.optim)
    schedule = build(cfg.scheduler)(
        optimizer, total_steps=total_steps, steps_per_epoch=steps_per_epoch
    )
    if cfg.tune:  # tune=lr | batch_size: measure, report, leave model and optimizer as they were
        return tune(cfg.tune, step_model, optimizer, train_batches, precision, data, device,
                    run_dir, console)  # fmt: skip

    # --- Training state: fresh, or exactly where a checkpoint left off -------------------
    state = TrainState()
    losses = LossSums(device, trainer.accumulate_grad_batches)
    watch = NonFiniteWatch(trainer.nonfinite, trainer.max_consecutive_skips, losses)
    parts = Parts(step_model, optimizer, schedule, precision, watch)
    checkpointer = Checkpointer(checkpoint_dir, parts, state, monitor, run.record,
                                writes=processes.is_main and trainer.write_outputs)  # fmt: skip
    checkpointer.resume(run.resumed, run.changes, cfg.seed)
    if cfg.init_from and not run.resumed:
        load_weights(model, load_checkpoint(cfg.init_from)["model"])
        log.info("weights from %s; optimizer, schedule and counters start fresh", cfg.init_from)

    from torch.utils.tensorboard import SummaryWriter  # slow import; only once we train

    if processes.is_main:
        remove_files(run.replaced)

    # Resuming: points logged after the checkpoint by the interrupted run are dropped.
    writer = (
        SummaryWriter(run_dir, purge_step=state.global_step + 1 if run.resumed else None)
        if processes.is_main and trainer.write_outputs
        else distributed.NullWriter()
    )
    report.log_sample_grid(writer, *first_batches[0], data)  # see what the model is trained on
    debug.set_anomaly_detection(trainer.detect_anomaly)  # debug=anomaly
    profiler = debug.start_profiler(trainer.profile_steps, run_dir)  # debug=profile
    if profiler:
        train_batches = debug.Profiled(train_batches, profiler)
    final = state.metrics

    # --- Train -----------------------------------------------------------------------------
    progress = TrainingProgress(console, total_steps, trainer.max_epochs)
    loop = Loop(parts, trainer, state, stop, writer, progress)
    stopped = distributed.agree(stop.requested, device)  # a signal during start-up
    with progress, cycle_collection_by_the_loop():
        while state.epoch < trainer.max_epochs and not stopped:
            if not loop.epoch(train_batches, data.batch_size):
                stopped = True
                break
            state.next_epoch()
            value = None  # the monitored metric, when this epoch is validated
            if state.epoch % trainer.val_every_n_epochs == 0 or state.epoch == trainer.max_epochs:
                val = evaluate(eval_model, val_batches.epoch(0), precision, data.num_classes)
                final.update({f"val/{name}": metric for name, metric in val.items()})
                for name, metric in val.items():
                    writer.add_scalar(f"val/{name}", metric, state.global_step)
                schedule.after_validation(final)
                value = final[monitor.name]
            checkpointer.save_epoch(value)
            collect_cycles()  # also once an epoch, however long the logging window
            log.info(
                "epoch %d/%d  train/loss %.4f  %s",
                state.epoch,
                trainer.max_epochs,
                final["train/loss"],
                "  ".join(f"{k} {v:.4f}" for k, v in final.items() if k.startswith("val/")),
            )
            stopped = distributed.agree(stop.requested, device)

    if stopped:  # a signal: save the exact position, flush, say how to continue
        checkpointer.save_on_stop(device)
        writer.close()
        if processes.is_main:
            command = continue_command(overrides, checkpointer.last, processes)
            print(f"stopped by {stop.name or 'a signal to another process'} at epoch "
                  f"{state.epoch + 1}, batch {state.batch_in_epoch}; continue with:\n  {command}")  # fmt: skip
        distributed.barrier()  # no process leaves before last.pt is written: torchrun would kill the rest
        distributed.close_processes()
        raise Interrupted

    if profiler:
        console.print(debug.profile_table(profiler))

    # --- Test the best checkpoint (val when the dataset has no test split) ----------------
    test_split = "test" if data.splits["test"] is not None else "val"
    checkpointer.load_best()
    test_batches = data.batches(test_split, device, cfg.seed, channels_last, train=False, **shard)
    test_batches = debug.limited(test_batches, trainer.limit_eval_batches, "limit_eval_batches")
    test = evaluate(eval_model, test_batches.epoch(0), precision, data.num_classes)
    for name, value in test.items():
        final[f"test/{name}"] = value
        writer.add_scalar(f"test/{name}", value, state.global_step)

    summary = loop.summary(data.batch_size)
    if summary["train/data_wait_fraction"] > 0.2:
        log.warning("warning: %s", data_wait_advice(summary["train/data_wait_fraction"], data))
    metrics = {
        "status": "completed",
        **final,
        **summary,
        "test_split": test_split,
        "monitor": trainer.monitor,
        "best_metric": state.best_metric,
        "best_epoch": state.best_epoch,
        "epochs": state.epoch,
        "global_step": state.global_step,
        "wall_time_seconds": time.perf_counter() - started,
        "best_checkpoint": str(checkpoint_dir / "best.pt"),
        "overrides": overrides,
    }
    if processes.is_main:
        report.write_json(metrics, run_dir / "metrics.json")
    if processes.is_main and trainer.write_outputs:
        report.write_hparams(writer, config, final)
    writer.close()
    distributed.close_processes()
    console.print(report.metrics_table(metrics))
    log.info("run dir: %s\ncheckpoints: %s", run_dir, checkpoint_dir)
    if trainer.overfit_batches:
        debug.check_overfit(
            final["train/loss"], trainer.overfit_loss, len(train_batches), state.epoch
        )
    return state.best_metric if state.best_metric is not None else monitor.worst


if __name__ == "__main__":
    run_cli(main, "train")
