"""Each command's checks that need only its config, before any data is read.

train  train.py's: values, added keys, builder groups, optimizer and schedule tried
"""
