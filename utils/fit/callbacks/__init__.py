"""Callbacks: your own step logic, named in the config (conf/callbacks/, docs/callbacks.md).

hooks  the entries checked and built, the calls the loop makes into them, their saved state
ready  ready-made ones: a time budget, a stop at a target metric, annealed gradient noise
"""
