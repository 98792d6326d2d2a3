"""Images: datasets of pixels, read into uint8 tensors [N, C, H, W] held in memory, kept in an
image cache, or decoded lazily by DataLoader workers.

    digits                the bundled 8×8 digits (data/assets), the default
    mnist                 MNIST and Fashion-MNIST's IDX files
    cifar10               CIFAR-10's pickled batches
    torchvision_datasets  any torchvision dataset class, downloaded or read from root
    imagefolder           a folder of class folders of images
    image_manifest        images listed in a CSV, with classes, label sets or values
    image_cache           decoded images kept as one uint8 tensor on disk, checked before reuse
    pixels                an image's bytes as uint8 pixels: one decoder for files and shards
    inputs                Pixels: what images answer (batches, the record, predict.py, exports)
"""
