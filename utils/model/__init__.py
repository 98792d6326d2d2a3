"""The model as built, stepped and evaluated, and its optimizer.

modules  the model as built, as the step calls it (DDP, compile), as evaluation calls it
checks   the dummy forward; parameter counts
weights  the unwrapped module; loading weights that must fit exactly
optim    the optimizer's parameter groups (no decay on biases and norms, each layer's LR)
guards   start-up checks against classic pitfalls; step counts
"""
