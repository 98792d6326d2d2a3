"""Datasets. Each loader reads one dataset into a :class:`data.batches.Data` and takes the keys
of its YAML file in ``conf/data/``."""
