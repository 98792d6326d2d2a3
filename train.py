"""Train a model from composed Hydra configs (conf/train.yaml).

    python train.py                       # MLP on the bundled 8×8 digits: seconds on a CPU
    python train.py model=cnn optim=sgd scheduler=cosine precision=bf16 trainer.max_epochs=20
    python train.py data=cifar10 model=resnet18 data.batch_size=256
    python train.py resume=checkpoints/<run_name>/last.pt          # continue a run exactly
    python train.py run_name=job7 resume=auto                     # what a requeued job runs
    python train.py -m optim=sgd,adamw optim.lr=0.01,0.001
    python train.py cv=5                  # 5-fold cross-validation: runs/<run>/oof.csv, mean ± std
    torchrun --nproc_per_node=8 train.py model=resnet18 data=cifar10   # DDP; batch per process
    python train.py logger=[tensorboard,csv,mlflow]   # conf/logger/; mlflow ui --backend-store-uri sqlite:///runs/mlflow.db
    tensorboard --logdir runs

Outputs: runs/<run_name>/ (config, log, TensorBoard events or the loggers of logger=[...],
metrics.json) and
checkpoints/<run_name>/ (last.pt after every epoch and on SIGTERM/SIGUSR1/Ctrl-C, best.pt when
the monitored metric improves).
"""

from __future__ import annotations

import sys

from utils.system.cpu_math import same_bits_every_run
from utils.system.signals import catch_early_signals

catch_early_signals()  # first: a SIGTERM while torch is still importing is acted on, not lost
same_bits_every_run()  # before torch loads MKL: a resumed run ends bit-equal (utils/system/cpu_math.py)

from utils.tracking.process import start_early

start_early(sys.argv)  # logger=...mlflow: its process imports MLflow while torch imports here

from utils import plots

plots.warm_up(sys.argv)  # report.html's plotting library, imported meanwhile

import logging
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from utils.checkpoint.record import InputRecord
from utils.config.build import build
from utils.config.monitor import Monitor
from utils.config.resolvers import in_sweep
from utils.diagnose import debug
from utils.diagnose.tune import tune
from utils.errors import EXIT_FAILED, EXIT_USER_ERROR, UserError, print_error, user_error_in
from utils.evaluation.baselines import fit_baselines
from utils.evaluation.judge import Judge
from utils.fit import (
    CallbackFailed,
    Callbacks,
    Checkpointer,
    EarlyStopping,
    Loop,
    Objective,
    Parts,
    Teacher,
    TrainingProgress,
    TrainState,
)
from utils.model import Modules, build_optimizer, check_start_up, lr_table
from utils.preflight.train import check_config
from utils.run import (
    Outputs,
    RunContext,
    cross_validate,
    provenance,
    refit,
    report,
    run_cli,
    save_fold_predictions,
    start_run,
    sweep,
)
from utils.run.folders import DRY_RUN_FILES, remove_unused, run_folders
from utils.run.trial import trial_callbacks
from utils.system.signals import EXIT_INTERRUPTED, Interrupted, StopRequest
from utils.tracking.tracker import Tracker

log = logging.getLogger("torchloom")


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float:
    """Returns the best monitored value, so Hydra sweepers (Optuna) can optimise it. In a
    sweep (-m) a failed job is recorded and returns the worst value; the sweep goes on."""
    try:
        with StopRequest() as stop:
            try:
                if cfg.cv:  # cv=K: every fold, each a run of train() in runs/<run>/fold-<k>/
                    return cross_validate(cfg, stop, train)
                value = train(cfg, stop)
                refit(cfg, stop, train)  # trainer.refit: again on train ∪ val, when it asks
                if not cfg.trainer.write_outputs and not in_sweep():  # debug=fast_dev_run
                    for folder in remove_unused(run_folders(cfg), DRY_RUN_FILES):
                        log.info("a dry run keeps nothing: %s removed", folder)
                return value
            except Interrupted:  # last.pt holds the exact position
                stop.hand_on()  # a job scheduler's requeue, now that the checkpoint is safe
                sys.exit(EXIT_INTERRUPTED)
    except Exception as error:
        failure = user_error_in(error) or error  # an OS error on a path counts as bad input
        if isinstance(failure, UserError):
            print_error(failure)
            if not in_sweep() or isinstance(failure, sweep.ForeignJob):
                remove_unused(run_folders(cfg))  # a start on bad data leaves no empty folders
                sys.exit(EXIT_USER_ERROR)
        elif isinstance(failure, CallbackFailed):
            failure.report()  # one line; its traceback in the run's train.log
            if not in_sweep():
                sys.exit(EXIT_FAILED)
        elif not in_sweep():
            raise
        else:
            log.exception("job failed")
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    return sweep.record_failure(run_dir, failure, sweep.job_monitor_mode(cfg))


def train(cfg: DictConfig, stop: StopRequest, run_dir: Path | None = None) -> float:
    """Check → set up the run → data and parts → (debug and tune exits) → epochs {train,
    validate, checkpoint, log} → test best.pt → report; the best monitored value. Raises
    UserError on bad input, Interrupted once a stop's last.pt is written. ``run_dir``: a cv fold's."""
    started = time.perf_counter()
    trainer = check_config(cfg)
    monitor = Monitor.from_config(trainer.monitor, trainer.monitor_mode)
    run = start_run(cfg, trainer, run_dir)  # folders; a finished sweep job, a resume or a new run
    if run.finished is not None:
        return run.finished
    context = RunContext.for_training(run.processes, trainer, cfg.seed, run.stored_numerics)
    # yours, by name (conf/callbacks/); in a trial of a search, its pruning (utils/run/search.py)
    callbacks = Callbacks.build(trial_callbacks(cfg.callbacks, run_dir), run.processes)
    tracker = Tracker.of(cfg.logger, context.writes, Path(cfg.paths.runs))  # connects meanwhile
    out = Outputs(run.run_dir, context.is_main, tracker)
    precision = build(cfg.precision, device=context.device)

    # --- Task, data and model: the task says what targets are; shapes flow to the model ----
    task, data = task_and_data(cfg, run.stored_inputs, context.device)
    monitor.check_measured([f"val/{name}" for name in task.measured()])
    teacher = Teacher.of(cfg.distill, data, task, context.device, run.checkpoint_dir)  # or None
    modules = Modules.build(cfg.model, data, context.device, trainer.channels_last, task)
    data.fit_augmentation(modules.flattens_input)  # no random crops or flips for an MLP
    out.print(report.config_tree(run.record.resolved))  # once data and model are built from it
    log.info("run dir: %s\ncheckpoints: %s", run.run_dir, run.checkpoint_dir)
    out.print(report.model_summary(modules.model, data.input_shape, task))
    if trainer.shapes_only:  # debug=shapes
        return debug.show_shapes(modules, out)
    modules.wrap_for_steps(context.processes, trainer, precision.dtype)  # DDP or FSDP, compile
    placement = context.placement(modules.channels_last, modules.batch_members)  # members' rows
    own = data.batches_for(placement, cfg.seed, trainer.accumulate_grad_batches)  # whole steps
    batches = debug.wrap_batches(own, trainer)
    start = check_start_up(modules.model, data, batches.train, trainer, task, context.processes)
    trainer.max_epochs = start.epochs  # trainer.max_epochs=auto: fitted to the training set

    # --- Optimizer, schedule and what a step changes; then fresh or where a checkpoint left off
    optimizer = build_optimizer(modules.model, cfg.optim)  # param groups fixed here, once
    out.print(lr_table(optimizer))  # optim.layer_decay: each layer's LR
    schedule = build(cfg.scheduler)(optimizer, start.steps)
    objective = Objective(task.training_loss(), teacher)  # a teacher's outputs blended in
    parts = Parts.assemble(modules, optimizer, schedule, precision, objective, trainer)  # EMA, SWA
    parts.callbacks = callbacks  # called by the loop and the checkpointer; saved under their names
    if cfg.tune:  # tune=lr | batch_size: measure, report, leave model and optimizer as they were
        return tune(cfg.tune, parts, batches.train, data, out)
    state = TrainState.since(started, data.batch_size * context.processes.world_size)  # resumes
    early = EarlyStopping.of(trainer.early_stopping, monitor, state)
    run.record = run.record.with_inputs(InputRecord.from_run(data, task).to_dict())  # predict
    run.record = provenance.recorded(cfg, data, run, context.processes, out)  # guards resume
    checkpointer = Checkpointer(run, context, parts, state, monitor, trainer)
    checkpointer.start(cfg.init_from, out.tracker)  # the resumed position, or a fresh run
    run.remove_replaced()  # overwrite=true: the earlier run's files, now that this one is set up
    debugging = debug.Debugging(trainer, run.run_dir)  # debug=anomaly, debug=profile
    judge = Judge(parts.judged(modules.eval_model, trainer.ema), precision, task, state, out)

    # --- Train, tracked (conf/logger/): never ahead of last.pt; failed or killed if it raises
    tracked = out.track(run.tracked, state, run.stored_tracking)
    with tracked.tracking() as tracker, callbacks.watching():  # on_exception if it fails
        if not run.resumed:
            report.log_sample_grid(tracker, start.first_batches[0], data, task)  # what it sees
        callbacks.fit_start(run, data.sizes(), context.processes)
        progress = TrainingProgress(out.console, start.steps.total, trainer.max_epochs)
        loop = Loop(checkpointer, trainer, stop, tracker, progress)
        for _ in loop.epochs(debugging.batches(batches.train), data.batch_size, done=early.done):
            if parts.swa:  # trainer.swa: into the average; its BatchNorm statistics refitted
                parts.swa.epoch_finished(state.epoch, batches.train_in_order().epoch(0), precision)
            value = None  # the monitored metric, when this epoch is validated
            if state.validation_due(trainer.val_every_n_epochs, trainer.max_epochs):
                schedule.after_validation(judge.validate(batches.val))  # scheduler=plateau
                value = state.metrics[monitor.name]
                early.update(value, state.epoch)  # counted in the state: saved with the epoch
                callbacks.validation_end(state)  # a stop asked is saved with the epoch
            checkpointer.save_epoch(value)  # last.pt, then the history it covers is sent
            log.info(state.epoch_line(trainer.max_epochs))  # (a signal's stop raised Interrupted)
        debugging.report(out)

        # --- Test the best checkpoint (val when the dataset has no test split) ------------
        checkpointer.load_best()  # its weights, and its val/ figures for metrics.json
        judge.test(batches.test())
        if data.fold_ids is not None:  # data.split.folds: best.pt's val predictions (oof.csv)
            save_fold_predictions(out, judge.model, batches.val, precision, task, data)
        summary = loop.summary(data)  # throughput and data wait, with advice when it waited
        metrics = report.final_metrics(state, summary, data, checkpointer)
        metrics.update(fit_baselines(cfg.baselines, data, task, cfg.seed) if out.is_main else {})
        out.finish({**metrics, **early.summary()}, run.record.resolved, state.metrics)
        if cfg.report:  # report.html: curves, the test split's pictures, the baselines
            out.report_run(judge.evidence(batches.test(), data.inputs), data, task.names)
        callbacks.fit_end(loop.status, metrics)
    context.close()
    log.info("run dir: %s\ncheckpoints: %s", run.run_dir, run.checkpoint_dir)
    debug.after_fit(trainer, state, batches.train)  # debug=overfit: did the loss fall?
    return monitor.best_or_worst(state.best_metric)


def task_and_data(cfg: DictConfig, stored: InputRecord | None, device: Any) -> tuple[Any, Any]:
    """The task (conf/task/: classification, multilabel or regression) says what the targets
    are, the data builder reads them (csv, tensors, image_csv: of the task's kind), and the
    task is fitted to them. A resumed run (``stored``: its checkpoint's inputs record) reads
    its data exactly as it started: the same normalisation and target scale."""
    task = build(cfg.task)
    data = build(cfg.data, **task.data_arguments(cfg.data, stored))
    if cfg.trainer.train_on_val:  # trainer.refit's run (utils/run/refit.py)
        data.join_val()
    if stored is not None:
        # Its train split's gap fills differ only if the data changed: provenance's to judge.
        data.follow_record(stored, "the resumed checkpoint", use="resume it", fills=False)
    return task.fitted(data, device, stored), data


if __name__ == "__main__":
    run_cli(main, "train")
