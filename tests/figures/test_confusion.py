"""The confusion matrix and per-class AP figures (vit/figures/confusion.py): what they draw against numbers made by
hand."""

import math

import numpy as np
import torch

from vit.figures.confusion import average_precision_figure, confusion_figure, row_shares

# rows the true class, columns the predicted: 'cat' 3 right of 4, 'dog' 2 of 4, 'fox' in no test image
COUNTS = torch.tensor([[3, 1, 0], [0, 2, 2], [0, 0, 0]])
SHARES = [[0.75, 0.25, 0.0], [0.0, 0.5, 0.5], [math.nan] * 3]


def test_the_confusion_figure_draws_each_row_as_shares_of_its_class_and_names_the_classes():
    figure = confusion_figure(COUNTS, ["cat", "dog", "fox"], "a title")
    ax = figure.axes[0]
    drawn = np.ma.filled(ax.images[0].get_array().astype(float), np.nan)
    np.testing.assert_allclose(drawn, SHARES)  # a class without images: blank, not a row of zeros
    np.testing.assert_allclose(row_shares(COUNTS), SHARES)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["cat", "dog", "fox"]  # true classes down the side
    assert [t.get_text() for t in ax.get_xticklabels()] == ["cat", "dog", "fox"]  # predicted ones along the bottom
    assert (ax.get_ylabel(), ax.get_xlabel(), ax.get_title()) == ("true class", "predicted class", "a title")
    written = sorted(t.get_text() for t in ax.texts)
    assert written == ["0.25", "0.50", "0.50", "0.75"]  # each share above 0 written in its cell


def test_unnamed_classes_are_their_indices_and_many_classes_go_unlabelled():
    ax = confusion_figure(COUNTS).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    many = confusion_figure(torch.eye(100, dtype=torch.int64)).axes[0]
    assert many.images[0].get_array().shape == (100, 100) and not many.texts


def test_the_average_precision_figure_draws_a_bar_per_class_and_their_mean():
    precision = torch.tensor([0.9, 0.5, math.nan, 0.1])  # the third class never shows in the split
    ax = average_precision_figure(precision, ["a", "b", "c", "d"]).axes[0]
    np.testing.assert_allclose([bar.get_height() for bar in ax.patches], [0.9, 0.5, 0.0, 0.1], rtol=1e-6)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.5, 0.5], rtol=1e-6)  # (0.9 + 0.5 + 0.1) / 3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
