"""What a practitioner looks at: one self-contained ``report.html`` per run, evaluation and
sweep — the pictures drawn by utils/plots.py, the figures as the run wrote them.

    page        the HTML page: escaped text, tables, embedded pictures, written atomically
    history     a run's curves read back from its folder (TensorBoard events or metrics.csv)
    evidence    the test split's predictions and worst samples, kept beside the report
    run         a training run's report, from its folder alone
    evaluation  evaluate.py's report, from its metrics.json
    sweep       a sweep's report: its jobs, and a search's trials
"""
