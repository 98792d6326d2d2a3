"""Each command's checks that need only its config, before any data is read.

train     train.py's: values, added keys, builder groups, optimizer and schedule tried
evaluate  evaluate.py's: the checkpoints ckpt= names; split, export, average, calibrate, logger
predict   predict.py's: the keys it needs, the checkpoint, an out= that is no input
"""
