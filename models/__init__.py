"""Models. Each builder takes ``input_shape`` (C, H, W) and ``num_classes`` from the dataset,
plus the keys of its YAML file in ``conf/model/`` (checkpoints store the builders' paths).

    auto        the model that fits the data's kind (tabular, MLP, CNN, 1-D CNN, text), the default
    mlp         a multilayer perceptron on flattened inputs
    tabular/    a table's model: robust scaling, number embeddings, k members of one MLP
    cnn         a small convolutional net for images
    cnn1d       a 1-D convolutional net for sequences (channels × length)
    text/       texts' models: a bag of token embeddings, a small Transformer, a local HF encoder
    gpt         a GPT for task=causal_lm: causal attention blocks, tied embeddings, a key-value cache
    resnet      torchvision's ResNets, from scratch
    pretrained  a torchvision model with its weights, and a new head
    timm_models  any timm architecture by name, with its weights from a local file
    init        weight initialisations (default, xavier, kaiming, orthogonal)
    layers      which layer each parameter belongs to (optim.layer_decay)
"""
