"""What every dataset builder returns, and how it becomes batches on the training device.

dataset   Data: the splits, their targets and inputs record, how they are batched
splits    the tensors of a split; holdouts, shards, channel statistics
batches   in-memory batches by slicing; normalisation and augmentation as tensor ops
loader    batches decoded by DataLoader workers, for data that does not fit in memory
targets   the kinds of target (classes, label sets, values) and their checks
folds     which samples are train, val and test; K folds and groups
fingerprint  what the data is by content: each sample's hash, each split's membership
order     which sample comes next: the permutation, and the block shuffle of shards
inputs    what every kind of input answers (pixels, rows, tokens, values): one owner each
"""
