"""Importing this module is the attack: it leaves a file where the command runs."""

from pathlib import Path

Path("callback_was_imported").write_text("a stored config's callback was built")


class Boom:
    def __init__(self, *args, **kwargs):
        Path("callback_was_built").write_text("built")

    def on_fit_start(self, run):
        pass
