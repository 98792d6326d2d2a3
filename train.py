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
import math
import sys
import time
from pathlib import Path

import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from utils import debug, distributed, report, sweep
from utils.checkpoint import (
    check_new_run,
    check_resumable,
    checked_top_k,
    fresh_state,
    keep_copies,
    load_checkpoint,
    load_weights,
    prepare_dir,
    prune_top_k,
    rank_top_k,
    remove_files,
    remove_stale_temporary_files,
    restore,
    resume_point,
    save_atomic,
    top_k_name,
    training_checkpoint,
)
from utils.compilation import compile_or_eager
from utils.config import build, check_config, output_dirs, run_cli, to_plain
from utils.device import configure_device, configure_threads, resolve_device, wants_channels_last
from utils.errors import EXIT_USER_ERROR, UserError
from utils.evaluation import evaluate
from utils.finders import tune
from utils.guards import run_guards
from utils.loss_sums import LossSums
from utils.memory import collect_cycles, cycle_collection_by_the_loop, out_of_memory
from utils.model_check import check_forward
from utils.monitor import monitor_mode
from utils.nonfinite import NonFiniteWatch
from utils.optim import build_optimizer, hyperparameters
from utils.progress import TrainingProgress, data_wait_advice
from utils.seeding import all_rng_states, configure_determinism, seed_everything, seed_rank_stream
from utils.signals import EXIT_INTERRUPTED, StopRequest, continue_command

log = logging.getLogger("torchloom")


def train_one_epoch(
    model, batches, optimizer, schedule, precision, trainer, state, losses, writer, progress,
    stop, watch,
) -> bool:  # fmt: skip
    """Train from the data position in ``state`` to the end of its epoch. Returns False when a
    stop was requested first; ``state`` then holds the position to resume from.

    The loss stays on the device; the host waits for it only on logging steps.
    """
    model.train()
    accumulate = trainer.accumulate_grad_batches
    # Every optimizer step sees exactly `accumulate` micro-batches; a remainder is dropped.
    micro_batches = (len(batches) // accumulate) * accumulate
    start = state["batch_in_epoch"]
    timed_batches, window_start = 0, time.perf_counter()
    several_processes = distributed.is_distributed()
    batches_left = itertools.islice(batches.epoch(state["epoch"], start), micro_batches - start)
    for index, (images, labels) in enumerate(progress.data_wait.timed(batches_left), start):
        # Under DDP, only the last micro-batch of a step all-reduces its gradients.
        with distributed.gradient_sync(model, sync=(index + 1) % accumulate == 0):
            with precision.autocast():
                loss = F.cross_entropy(model(images), labels)
            precision.scaler.scale(loss / accumulate if accumulate > 1 else loss).backward()
        losses.add(watch.observe(loss))  # summed, and checked for NaN/Inf, at the next sync
        timed_batches += 1
        state["batch_in_epoch"] = index + 1
        if (index + 1) % accumulate:
            continue

        log_due = (state["global_step"] + 1) % trainer.log_every_n_steps == 0
        grad_norm = None
        if trainer.gradient_clip_val is not None or log_due:
            precision.scaler.unscale_(optimizer)  # clip and measure true gradients, not scaled
            if trainer.gradient_clip_val is not None:
                max_norm = trainer.gradient_clip_val
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
            else:  # measured only: no pass over every gradient to scale it by 1
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                grad_norm = torch.nn.utils.get_total_norm(grads)
            if log_due and trainer.log_grad_norms == "per_layer":
                for name, norm in report.per_layer_grad_norms(model).items():
                    writer.add_scalar(f"grad_norm/{name}", norm, state["global_step"] + 1)
        if watch.step_allowed(state["global_step"] + 1, optimizer):
            precision.scaler.step(optimizer)
            precision.scaler.update()
            schedule.after_optimizer_step()  # the LR schedule counts the steps taken
        else:
            precision.discard_step()
        optimizer.zero_grad(set_to_none=True)
        state["global_step"] += 1

        if log_due:
            step, seconds = state["global_step"], time.perf_counter() - window_start
            mean_loss = distributed.all_mean(losses.window_mean(step), labels.device)  # the sync
            watch.check(step, model, optimizer, precision.scaler)
            samples_per_second = timed_batches * len(labels) / seconds
            writer.add_scalar("train/loss", mean_loss, step)
            writer.add_scalar("train/lr", optimizer.param_groups[0]["lr"], step)
            writer.add_scalar("train/grad_norm", grad_norm.item(), step)
            writer.add_scalar("train/skipped_steps", watch.skipped, step)
            progress.update(state["epoch"], step, mean_loss, samples_per_second)
            collect_cycles()  # here, not at a random step (utils/memory.py)
            timed_batches, window_start = 0, time.perf_counter()
        else:
            progress.update(state["epoch"], state["global_step"])
        # Several processes must stop at the same step: they agree when they sync anyway.
        stop_check_due = log_due or not several_processes
        if (
            stop_check_due
            and distributed.agree(stop.requested, labels.device)
            and index + 1 < micro_batches
        ):
            return False
    return True


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Returns the best monitored value, so Hydra sweepers (Optuna) can optimise it. In a
    sweep (-m) a failed job is recorded and returns the worst value; the sweep goes on."""
    try:
        with StopRequest() as stop:
            return train(cfg, stop)
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
    processes = distributed.processes_from_env()  # under torchrun: this rank; rank 0 alone reports
    console = Console(quiet=not processes.is_main)
    if not processes.is_main:
        log.setLevel(logging.WARNING)
    run_dir, checkpoint_dir = output_dirs(cfg, Path(HydraConfig.get().runtime.output_dir))
    prepare_dir(run_dir, "the run")
    if trainer.write_outputs:  # debug=fast_dev_run writes no checkpoints or TensorBoard
        prepare_dir(checkpoint_dir, "checkpoints")
        if processes.is_main:
            remove_stale_temporary_files(checkpoint_dir)
    config, overrides = to_plain(cfg), sweep.job_overrides()
    previous, resume = sweep.job_start(run_dir, cfg.resume, overrides)
    if previous is not None:  # a re-run sweep skips the jobs it finished
        return previous
    replaced = []  # an earlier run of this name, with overwrite=true: removed once set up
    if resume is None and not trainer.shapes_only:  # never silently over an earlier run
        replaced = check_new_run(run_dir, checkpoint_dir, cfg.overwrite)
    resumed = resume_point(resume, checkpoint_dir)
    if resumed:
        changes = check_resumable(*resumed, config, cfg.resume_allow_changes, overrides)
        for line in changes.applied + changes.need_allow:
            log.info("resume: applying the changed %s", line)
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
    state = fresh_state()
    losses = LossSums(device, trainer.accumulate_grad_batches)
    watch = NonFiniteWatch(trainer.nonfinite, trainer.max_consecutive_skips, losses)
    if resumed:
        built = hyperparameters(optimizer)  # as the new config builds them
        restored_schedule = None if changes.reschedule else schedule
        restore(resumed[1], model, optimizer, restored_schedule, precision.scaler, state, losses)
        if changes.reschedule:
            schedule.continue_changed(resumed[1]["scheduler"], optimizer, built)
        state["top_k"] = checked_top_k(state["top_k"], checkpoint_dir)
        if processes.is_main and trainer.write_outputs:
            prune_top_k(checkpoint_dir, state["top_k"], trainer.keep_top_k, state["epoch"])
        watch.skipped = state["skipped_steps"]
        state["batch_in_epoch"] = distributed.rescale_position(
            state["batch_in_epoch"], resumed[1].get("world_size", 1), processes.world_size,
            trainer.accumulate_grad_batches,
        )  # fmt: skip
        watch.saved = f"{resumed[0]} is intact"
        log.info("resumed from %s: epoch %d, batch %d, step %d", resumed[0], state["epoch"] + 1,
                 state["batch_in_epoch"], state["global_step"])  # fmt: skip
    else:  # the model is built alike everywhere; what the forward pass draws differs by rank
        seed_rank_stream(cfg.seed, processes.rank)
    if cfg.init_from and not resumed:
        load_weights(model, load_checkpoint(cfg.init_from)["model"])
        log.info("weights from %s; optimizer, schedule and counters start fresh", cfg.init_from)

    from torch.utils.tensorboard import SummaryWriter  # slow import; only once we train

    if processes.is_main:
        remove_files(replaced)

    # Resuming: points logged after the checkpoint by the interrupted run are dropped.
    writer = (
        SummaryWriter(run_dir, purge_step=state["global_step"] + 1 if resumed else None)
        if processes.is_main and trainer.write_outputs
        else distributed.NullWriter()
    )
    report.log_sample_grid(writer, *first_batches[0], data)  # see what the model is trained on
    debug.set_anomaly_detection(trainer.detect_anomaly)  # debug=anomaly
    profiler = debug.start_profiler(trainer.profile_steps, run_dir)  # debug=profile
    if profiler:
        train_batches = debug.Profiled(train_batches, profiler)
    sign = 1 if monitor_mode(trainer.monitor, trainer.monitor_mode) == "max" else -1
    final = state["metrics"]

    def save(path: Path) -> None:
        rng = all_rng_states()  # every process takes part: each saves its own dropout stream
        state["skipped_steps"] = watch.skipped
        if processes.is_main and trainer.write_outputs:  # one process writes the weights
            save_atomic(training_checkpoint(model, optimizer, schedule, precision.scaler, state,
                                            losses, trainer.monitor, config, overrides, rng),
                        path)  # fmt: skip

    # --- Train -----------------------------------------------------------------------------
    train_seconds, trained_steps = 0.0, 0
    stopped = distributed.agree(stop.requested, device)  # a signal during start-up
    progress = TrainingProgress(console, total_steps, trainer.max_epochs)
    with progress, cycle_collection_by_the_loop():
        while state["epoch"] < trainer.max_epochs and not stopped:
            epoch_start, step_before = time.perf_counter(), state["global_step"]
            wait_before = progress.data_wait.seconds
            try:
                finished = train_one_epoch(step_model, train_batches, optimizer, schedule,
                                           precision, trainer, state, losses, writer, progress,
                                           stop, watch)  # fmt: skip
            except torch.OutOfMemoryError:
                accumulate = trainer.accumulate_grad_batches
                raise out_of_memory(device, data.batch_size, accumulate, watch.saved) from None
            except RuntimeError as error:  # debug=anomaly names the op that made a NaN
                raise (debug.anomaly_error(error) or error) from None
            if finished:  # reading the loss waits for the device, so the clock below is true
                micro_batches = steps_per_epoch * trainer.accumulate_grad_batches
                epoch_loss = losses.epoch_mean(state["global_step"], micro_batches)
                final["train/loss"] = distributed.all_mean(epoch_loss, device)
            seconds = time.perf_counter() - epoch_start
            train_seconds += seconds
            trained_steps += state["global_step"] - step_before
            if not finished:
                stopped = True
                break
            samples = (state["global_step"] - step_before) * trainer.accumulate_grad_batches
            writer.add_scalar("train/samples_per_second", samples * data.batch_size / seconds,
                              state["global_step"])  # fmt: skip
            waited = (progress.data_wait.seconds - wait_before) / seconds
            writer.add_scalar("train/data_wait_fraction", waited, state["global_step"])
            state.update(epoch=state["epoch"] + 1, batch_in_epoch=0)
            improved, keep, dropped = False, False, []
            if (
                state["epoch"] % trainer.val_every_n_epochs == 0
                or state["epoch"] == trainer.max_epochs
            ):
                val = evaluate(eval_model, val_batches.epoch(0), precision, data.num_classes)
                final.update({f"val/{name}": value for name, value in val.items()})
                for name, value in val.items():
                    writer.add_scalar(f"val/{name}", value, state["global_step"])
                schedule.after_validation(final)
                value = final[trainer.monitor]
                # Ties go to the later epoch: trained longer, usually at a lower LR.
                improved = (
                    state["best_metric"] is None or sign * (value - state["best_metric"]) >= 0
                )
                if improved:
                    state["best_metric"], state["best_epoch"] = value, state["epoch"]
                top_k_file = top_k_name(state["epoch"], trainer.monitor, value)
                keep, dropped = rank_top_k(
                    state["top_k"], trainer.keep_top_k, top_k_file, value, sign
                )
            # Never a checkpoint from NaN weights.
            watch.check(state["global_step"], model, optimizer, precision.scaler, weights=True)
            save(checkpoint_dir / "last.pt")
            watch.saved = f"{checkpoint_dir / 'last.pt'} (epoch {state['epoch']}) is intact"
            if processes.is_main and trainer.write_outputs:  # best.pt, top-k: copies of last.pt
                keep_copies(checkpoint_dir, best=improved, top_k_file=keep and top_k_file,
                            dropped=dropped)  # fmt: skip
            collect_cycles()  # also once an epoch, however long the logging window
            log.info(
                "epoch %d/%d  train/loss %.4f  %s",
                state["epoch"],
                trainer.max_epochs,
                final["train/loss"],
                "  ".join(f"{k} {v:.4f}" for k, v in final.items() if k.startswith("val/")),
            )
            stopped = distributed.agree(stop.requested, device)
            if stopped:
                break

    if stopped:  # a signal: save the exact position, flush, say how to continue
        unsaved = state["batch_in_epoch"] or not (checkpoint_dir / "last.pt").exists()
        if distributed.agree(bool(unsaved), device):  # saving is collective: all or none
            watch.check(state["global_step"], model, optimizer, precision.scaler, weights=True)
            save(checkpoint_dir / "last.pt")
        writer.close()
        if processes.is_main:
            command = continue_command(overrides, checkpoint_dir / "last.pt", processes)
            print(f"stopped by {stop.name or 'a signal to another process'} at epoch "
                  f"{state['epoch'] + 1}, batch {state['batch_in_epoch']}; continue with:\n  {command}")  # fmt: skip
        distributed.barrier()  # no process leaves before last.pt is written: torchrun would kill the rest
        distributed.close_processes()
        stop.hand_on()
        sys.exit(EXIT_INTERRUPTED)

    if profiler:
        console.print(debug.profile_table(profiler))

    # --- Test the best checkpoint (val when the dataset has no test split) ----------------
    test_split = "test" if data.splits["test"] is not None else "val"
    distributed.barrier()  # best.pt is complete before any process reads it
    if (checkpoint_dir / "best.pt").exists():
        load_weights(model, load_checkpoint(checkpoint_dir / "best.pt")["model"])
    test_batches = data.batches(test_split, device, cfg.seed, channels_last, train=False, **shard)
    test_batches = debug.limited(test_batches, trainer.limit_eval_batches, "limit_eval_batches")
    test = evaluate(eval_model, test_batches.epoch(0), precision, data.num_classes)
    for name, value in test.items():
        final[f"test/{name}"] = value
        writer.add_scalar(f"test/{name}", value, state["global_step"])

    trained_samples = trained_steps * data.batch_size * trainer.accumulate_grad_batches
    data_wait_fraction = progress.data_wait.seconds / train_seconds if train_seconds else 0.0
    if data_wait_fraction > 0.2:
        log.warning("warning: %s", data_wait_advice(data_wait_fraction, data))
    metrics = {
        "status": "completed",
        **final,
        "train/samples_per_second": trained_samples / train_seconds if train_seconds else 0.0,
        "train/data_wait_fraction": data_wait_fraction,
        "train/skipped_steps": watch.skipped,
        "test_split": test_split,
        "monitor": trainer.monitor,
        "best_metric": state["best_metric"],
        "best_epoch": state["best_epoch"],
        "epochs": state["epoch"],
        "global_step": state["global_step"],
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
            final["train/loss"], trainer.overfit_loss, len(train_batches), state["epoch"]
        )
    best = state["best_metric"]
    return best if best is not None else -sign * math.inf


if __name__ == "__main__":
    run_cli(main, "train")
