"""Looking into a run instead of training it.

debug  the debug modes (conf/debug)
tune   tune=lr and tune=batch_size
"""
