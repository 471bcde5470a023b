"""Classify images with a trained model:
`python -m vit.cli.predict --checkpoint CKPT [--preset NAME] [--runtime torch|onnx] [--top-k 5] IMAGES...`.

Each image is converted the way training saw its data (channels, size, normalisation; any PIL mode:
grayscale, RGBA, palette, 16-bit) and scored as evaluation scored it (the run's test-time views, if any); one line
per image lists the top-k classes with probabilities (a softmax), or, for a model of several labels per image
(task=multilabel), every class whose probability (its own sigmoid) reaches the class's threshold, most probable first.
With --runtime onnx, ONNX Runtime computes the logits: --checkpoint may then be a .onnx export (vit/cli/runtime.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch
from PIL import Image
from torch import Tensor

from vit.cli.checkpoint_args import add_checkpoint_arguments
from vit.cli.runtime import add_runtime_argument, load_model
from vit.interop.load import Loaded


def require_classifier(loaded: Loaded) -> None:
    if not loaded.config.num_classes:
        raise ValueError(
            f"{loaded.path}: the model has no classification head (num_classes=0): it outputs features, "
            "not class scores, so there is nothing to predict"
        )


# what Pillow raises for a file it cannot or will not decode: OSError (missing, unknown format, truncated),
# SyntaxError and ValueError (malformed chunks), DecompressionBombError (more pixels than Image.MAX_IMAGE_PIXELS)
_UNREADABLE = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def read_image(path: Path | BinaryIO, name: str | None = None) -> Image.Image:
    """The decoded image at `path` (or in a binary file object, called `name`); a ValueError naming it when Pillow
    cannot or will not decode it."""
    try:
        with Image.open(path) as image:
            return image.copy()  # decoded here, so that a bad file fails here and not later in preprocessing
    except _UNREADABLE as err:
        reason = str(err).replace(f" {path!r}", "")  # Pillow names a file object by its repr
        raise ValueError(f"{name or path}: not a readable image: {reason}") from None


@torch.no_grad()
def predict(
    loaded: Loaded, image: Image.Image, top_k: int = 5, logits: Callable[[Tensor], Tensor] | None = None
) -> list[tuple[str, float]]:
    """The top-k (class name, probability) pairs for one image, most probable first; for a multi-label model, the
    classes at or above their thresholds (top_k aside). `logits` scores the image where not loaded.logits (another
    runtime's: vit/cli/runtime.py)."""
    require_classifier(loaded)
    score = logits or loaded.logits
    return ranked(loaded, score(loaded.preprocess(image))[0], top_k)  # as evaluation scored it


def ranked(loaded: Loaded, logits: Tensor, top_k: int = 5) -> list[tuple[str, float]]:
    """One image's logits (K,) as predict answers them: (class name, probability) pairs, most probable first."""
    names = loaded.classes or tuple(f"class {k}" for k in range(len(logits)))
    if loaded.multilabel:
        probabilities = logits.sigmoid()
        indices = (probabilities >= torch.tensor(loaded.class_thresholds())).nonzero()[:, 0]
        values, order = probabilities[indices].sort(descending=True)
        indices = indices[order]
    else:
        probabilities = logits.softmax(-1)
        values, indices = probabilities.topk(min(top_k, len(probabilities)))
    return [(names[i], float(p)) for p, i in zip(values, indices.tolist(), strict=True)]


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number")
    return int(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.predict", description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    add_runtime_argument(parser)
    parser.add_argument(
        "--top-k",
        type=positive,
        default=5,
        help="classes to list per image (5); a multi-label model lists those above their thresholds",
    )
    parser.add_argument("images", nargs="+", type=Path, help="image files")
    args = parser.parse_args(argv)
    try:
        model = load_model(args)
        require_classifier(model.loaded)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    failed = 0
    for path in args.images:
        try:
            image = read_image(path)
        except ValueError as err:
            print(err, file=sys.stderr)
            failed += 1
            continue
        top = predict(model.loaded, image, args.top_k, model.logits)
        print(f"{path}: " + (", ".join(f"{name} {p:.1%}" for name, p in top) or "no class reaches its threshold"))
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
