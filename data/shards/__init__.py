"""Shards: Parquet files, on local disk or object storage, read a row group at a time in an
order torchloom owns (data=parquet), and written by shard.py. The whole shard story, from
where the bytes live to the batches they become.

    parquet    the builder (data=parquet): each split's shards found, checked, described
    storage    where shards live: local paths and URLs listed and read, with retries
    row_groups  Parquet shards read (a row group at a time) into tensors: inputs, targets
    columns    which columns of the shards are the input, and what they become
    cache      where fetched row groups are kept: a bounded local cache, least recent out
    batches    batches gathered from shards' row groups, read ahead in our order
    writer     shards written from what torchloom reads (shard.py)
"""
