"""Datasets: one module per source, each a builder that reads it into a
:class:`data.batching.dataset.Data` and takes the keys of its YAML file in ``conf/data/``
(checkpoints store these builders' paths, so they stay where they are).

    digits                the bundled 8×8 digits (data/assets), the default
    mnist                 MNIST and Fashion-MNIST's IDX files
    cifar10               CIFAR-10's pickled batches
    torchvision_datasets  any torchvision dataset class, downloaded or read from root
    imagefolder           a folder of class folders of images
    image_manifest        images listed in a CSV, with classes, label sets or values
    tabular               a CSV or TSV table with a target column
    tensors               arrays in .pt, .npy or .npz files
    parquet               Parquet shards, local or on object storage, read in our order
    synthetic             random tensors of a given shape (benchmarks, smoke tests)
    augmentation/         what a training batch's samples become: crops, policies, MixUp
    batching/             what every builder returns, and how it becomes batches
    readers/              files read into tensors, shared by builders: tables, gaps, the image cache
    text/                 texts and their tokenizer (data=text)
"""
