"""What each module of utils/ answers (no imports here: `python -m utils.doctor` must start on a
broken install).

Setting up a run
    config       the schema, resolvers and every check that needs only the config; build
    cli          run_cli: a command line Hydra cannot compose ends in one line
    resume_changes  what a resume may change, and how each difference is classified
    arguments    builders' argument rules, bound to their signatures before anything is built
    trust        what a stored config may build (exact _target_ allowlist)
    stored       what another run stored, read as untrusted data; the safetensors export;
                 the average of a run's top-k copies
    rebuild      a model rebuilt from a checkpoint alone (predict.py, distill.teacher)
    run          where a run lives and how it starts: continue, replace or refuse; RunContext:
                 which process this is and whether it writes files; device, threads, seed
    claim        one run per folder at a time: a lock the kernel ends with the process
    device       trainer.device, fast defaults, CPU threads per process
    distributed  torchrun's processes, DDP, collectives
    seeding      seeds, per-rank streams, RNG states in checkpoints
    modules      the model as built, as the step calls it (DDP, compile), as evaluation calls it
    compilation  torch.compile, or eager with one warning
    optim        the optimizer's parameter groups (no decay on biases and norms, each layer's
                 LR), the table of LRs by layer
    layers       which layer each parameter belongs to (optim.layer_decay): a model's
                 layer_groups(), or the rule by module order
    schedulers   LR schedules (conf/scheduler)
    precision    autocast and the loss scaler (conf/precision)
    tasks        what is predicted (classification, multilabel, regression), so the loss, the
                 scores validation adds up, the target scale, what an export holds
    guards       start-up checks against classic pitfalls; step counts
    model_check  the dummy forward; parameter counts
Training
    state        TrainState: every counter that resumes (position, best, top-k, patience,
                 skipped steps) and the latest metrics
    monitor      which way is better for the monitored metric
    loop         Parts (what a step changes) and the step and its epochs: loss sums, NaN
                 watch, timing, stop agreement
    ema          an exponential moving average of the weights (trainer.ema)
    teacher      distill.*: the teacher rebuilt from its checkpoint, the blended loss, its
                 file's sha256 on resume
    swa          stochastic weight averaging (trainer.swa): the average, SWA's LR phase,
                 BatchNorm statistics refitted
    early_stopping  when the monitored metric stopped improving (trainer.early_stopping)
    loss_sums    the loss summed on the device between syncs
    nonfinite    what happens on a NaN or Inf loss
    memory       cycle collection by the loop; the out-of-memory message; what fits in memory
    checkpointer what is saved, when and where; resume, stop, best, which top-k copies stay
    checkpoint   file level: atomic writes, safe loading, which file in a folder, fitting weights
    signals      stop requests and exit code 3
    sweep        sweep jobs: skip finished, record failures, the summary table (seeds and
                 folds grouped)
    cross_validation  cv=K: every fold a run of its own, resumable; oof.csv, the pooled
                 out-of-fold metrics, the mean returned
Showing and measuring
    outputs      who prints and who writes (the history, metrics.json, tables), decided once;
                 an output path is never one of the command's inputs
    tracking     where the history goes (conf/logger) and how far it may run ahead of last.pt:
                 held points, the tracked run a resume continues, finished/failed/killed
    trackers     the history in the run dir: TensorBoard events, the long-form metrics.csv
    tracker_mlflow  logger=mlflow: a run in an MLflow store (sqlite under runs/ by default)
    tracker_process  a tracker in a process of its own beside the training (MLflow's import
                 and store check off the training's path); its log and stops handed back
    tracker_wandb   logger=wandb: a W&B run, offline unless an API key is set up
    text         names from data as terminal text and as spreadsheet cells
    report       what the config tree, model summary, final table and metrics.json hold
    progress     the progress bar and plain progress lines
    evaluation   each task's metrics over a split (accuracy, mAP and F1, MAE/RMSE/R²)
    calibration  a temperature and thresholds fitted on val, their record; ROC-AUC with ties
    eval_tables  evaluate.py's tables (per class, per label, per target), confusion CSV, image
    predictions  predict.py: the checkpoint's record of its inputs, new inputs read alike
    export       evaluate.py export=model.pt2|model.onnx: one torch.export program, verified
                 on batches of 1, 2 and 8 before it is written
    debug        the debug modes (conf/debug)
    finders      tune=lr and tune=batch_size
    doctor       python -m utils.doctor: is this machine ready?
    errors       UserError and the exit codes; an OS error on a path as one line
"""
