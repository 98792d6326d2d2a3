"""Models for texts (``data=text``): each takes token ids [N, L] (padded on the right with the
tokenizer's ``pad_id``) and, optionally, their mask [N, L] (1 for a token); without a mask it is
read from the ids.

- :func:`text_bag` (fastText-style, Joulin et al. 2017): the mean of the texts' token
  embeddings and of hashed bigram embeddings, then one hidden layer. Fast, and strong on
  sentence-length sets of a few thousand texts; what ``model=auto`` picks for text.
- :func:`text_transformer` (``model=text_transformer``): a small pre-norm Transformer encoder
  with learned positions, pooled by the mean of its tokens or its first ([CLS]) token.

    python train.py data=text data.path=reviews.csv model=text_transformer model.layers=4

    layers       what the text models share: the token mask, pooling, the builders' shape
    bag          the bag of token and bigram embeddings (model=text_bag)
    transformer  a small Transformer encoder (model=text_transformer)
    encoder      a local Hugging Face encoder, read as untrusted data (model=hf)

The builders' paths (``models.text.text_bag``, ...) are stored in checkpoints: they are
importable from this package as they were from the module it was.
"""

from models.text.bag import TextBag, text_bag
from models.text.encoder import HfEncoder, hf_model, read_architecture
from models.text.transformer import TextTransformer, text_transformer

__all__ = [
    "HfEncoder",
    "TextBag",
    "TextTransformer",
    "hf_model",
    "read_architecture",
    "text_bag",
    "text_transformer",
]
