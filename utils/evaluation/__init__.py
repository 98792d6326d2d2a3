"""Scores over a split, and what evaluate.py computes beyond them.

metrics      each task's metrics over a split (accuracy, mAP and F1, MAE/RMSE/R²)
calibration  a temperature and thresholds fitted on val, their record; ROC-AUC with ties
fit_calibration  calibrate= and threshold=: fitted on val, shown on the split asked
tables       evaluate.py's tables (per class, per label, per target), confusion CSV, image
baselines    scikit-learn's simple models on the same splits (baselines=true)
judge        the weights a run is judged by, scored on val and test, recorded
export       export=model.pt2|model.onnx|model.safetensors, verified before it is written
sampling     a language model's continuation of a prompt: temperature, top-k, a seed, its cache
"""
