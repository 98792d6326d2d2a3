"""What each part of utils/ answers, in the order a run's phases use them; each package's
``__init__`` maps its own modules. Lower lines never import higher ones (tests/test_layering.py).
No imports here: ``python -m utils.doctor`` must start on a broken install.

The foundation
    errors       UserError and the exit codes; an OS error on a path as one line
    text         names from data as terminal text and as spreadsheet cells
    files        every file a run writes appears complete or not at all (the one writer)
    intact       are a file's bytes as torch.save wrote them (the checksums torch.load skips)
    doctor       python -m utils.doctor: is this machine ready?
    plots        every picture, as PNG bytes from plain numbers (matplotlib, headless)
    system/      the machine and the processes: signals, claims, device, torchrun, seeds
    config/      what was asked and what it means: schemas, resolvers, build, trust
(data/ and models/ sit here: they use only what is above)
The pieces a run is built of
    precision    autocast and the loss scaler (conf/precision)
    schedulers   LR schedules (conf/scheduler)
    model/       the model as built, stepped and evaluated; its optimizer; start-up guards
    evaluation/  scores over a split; calibration, tables, exports
    tracking/    where the history goes (conf/logger), never ahead of last.pt
    diagnose/    the debug modes, tune=lr and tune=batch_size
    tasks/       what is predicted (classification, multilabel, regression): the loss, the
                 scores, the target scale, what an export holds
    checkpoint/  what a checkpoint holds, read safely; a model rebuilt from one alone
    report/      report.html of a run, an evaluation, a sweep: pictures and figures
Running them
    fit/         the epochs: the step, the state that resumes, the averages, when to save
    run/         a command's life: folders, start, resume, outputs, sweeps, cross-validation
    preflight/   each command's checks that need only its config
"""
