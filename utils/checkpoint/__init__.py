"""What a checkpoint holds, read and written in one place; another run's files as data.

format   the keys a checkpoint holds, written once; the check of a file to resume
load     safe loading (weights_only), which file in a folder a command means
record   InputRecord: how inputs reach the model; new inputs read alike (predict.py)
stored   what another run stored, read as untrusted data; the average of top-k copies
rebuild  a model rebuilt from a checkpoint alone (evaluate.py, predict.py, the teacher)
sharded  sharded checkpoints (FSDP): written whole or not at all, read in one line or refused
sharded_index  is a sharded checkpoint's index (a pickle) one to read: checked whole, as data
"""
