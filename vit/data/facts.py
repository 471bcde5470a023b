"""The data facts a checkpoint keeps so that a model reads images as its evaluation did: per-channel mean and
std, class names, how evaluation framed images, and whether an image has several labels. Defined once, so what
training writes and what an export writes cannot differ."""

from __future__ import annotations

from typing import Any

DATA_FACTS = "data_facts"  # the checkpoint entry (and .safetensors metadata key) that holds them
# the data facts on how evaluation resized and cropped; max_tokens: each image at its own aspect ratio within that
# many patches instead (data.max_tokens; vit/data/native_size.py), None for the square pipeline; input_size: the
# (H, W) it cropped to where that is not the model's img_size (an imported image processor's), else None
FRAMING = ("crop_pct", "crop_mode", "interpolation", "max_tokens", "input_size")


def data_facts(holder: Any) -> dict[str, Any]:
    """The data facts of a data module or of a loaded model (vit.checkpoint.Loaded): its attributes of these
    names, which SplitDataModule declares, in lists that JSON and torch.load(weights_only=True) read."""
    return {
        "mean": list(holder.mean),
        "std": list(holder.std),
        "classes": list(holder.classes or []) or None,
        **{key: list(v) if isinstance(v := getattr(holder, key), tuple) else v for key in FRAMING},
        # trained on several labels an image: each class is scored on its own (a sigmoid each), not one of K (softmax);
        # False for a holder that does not say (in-memory data)
        "multilabel": bool(getattr(holder, "multilabel", False)),
    }
