"""Which of timm's pretrained ViTs our loader holds: every architecture behind timm's pretrained `vit_*`, `deit*`,
`eva*`, `aimv2*`, `naflexvit*`, `samvit*` and `gemma4_vit*` checkpoints (ResNet hybrids included), built by timm
with random weights and two layers, saved as timm saves for the hub, loaded by `vit.checkpoint.load(folder)` and
compared with timm's outputs.

    python -m benchmarks.timm_sweep [--limit N] [--json PATH]

Each architecture ends in one of: `parity` (loaded, outputs within 1e-5 of their scale), `refused` (one line
naming the feature we lack), `WRONG` (loaded but computing something else: a bug), `CRASH` (the loader raised
something other than its one-line error: a bug), or `error` (timm could not build it).
Prints a markdown table by model class and the refusals grouped by reason.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
import time
import warnings
from pathlib import Path

import timm
import torch
from timm.models import save_for_hf

from vit.checkpoint import CheckpointError, load

FAMILIES = ["vit_*", "deit*", "eva*", "aimv2*", "naflexvit*", "samvit*", "gemma4_vit*"]


def architectures() -> list[str]:
    return sorted({n.split(".")[0] for n in timm.list_models(FAMILIES, pretrained=True)})


def _per_layer(name: str, **kwargs) -> dict:
    """The settings timm takes one a layer (Sapiens 2's key/value heads), for two layers: the first layer's and
    a middle one's, read off the whole model built on the meta device (no memory)."""
    with torch.device("meta"):
        whole = timm.create_model(name, pretrained=False, **kwargs)
    middle = len(whole.blocks) // 2
    return dict(num_kv_heads=tuple(whole.blocks[i].attn.num_kv_heads for i in (0, middle)))


def _build(name: str) -> torch.nn.Module:
    """timm's model cut to two layers, at a small image size (four patches a side) where the architecture takes one."""
    patch = int(m.group(1)) if (m := re.search(r"patch(\d+)", name)) else 16
    for kwargs in (dict(img_size=4 * patch), {}):  # never whole: a 7B model fills the memory
        for per_layer in (False, True):
            try:
                extra = _per_layer(name, **kwargs) if per_layer else {}
                return timm.create_model(name, pretrained=False, depth=2, **kwargs, **extra)
            except Exception:  # the next form is tried
                continue
    raise RuntimeError("timm could not build it with two layers")


def check(name: str, folder: Path) -> tuple[str, str, str]:
    """(timm's model class, outcome, detail) of one architecture."""
    try:
        theirs = _build(name).eval()
    except RuntimeError as err:
        return "?", "error", str(err)
    kind = type(theirs).__name__
    with torch.no_grad():
        for p in theirs.parameters():
            p.add_(torch.randn_like(p) * 0.02)  # off timm's init: no all-ones norm passes by chance
    save_for_hf(theirs, str(folder), safe_serialization=True)
    try:
        loaded = load(folder)
    except CheckpointError as err:  # "<folder>: timm's <name> is not a ViT this model can hold: <reason>"
        return kind, "refused", str(err).split("can hold: ", 1)[-1]
    except Exception as err:
        return kind, "CRASH", f"{type(err).__name__}: {err}"
    # at its own size, or at 32 x 32 patches where that is more (RADIO's 128 x 128 table: resampling reads it)
    patch = loaded.config.patch_size
    images = torch.randn(2, 3, *(min(s, 32 * p) for s, p in zip(loaded.config.img_size, patch, strict=True)))
    with torch.no_grad():
        expected, ours = theirs(images), loaded.model(images)
    scale = max(1.0, expected.abs().max().item())
    difference = (ours - expected).abs().max().item() / scale
    return kind, ("parity" if difference <= 1e-5 else "WRONG"), f"{difference:.1e} of scale"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.timm_sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--limit", type=int, default=None, help="the first N architectures only")
    p.add_argument("--json", type=Path, default=None, help="write every architecture's outcome here")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    names = architectures()[: args.limit]
    outcomes: dict[str, tuple[str, str, str]] = {}
    start = time.perf_counter()
    for i, name in enumerate(names):
        with tempfile.TemporaryDirectory() as folder:
            outcomes[name] = kind, outcome, detail = check(name, Path(folder))
        print(f"[{i + 1}/{len(names)}] {name} ({kind}): {outcome} ({detail})", flush=True)
    counts = collections.Counter(o for _, o, _ in outcomes.values())
    print(f"\n{len(names)} architectures in {time.perf_counter() - start:.0f} s: " + ", ".join(
        f"{n} {o}" for o, n in counts.most_common()) + f"; parity {counts['parity'] / len(names):.1%}")  # fmt: skip
    print("\n| timm class | architectures | parity | refused | wrong | crash | error |\n|---|---|---|---|---|---|---|")
    by_class = collections.defaultdict(collections.Counter)
    for kind, outcome, _ in outcomes.values():
        by_class[kind][outcome] += 1
    for kind, c in sorted(by_class.items(), key=lambda kv: -sum(kv[1].values())):
        row = [sum(c.values()), c["parity"], c["refused"], c["WRONG"], c["CRASH"], c["error"]]
        print(f"| {kind} | " + " | ".join(map(str, row)) + " |")
    reasons = collections.Counter(d for _, o, d in outcomes.values() if o == "refused")
    print("\n| refused because | architectures |\n|---|---|")
    for reason, n in reasons.most_common():
        print(f"| {reason} | {n} |")
    if args.json:
        args.json.write_text(json.dumps(outcomes, indent=1))


if __name__ == "__main__":
    main()
