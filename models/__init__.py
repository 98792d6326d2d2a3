"""Models. Each builder takes ``input_shape`` (C, H, W) and ``num_classes`` from the dataset,
plus the keys of its YAML file in ``conf/model/``."""
