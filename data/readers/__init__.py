"""Files read into tensors, shared by the builders that read them.

table        a CSV's rows as columns encoded into one float tensor, read alike later
target_columns  a file's target column(s) read by the task's kind, for every reader of rows
missing      gaps in a table: refused, filled, or flagged (data.na_*)
column_kinds  data.categorical=auto: which columns are categories, which identifiers
image_cache  decoded images kept as one uint8 tensor on disk, checked before reuse
pixels       an image's bytes as uint8 pixels: one decoder for files and shards
storage      where shards live: local paths and URLs listed and read, with retries
parquet      Parquet shards read (a row group at a time) into tensors: inputs, targets
shard_columns  which columns of the shards are the input, and what they become
shard_writer  shards written from what torchloom reads (shard.py)
shard_cache  where fetched row groups are kept: a bounded local cache, least recent out
"""
