"""Training progress, rate-limited by time: a live rich bar on a terminal, plain log lines in CI
and cluster logs (where a redrawing bar would fill the file with control codes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

log = logging.getLogger("torchloom")


class DataWait:
    """Host time the loop spends blocked on the next batch: the number behind "GPU utilisation
    below 50% means the job is data-bound"."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, batches: Iterable) -> Iterator:
        """``batches``, with the time spent asking for each (and for the end) added up."""
        clock = time.perf_counter
        asked = clock()
        for item in batches:
            self.seconds += clock() - asked
            yield item
            asked = clock()
        self.seconds += clock() - asked


class TrainingProgress:
    def __init__(
        self,
        console: Console,
        total_steps: int,
        max_epochs: int,
        refresh_seconds: float = 1.0,
        line_seconds: float = 5.0,
    ) -> None:
        self.total_steps = total_steps
        self.max_epochs = max_epochs
        self.refresh_seconds = refresh_seconds
        self.line_seconds = line_seconds
        self.epoch, self.step = 0, 0
        self.loss, self.samples_per_second = float("nan"), 0.0
        self.last_refresh = -float("inf")
        # When a step's update would redraw the bar (time.monotonic()): the loop asks for no
        # update before (a call each step costs a share of a small model's step).
        self.due = float("inf")
        self.bar = None
        self.data_wait = DataWait()
        if console.is_terminal:
            # Two texts formatted here around one bar: half the cost of a redraw with a rich
            # column per field.
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[status]}"),
                console=console,
                # No refresh thread: on a small machine it competes with training for the
                # cores. The bar redraws from update(), at most every refresh_seconds.
                auto_refresh=False,
            )
            self.task = self.bar.add_task("", total=total_steps, status="")

    def __enter__(self) -> TrainingProgress:
        self.started, self.first_step = time.monotonic(), None
        if self.bar is not None:
            self.bar.start()
            self.due = -float("inf")
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.redraw()  # where the run ended, not where the last timed redraw left it
            self.bar.stop()

    def update(
        self,
        epoch: int,
        step: int,
        loss: float | None = None,
        samples_per_second: float | None = None,
    ) -> None:
        """Called on logging steps with the loss and speed, at the end of an epoch, and on other
        steps once :attr:`due`. Redraws the bar at most every ``refresh_seconds`` (a redraw
        costs 0.5–1.5 ms, as much as a small model's step) and writes a plain line at most
        every ``line_seconds``."""
        self.epoch, self.step = epoch, step
        if loss is not None:
            self.loss = loss
        if samples_per_second is not None:
            self.samples_per_second = samples_per_second
        now = time.monotonic()
        if self.bar is not None and now - self.last_refresh >= self.refresh_seconds:
            self.last_refresh = now
            self.due = now + self.refresh_seconds
            self.redraw()
        elif self.bar is None and loss is not None and now - self.last_refresh >= self.line_seconds:
            self.last_refresh = now
            log.info(
                "epoch %d/%d  step %d/%d  loss %.4f  %s samples/s",
                epoch + 1,
                self.max_epochs,
                step,
                self.total_steps,
                loss,
                f"{self.samples_per_second:,.0f}",
            )

    def redraw(self) -> None:
        if self.first_step is None:  # a resumed run starts counting where it resumed
            self.first_step = self.step - 1
        elapsed = time.monotonic() - self.started
        done = self.step - self.first_step
        remaining = elapsed / done * (self.total_steps - self.step) if done > 0 else None
        status = (
            f"{self.step}/{self.total_steps}  loss {self.loss:.4f}  "
            f"{self.samples_per_second:,.0f} samples/s  {clock(elapsed)} < {clock(remaining)}"
        )
        description = f"epoch {self.epoch + 1}/{self.max_epochs}"
        self.bar.update(self.task, completed=self.step, description=description, status=status)
        self.bar.refresh()


def clock(seconds: float | None) -> str:
    """``H:MM:SS``, or ``-:--:--`` when not known yet."""
    if seconds is None:
        return "-:--:--"
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"


def data_wait_advice(fraction: float, data) -> str:
    """What to change when the loop spent ``fraction`` of its time waiting for batches."""
    share = f"{fraction:.0%} of training time went to waiting for batches"
    if data.on_disk:
        return (
            f"{share}: batches are read from the image cache on disk; hold it in memory with "
            "data.cache=memory (or a larger data.cache_max_gb), or keep images small "
            "(data.image_size)"
        )
    if data.from_shards:
        return (
            f"{share}: batches are read from shards a row group at a time; raise "
            f"data.num_workers (now {data.num_workers}: readers ahead of the step), keep row "
            "groups fetched from an object store on local disk (data.shard_cache_gb), or write "
            "images as uint8 pixels (shard.py images=pixels), which need no decoding"
        )
    if not data.in_memory:
        return (
            f"{share}: raise data.num_workers (now {data.num_workers}), keep images small "
            "(data.image_size), or cache the decoded images (data.cache=auto), which "
            "torchloom then holds as whole tensors on the device"
        )
    if getattr(data, "crop_padding", 0) or getattr(data, "horizontal_flip", False):
        return (
            f"{share}: batches come from memory, so the time goes to augmentation; lower "
            "data.augment.crop_padding or turn off data.augment.horizontal_flip, or train on a "
            "GPU, where the whole dataset and its augmentation live on the device"
        )
    return (
        f"{share}: batches come from memory with no augmentation, so the time goes to "
        "slicing and copying them; raise data.batch_size (fewer, larger copies), or train on "
        "a GPU, where the whole dataset lives on the device"
    )
