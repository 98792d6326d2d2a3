"""Every picture torchloom draws, with matplotlib's headless Agg backend: each function takes
plain numbers and returns the PNG's bytes, so a report (utils/report/), evaluate.py's
reliability diagram and the LR range test embed or write them alike. Nothing here reads a file
or knows a run. matplotlib is imported on the first picture, not with the module: a command
that draws nothing starts as fast as before."""

from __future__ import annotations

import io
import math
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DPI = 80  # a 6.4×4-inch figure is 512×320 pixels: sharp in a browser, ~30 KB a picture
MOST_CLASSES = 30  # a confusion matrix past this many classes shows the most confused ones


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend: no display (a server, a CI job, a notebook's
    kernel alike)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def warm_up(argv: Sequence[str]) -> None:
    """Import pyplot and lay out one text (its font cache read) in a thread of its own, so a
    run that ends with a report has them ready: the import overlaps the run's start. Not
    for a command line that turns the report off (``report=false``)."""
    if "report=false" in argv[1:]:
        return

    def ready() -> None:
        figure = pyplot().figure(figsize=(1, 1))
        figure.text(0.5, 0.5, "0.9")
        png(figure)

    threading.Thread(target=ready, name="torchloom-plots", daemon=False).start()


def png(figure: Any, tight: bool = False) -> bytes:
    """The figure as PNG bytes, then closed (pyplot keeps every open figure alive). ``tight``:
    cropped to what is drawn (labels of any length: a second drawing pass); else the margins
    the figure was laid out with."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight" if tight else None)
    pyplot().close(figure)
    return buffer.getvalue()


def as_image(picture: bytes) -> Any:
    """A PNG's pixels as a [3, H, W] float tensor in [0, 1] (TensorBoard's images)."""
    import torch
    from torchvision.io import ImageReadMode, decode_png

    pixels = decode_png(torch.frombuffer(bytearray(picture), dtype=torch.uint8), ImageReadMode.RGB)
    return pixels.float() / 255


def _axes(width: float = 6.4, height: float = 4.0, columns: int = 1):
    figure, axes = pyplot().subplots(1, columns, figsize=(width, height), squeeze=False)
    figure.subplots_adjust(left=0.13, right=0.97, bottom=0.14, top=0.9, wspace=0.3)
    return figure, list(axes[0])


def curves(
    panels: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
    best_step: int | None = None,
    x_label: str = "optimizer step",
) -> bytes:
    """One panel a quantity (``panels``: title → {series label: [(step, value)]}), side by side
    two a row, the best checkpoint's step marked by a dotted line in each."""
    titles = list(panels)
    rows = math.ceil(len(titles) / 2)
    figure, grid = pyplot().subplots(rows, 2, figsize=(10, 3.2 * rows), squeeze=False)
    for axis, title in zip(grid.flat, titles, strict=False):
        for label, points in panels[title].items():
            steps, values = zip(*points, strict=True) if points else ((), ())
            axis.plot(steps, values, marker="o" if len(points) < 30 else None, ms=3, label=label)
        if best_step is not None:
            axis.axvline(best_step, color="grey", linestyle=":", label="best checkpoint")
        axis.set_title(title)
        axis.set_xlabel(x_label)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in list(grid.flat)[len(titles) :]:
        axis.set_visible(False)
    inches = 3.2 * rows  # 0.55 inch below each row's axes for its label, 0.35 above for a title
    figure.subplots_adjust(left=0.08, right=0.98, bottom=0.55 / inches, top=1 - 0.35 / inches)
    figure.subplots_adjust(wspace=0.22, hspace=0.45)
    return png(figure)


def confusion(matrix: np.ndarray, names: Sequence[str]) -> bytes:
    """A confusion matrix (rows: true class, columns: predicted) twice, side by side: its
    counts, and each true class's shares; past :data:`MOST_CLASSES` classes the caller passes
    the most confused ones (and says so)."""
    side = max(4.0, min(10.0, 0.3 * len(names) + 2))
    figure, axes = _axes(2 * side + 1.5, side, columns=2)
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    for axis, shown, normalised in ((axes[0], matrix, False), (axes[1], shares, True)):
        image = axis.imshow(shown, cmap="Blues", vmin=0, vmax=1 if normalised else None)
        figure.colorbar(image, ax=axis, fraction=0.046)
        ticks = range(len(names))
        axis.set_xticks(ticks, names, rotation=90, fontsize=8)
        axis.set_yticks(ticks, names, fontsize=8)
        axis.set(xlabel="predicted", ylabel="true")
        axis.set_title("each true class's shares" if normalised else "counts")
        if len(names) <= 12:  # the numbers themselves, where they fit
            _numbers(axis, shown, normalised)
    return png(figure, tight=True)


def _numbers(axis: Any, shown: np.ndarray, normalised: bool) -> None:
    high = 0.5 if normalised else shown.max() / 2
    for (row, column), value in np.ndenumerate(shown):
        text = f"{value:.2f}" if normalised else str(int(value))
        colour = "white" if value > high else "black"
        axis.text(column, row, text, ha="center", va="center", fontsize=7, color=colour)


def most_confused(matrix: np.ndarray, most: int = MOST_CLASSES) -> np.ndarray:
    """The indices of at most ``most`` classes, those in the largest off-diagonal cells first."""
    off = matrix.astype(float).copy()
    np.fill_diagonal(off, 0)
    order = np.argsort(-off, axis=None, kind="stable")
    chosen: list[int] = []
    for cell in order:
        for index in np.unravel_index(cell, off.shape):
            if int(index) not in chosen and len(chosen) < most:
                chosen.append(int(index))
        if len(chosen) >= most or off.flat[cell] == 0:
            break
    return np.array(sorted(chosen), dtype=np.int64)


def per_class(scores: Mapping[str, Sequence[float]], names: Sequence[str]) -> bytes:
    """Each class's precision and recall as paired bars."""
    count = len(names)
    figure, (axis,) = _axes(max(6.4, 0.3 * count + 2), 3.6)
    at = np.arange(count)
    axis.bar(at - 0.2, scores["precision"], 0.4, label="precision")
    axis.bar(at + 0.2, scores["recall"], 0.4, label="recall")
    axis.set_xticks(at, names, rotation=90 if count > 10 else 0, fontsize=8)
    axis.set_ylim(0, 1.05)
    axis.set_title("per class")
    axis.legend(fontsize=8)
    return png(figure, tight=True)


def reliability(rows: Sequence[Mapping[str, float]]) -> bytes:
    """A reliability diagram: each confidence bin's accuracy as a bar over its range, its mean
    confidence as a red mark, the diagonal (perfect calibration) dashed; empty bins none."""
    figure, (axis,) = _axes(4.6, 4.2)
    filled = [row for row in rows if row["count"]]
    axis.bar(
        [r["lo"] for r in filled],
        [r["accuracy"] for r in filled],
        width=[r["hi"] - r["lo"] for r in filled],
        align="edge",
        edgecolor="white",
        label="accuracy",
    )
    axis.scatter(
        [(r["lo"] + r["hi"]) / 2 for r in filled],
        [r["confidence"] for r in filled],
        color="tab:red",
        marker="_",
        s=200,
        label="mean confidence",
    )
    axis.plot([0, 1], [0, 1], linestyle="--", color="grey", label="calibrated")
    axis.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", title="reliability")
    axis.legend(fontsize=8, loc="upper left")
    return png(figure)


def ranking(scores: np.ndarray, truth: np.ndarray, names: Sequence[str]) -> bytes:
    """ROC and precision-recall curves of each column of ``scores`` against ``truth`` (0/1),
    beside each other: a binary classifier's positive class, or each label of a multilabel
    task (at most 10 shown)."""
    figure, (roc, pr) = _axes(10, 4.2, columns=2)
    for column, name in list(enumerate(names))[:10]:
        fpr, tpr, precision, recall = _ranked(scores[:, column], truth[:, column])
        roc.plot(fpr, tpr, label=name)
        pr.plot(recall, precision, label=name)
    roc.plot([0, 1], [0, 1], linestyle="--", color="grey")
    roc.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC")
    pr.set(xlabel="recall", ylabel="precision", title="precision-recall", ylim=(0, 1.05))
    for axis in (roc, pr):
        axis.legend(fontsize=8)
        axis.grid(alpha=0.3)
    return png(figure)


def _ranked(score: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, ...]:
    """(false positive rate, true positive rate, precision, recall) at every threshold."""
    order = np.argsort(-score, kind="stable")
    hits = truth[order].astype(float)
    true_positives, false_positives = np.cumsum(hits), np.cumsum(1 - hits)
    positives, negatives = max(hits.sum(), 1.0), max(len(hits) - hits.sum(), 1.0)
    fpr = np.concatenate([[0.0], false_positives / negatives])
    tpr = np.concatenate([[0.0], true_positives / positives])
    precision = true_positives / np.arange(1, len(hits) + 1)
    return fpr, tpr, precision, true_positives / positives


def regression(predicted: np.ndarray, actual: np.ndarray, name: str) -> bytes:
    """Predicted against actual (the diagonal: exact), and the residuals against the
    prediction, for one target in its own units."""
    figure, (against, residuals) = _axes(10, 4.2, columns=2)
    against.scatter(actual, predicted, s=6, alpha=0.5)
    finite = np.isfinite(actual) & np.isfinite(predicted)
    low = float(min(actual[finite].min(), predicted[finite].min())) if finite.any() else 0.0
    high = float(max(actual[finite].max(), predicted[finite].max())) if finite.any() else 1.0
    against.plot([low, high], [low, high], linestyle="--", color="grey")
    against.set(xlabel=f"actual {name}", ylabel=f"predicted {name}", title="predicted vs actual")
    residuals.scatter(predicted, predicted - actual, s=6, alpha=0.5)
    residuals.axhline(0, linestyle="--", color="grey")
    residuals.set(
        xlabel=f"predicted {name}", ylabel="residual (predicted - actual)", title="residuals"
    )
    return png(figure)


def samples(pictures: np.ndarray, captions: Sequence[str], columns: int = 8) -> bytes:
    """Images [N, H, W, 3] in [0, 1] tiled in one grid (one axes: one drawing), each with its
    caption above it."""
    count, height, width = pictures.shape[:3]
    rows = math.ceil(count / columns)
    gap_x, gap_y = max(2, width // 8), max(height // 2, 8)  # room for two lines of caption
    grid = np.ones((rows * (height + gap_y) + 2, columns * (width + gap_x), 3))
    for index, picture in enumerate(pictures):
        top = (index // columns) * (height + gap_y) + gap_y
        left = (index % columns) * (width + gap_x)
        grid[top : top + height, left : left + width] = picture
    figure, (axis,) = _axes(1.5 * columns, 1.5 * columns * grid.shape[0] / grid.shape[1])
    figure.subplots_adjust(left=0, right=1, bottom=0, top=1)
    axis.imshow(grid, interpolation="nearest")
    axis.axis("off")
    for index, caption in enumerate(captions[:count]):
        x = (index % columns) * (width + gap_x) + width / 2
        y = (index // columns) * (height + gap_y) + gap_y - 1
        axis.text(x, y, caption, ha="center", va="bottom", fontsize=7)
    return png(figure)


def lr_range(rates: Sequence[float], losses: Sequence[float], suggested: float | None) -> bytes:
    """The LR range test: the smoothed loss against the learning rate (log scale), the
    suggestion marked."""
    figure, (axis,) = _axes()
    axis.plot(rates, losses)
    if suggested is not None:
        axis.axvline(suggested, color="tab:red", linestyle=":", label=f"suggested {suggested:.2e}")
        axis.legend(fontsize=8)
    low = min(losses, default=0.0)
    top = min(max(losses, default=1.0), 4 * low + 1e-9)  # a diverging tail does not flatten it
    axis.set(
        xscale="log",
        xlabel="learning rate",
        ylabel="loss (smoothed)",
        title="learning-rate range test",
        ylim=(low - 0.05 * abs(low), top),
    )
    axis.grid(alpha=0.3)
    return png(figure)


def bars(values: Mapping[str, float], title: str, x_label: str) -> bytes:
    """Horizontal bars, largest on top (a search's parameter importances)."""
    ordered = sorted(values.items(), key=lambda item: item[1])
    figure, (axis,) = _axes(6.4, max(2.0, 0.4 * len(ordered) + 1))
    axis.barh([name for name, _ in ordered], [value for _, value in ordered])
    axis.set(title=title, xlabel=x_label)
    return png(figure, tight=True)


def trials(points: Sequence[Mapping], direction: str, objective: str) -> bytes:
    """A search's trials in the order they finished: each one's objective (pruned ones at
    their last reported value, as crosses), and the best so far as a line."""
    figure, (axis,) = _axes()
    best, line = None, []
    for point in points:
        value = point["value"]
        if point["state"] == "COMPLETE" and value is not None:
            better = best is None or (value > best if direction == "maximize" else value < best)
            best = value if better else best
        line.append(best)
    done = [p for p in points if p["state"] == "COMPLETE"]
    pruned = [p for p in points if p["state"] == "PRUNED" and p["value"] is not None]
    axis.scatter([p["number"] for p in done], [p["value"] for p in done], label="finished")
    axis.scatter(
        [p["number"] for p in pruned],
        [p["value"] for p in pruned],
        marker="x",
        color="tab:red",
        label="pruned (last reported)",
    )
    axis.step([p["number"] for p in points], line, where="post", color="black", label="best so far")
    axis.xaxis.set_major_locator(pyplot().MaxNLocator(integer=True))
    axis.set(xlabel="trial", ylabel=objective, title=f"trials ({direction})")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    return png(figure)


def pareto(
    points: Sequence[Mapping], objectives: Sequence[str], directions: Sequence[str]
) -> bytes:
    """A search of several objectives: each finished trial at its first two objectives, the
    Pareto front (``pareto``) marked and joined in order of the first."""
    figure, (axis,) = _axes()
    done = [p for p in points if p["state"] == "COMPLETE" and len(p["values"]) >= 2]
    front = sorted((p for p in done if p["pareto"]), key=lambda p: p["values"][0])
    axis.scatter([p["values"][0] for p in done], [p["values"][1] for p in done], label="finished")
    axis.plot(
        [p["values"][0] for p in front],
        [p["values"][1] for p in front],
        marker="o",
        color="tab:red",
        label="Pareto front",
    )
    for point in front:
        axis.annotate(str(point["number"]), point["values"][:2], fontsize=7)
    axis.set(
        xlabel=f"{objectives[0]} ({directions[0]})",
        ylabel=f"{objectives[1]} ({directions[1]})",
        title="trials against two objectives",
    )
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    return png(figure)


def parallel(points: Sequence[Mapping], names: Sequence[str], objective: str) -> bytes:
    """Parallel coordinates: one line a trial through each parameter (scaled to its range; a
    log-spaced one on a log scale, a category by its index) to its objective, coloured by it;
    pruned trials dashed."""
    columns = [*names, objective]
    table = np.array([[_coordinate(p, c, objective) for c in columns] for p in points], float)
    low, high = np.nanmin(table, axis=0), np.nanmax(table, axis=0)
    scaled = (table - low) / np.where(high > low, high - low, 1.0)
    figure, (axis,) = _axes(max(6.4, 1.6 * len(columns)), 4.0)
    colours = pyplot().get_cmap("viridis")
    for row, point in zip(scaled, points, strict=True):
        colour = colours(row[-1]) if np.isfinite(row[-1]) else "lightgrey"
        style = "--" if point["state"] == "PRUNED" else "-"
        axis.plot(range(len(columns)), row, color=colour, linestyle=style, alpha=0.8)
    axis.set_xticks(range(len(columns)), columns, rotation=20, fontsize=8)
    axis.set_yticks([0, 1], ["low", "high"])
    axis.set_title("parameters of each trial (dashed: pruned)")
    return png(figure, tight=True)


def _coordinate(point: Mapping, column: str, objective: str) -> float:
    value = point["value"] if column == objective else point["params"].get(column)
    if value is None:
        return math.nan
    if isinstance(value, str | bool):
        return float(point["choices"][column].index(value))
    return math.log10(value) if point["log"].get(column) and value > 0 else float(value)
