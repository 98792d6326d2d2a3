"""Callbacks the tests name with ``+callbacks.<name>._target_=probe_callbacks.<Class>``: plain
classes, as a user writes them (docs/callbacks.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


class Counter:
    """Counts every event it sees, and keeps each logged step: state that must resume exactly."""

    def __init__(self, tag: str = "") -> None:
        self.tag, self.counts, self.logged = tag, {}, []

    def _count(self, event: str) -> None:
        self.counts[event] = self.counts.get(event, 0) + 1

    def on_epoch_start(self, epoch):
        self._count(f"epoch_start:{epoch}")

    def on_log(self, step, metrics):
        self._count("log")
        self.logged.append([step, sorted(metrics)])

    def on_validation_end(self, epoch, metrics):
        self._count("validation_end")

    def on_checkpoint(self, path, kind):
        self._count(f"checkpoint:{kind}")

    def state_dict(self):
        return {"tag": self.tag, "counts": self.counts, "logged": self.logged}

    def load_state_dict(self, state):
        self.counts, self.logged = dict(state["counts"]), [list(e) for e in state["logged"]]


class StopAt:
    """Asks the run to stop after validating ``epoch``."""

    def __init__(self, epoch: int, reason: str = "seen enough") -> None:
        self.epoch, self.reason = epoch, reason

    def on_validation_end(self, epoch, metrics):
        return f"{self.reason} at epoch {epoch}" if epoch >= self.epoch else None


class StopAtStep:
    """Asks, from on_log, the run to stop at the first logged step at or after ``step``; under
    torchrun it says which rank it runs on (a rank-0 entry runs on rank 0 alone)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_fit_start(self, run):
        print(f"fit start on rank {run.rank} of {run.world_size}", flush=True)

    def on_log(self, step, metrics):
        print(f"logged step {step} on rank {int(os.environ.get('RANK', 0))}", flush=True)
        return f"reached step {step}" if step >= self.step else None


class Raising:
    """Raises after validating ``epoch``; ``on_exception`` writes what it got to ``seen``.
    ``how``: ``raise`` (a RuntimeError), ``exit`` (``sys.exit(0)``, as a script would) or
    ``ansi`` (an error whose message clears the terminal)."""

    def __init__(self, epoch: int = 2, seen: str = "", how: str = "raise") -> None:
        self.epoch, self.seen, self.how = epoch, seen, how

    def on_validation_end(self, epoch, metrics):
        if epoch >= self.epoch:
            if self.how == "exit":
                import sys

                sys.exit(0)
            message = "\x1b[2J\x1b[31mthe probe broke" if self.how == "ansi" else "the probe broke"
            raise RuntimeError(message)

    def on_exception(self, error):
        if self.seen:
            Path(self.seen).write_text(f"{type(error).__name__}: {error}")


class FailsToLoad(Counter):
    def load_state_dict(self, state):
        raise ValueError("the state is from another version")


class Meddler:
    """Read-only hooks that change everything they are handed: none of it may reach the run."""

    def on_fit_start(self, run):
        run.config["optim"]["lr"] = 100.0
        run.dataset_sizes.clear()

    def on_log(self, step, metrics):
        metrics.clear()

    def on_validation_end(self, epoch, metrics):
        for key in metrics:
            metrics[key] = float("nan")

    def on_fit_end(self, status, metrics):
        metrics.clear()


class StepCounter:
    """Mutable: counts the step hooks, keeps the steps they saw, checks what it is handed."""

    def __init__(self) -> None:
        self.seen = {"after_backward": [], "before_step": [], "after_step": []}

    def on_after_backward(self, step):
        assert all(p.grad is not None for p in step.model.parameters() if p.requires_grad)
        self.seen["after_backward"].append(step.global_step)

    def on_before_optimizer_step(self, step):
        self.seen["before_step"].append(step.global_step)

    def on_after_optimizer_step(self, step):
        assert isinstance(step.optimizer, torch.optim.Optimizer)
        self.seen["after_step"].append(step.global_step)

    def on_fit_end(self, status, metrics):
        Path("step_counter.json").write_text(json.dumps(self.seen))

    def state_dict(self):
        return self.seen

    def load_state_dict(self, state):
        self.seen = {key: list(value) for key, value in state.items()}


class NotPlain(Counter):
    def state_dict(self):
        return {"weights": torch.zeros(2)}


class Order:
    """Mutable: writes, at the end, each event in the order it came, with the gradient norm the
    step hooks saw and the EMA's first value, so the tests can pin where the hooks sit."""

    def __init__(self) -> None:
        self.events = []

    def on_epoch_start(self, epoch):
        self.events.append(["epoch_start", epoch])

    def on_validation_end(self, epoch, metrics):
        self.events.append(["validation_end", epoch])

    def on_checkpoint(self, path, kind):
        self.events.append(["checkpoint", kind])

    def _norm(self, step):
        grads = [p.grad for p in step.model.parameters() if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads))

    def on_after_backward(self, step):
        self.events.append(["after_backward", step.global_step, self._norm(step)])

    def on_before_optimizer_step(self, step):
        self.events.append(["before_step", step.global_step, self._norm(step)])

    def on_after_optimizer_step(self, step):
        self.events.append(["after_step", step.global_step, step.optimizer.param_groups[0]["lr"]])

    def on_fit_end(self, status, metrics):
        self.events.append(["fit_end", status])
        Path("order.json").write_text(json.dumps(self.events))


CALLS: list = []  # the order Recorder instances were called in (a unit test reads it)


class Recorder:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def on_epoch_start(self, epoch):
        CALLS.append(self.tag)


class Notifier:
    """Holds credentials, as a chat or webhook callback does; keeps no state. It checks that it
    was built from the real values (the record of the run holds them redacted)."""

    def __init__(self, channel: str, api_token: str, **more: str) -> None:
        expected = os.environ.get("EXPECTED_TOKENS", "").split(",")
        assert channel in expected and api_token in expected, (channel, api_token)
        assert all(value in expected for value in more.values()), more  # a webhook URL, ...
        self.channel, self.api_token = channel, api_token

    def on_fit_end(self, state, metrics):
        pass
