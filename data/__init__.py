"""Datasets, by family: a folder per family of inputs, each holding its builders (which take
the keys of their YAML file in ``conf/data/`` and return a
:class:`data.batching.dataset.Data`), its readers, and what its kind of input answers.

    images/       pixels: the digits (the default), MNIST, CIFAR-10, torchvision, folders, manifests
    tables/       a CSV or TSV table with a target column
    text/         texts and their tokenizer (data=text)
    arrays/       arrays in .pt, .npy or .npz files; synthetic images
    shards/       Parquet shards, local or on object storage, read in our order
    corpus/       a language model's corpus: one stream of token ids (data=corpus)
    augmentation/  what a training batch's samples become: crops, policies, MixUp
    batching/      what every builder returns, how it becomes batches, what every kind answers
    kinds         every kind of input, registered once: what a stored inputs record is read as
"""
