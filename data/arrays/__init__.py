"""Arrays: inputs already in tensors, or made up for benchmarks and smoke tests.

tensors    arrays in .pt, .npy or .npz files (data=tensors)
synthetic  random images of a given shape (data=synthetic)
inputs     Values: what other arrays answer (sequences, float images)
"""
