"""How a classifier errs on a test split, as matplotlib `Figure`s built without pyplot: the confusion matrix of a model
of one label per image, and each class's average precision for one of several labels per image. Counts and scores
come in as tensors (vit/cli/visualize.py measures them with torchmetrics)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure
from torch import Tensor

from vit.figures.drawing import DPI

NAMED = 40  # classes up to which every row and column is labelled, and each cell its share written in
INCHES_PER_CLASS = 0.35


def row_shares(counts: Tensor) -> np.ndarray:
    """(K, K) counts, rows the true class and columns the predicted one -> each row divided by its total, the share
    of that class's images given each class; a class without images has a row of NaN (drawn blank), not of zeros."""
    counts = counts.double().numpy()
    totals = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(totals > 0, counts / totals, np.nan)


def _side(classes: int) -> float:
    return float(np.clip(INCHES_PER_CLASS * classes + 2.5, 5.0, 30.0))


def _names(names: Sequence[str] | None, classes: int) -> list[str]:
    return list(names) if names is not None else [str(k) for k in range(classes)]


def confusion_figure(counts: Tensor, names: Sequence[str] | None = None, title: str = "") -> Figure:
    """The (K, K) confusion counts (rows true, columns predicted) normalised per row: the diagonal is each class's
    accuracy (recall), the rest where its images went. Classes named on both axes (by index without `names`)."""
    classes = counts.shape[0]
    labels = _names(names, classes)
    shares = row_shares(counts)
    fig = Figure(figsize=(_side(classes) + 1.2, _side(classes)), dpi=DPI)
    ax = fig.add_subplot()
    image = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.02, label="share of the true class's images")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    if classes <= NAMED:
        ax.set_xticks(range(classes), labels, rotation=90, fontsize=8)
        ax.set_yticks(range(classes), labels, fontsize=8)
        for (row, column), share in np.ndenumerate(shares):
            if share > 0:
                colour = "white" if share > 0.5 else "black"
                ax.text(column, row, f"{share:.2f}", ha="center", va="center", fontsize=8 if classes <= 10 else 6,
                        color=colour)  # fmt: skip
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def average_precision_figure(precision: Tensor, names: Sequence[str] | None = None, title: str = "") -> Figure:
    """Each class's average precision (K,) as a bar, for a model of several labels per image; a class the split
    never shows (NaN) has no bar. The dashed line is their mean over the classes shown (macro mAP)."""
    classes = precision.shape[0]
    labels = _names(names, classes)
    values = precision.double().numpy()
    fig = Figure(figsize=(_side(classes) + 1.2, 5.0), dpi=DPI)
    ax = fig.add_subplot()
    ax.bar(range(classes), np.nan_to_num(values, nan=0.0), color="tab:blue")
    if np.isfinite(values).any():
        ax.axhline(np.nanmean(values), color="grey", linestyle="--", linewidth=1, label="mean (macro mAP)")
        ax.legend(fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("average precision")
    ax.set_xlabel("class")
    if classes <= NAMED:
        ax.set_xticks(range(classes), labels, rotation=90, fontsize=8)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
