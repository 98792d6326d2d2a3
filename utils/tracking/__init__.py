"""Where the history goes (conf/logger), never ahead of last.pt.

tracker  Tracker: held points, the tracked run a resume continues, finished/failed/killed
local    the history in the run dir: TensorBoard events and hparams, metrics.csv
mlflow   logger=mlflow: a run in an MLflow store (sqlite under runs/ by default)
wandb    logger=wandb: a W&B run, offline unless an API key is set up
process  a tracker in a process of its own beside the training; its log and stops
"""
