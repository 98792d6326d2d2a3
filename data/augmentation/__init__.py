"""What a training batch's samples become before the model sees them, per sample and batched
on the device, each draw a pure function of (seed, epoch, the sample's index).

images    ImageNet-style augmentation: the draws, resized crops, colours, erasing
policies  RandAugment (timm's policy strings) and TrivialAugment, per sample
mixing    MixUp and CutMix, for every dataset
"""
