"""A table's model built from the tabular deep-learning evidence of 2022-2025 (``model=tabular``;
``model=auto`` picks it for a table's rows):

- **numbers robustly scaled and smoothly clipped** (RealMLP; Holzmüller et al., "Better by
  default", NeurIPS 2024): each feature centred on its training median and divided by its
  interquartile range / 1.349 (a standard deviation, for a normal), then
  ``x / sqrt(1 + (x / 3)²)``, so that an outlier cannot dominate a layer; or
  (``robust_scaling=false``) as the data standardised them. ``auto`` (and ``embedding=auto``):
  under 1,000 training rows, where the two overfit, the standardised inputs clamped to the
  training range and no embedding; from there, robust and periodic (:func:`fitted_inputs`);
- **an embedding of each number** (Gorishniy et al., "On embeddings for numerical features",
  NeurIPS 2022): ``piecewise`` (the piecewise-linear encoding over ``bins`` bins between the
  training quantiles, then a linear layer and ReLU per feature), ``periodic`` (cos and sin
  of learned frequencies, then a shared linear layer and ReLU: "PLR lite"; the frequencies
  start from N(0, 0.01) under 8,000 training rows and from N(0, 3) from there), ``linear``
  (a linear layer and ReLU per feature) or ``none``; a table's 0/1 columns (its categories
  one-hot, its gap flags: the ``indicator_features`` after the numbers) are embedded too, or
  enter the MLP as they are, as the papers feed a category (``embed_indicators``: true,
  false, or auto: as they are once there are more than 64, where embedding them would make
  the input several times as wide and the run as much slower);
- **k members sharing one MLP** (TabM-mini; Gorishniy et al., ICLR 2025): each member scales
  the MLP's input by its own vector (random signs at the start) and has its own output layer;
  the k run as one batched forward. In training the model returns the members' outputs
  ``[N, k, outputs]`` and each member's loss counts (utils/tasks); in evaluation, their mean.
  The members share each training batch ``[N, F]`` (``share_batches: true``), or each trains
  on batches of its own (``false``, TabM's ``share_training_batches=False``): the data draws
  one order per member (data/batching/order.py) and a training batch holds ``[N, k, F]``
  rows, member m's in column m. Not the default: each member's rows are embedded apart (8
  members train 9.6 times slower than one on the benchmark's table of 64 numbers, 3.5 times
  when they share), for figures within a seed's move on most tables (docs/real-data.md).

Its preprocessing is fitted on the training split: the data supplies each feature's training
quantiles (``feature_quantiles``, in the model's input units), from which the median, the
interquartile range and the bins' edges are buffers of the model — a checkpoint and every
export carry them. Without them (a model rebuilt from a checkpoint) the buffers are
placeholders that the stored weights then fill.

    python train.py data=csv data.path=houses.csv data.target=price task=regression \\
        model=tabular model.embedding=periodic model.ensemble=8

    builder   the builder: its keys, what auto chooses for the table's size, the model assembled
    numbers   robust scaling and smooth clipping, and the numbers' embeddings
    ensemble  k members sharing one MLP

The builder's path (``models.tabular.tabular``) is stored in checkpoints: it is importable from
this package as it was from the module it was.
"""

from models.tabular.builder import (
    EMBED_INDICATORS_BEFORE,
    LARGE_TABLE_ROWS,
    SHARE_BATCHES_BEFORE,
    SMALL_TABLE_ROWS,
    TABLE_DEFAULTS,
    fitted_frequency_scale,
    fitted_inputs,
    plain_indicators,
    tabular,
)
from models.tabular.numbers import PiecewiseEmbedding, RobustScaling, fitted_grid, smooth_clip

__all__ = [
    "EMBED_INDICATORS_BEFORE",
    "LARGE_TABLE_ROWS",
    "SHARE_BATCHES_BEFORE",
    "SMALL_TABLE_ROWS",
    "TABLE_DEFAULTS",
    "PiecewiseEmbedding",
    "RobustScaling",
    "fitted_frequency_scale",
    "fitted_grid",
    "fitted_inputs",
    "plain_indicators",
    "smooth_clip",
    "tabular",
]
