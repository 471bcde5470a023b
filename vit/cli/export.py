"""Export a trained model:
`python -m vit.cli.export --checkpoint CKPT [--preset NAME] --format safetensors|onnx|timm --out PATH`.

- safetensors: the model's weights, with its ViTConfig, data facts and test-time views as metadata, so
  `vit.checkpoint.load` rebuilds it (and nothing in the file can run code).
- onnx: images (B, C, H, W) -> logits (B, classes) as evaluation scored them (averaged over the run's test-time
  views, if it used any: Loaded.logits), with a dynamic batch dimension.
- timm: a hub folder (config.json + model.safetensors) that timm.create_model('local-dir:PATH', pretrained=True)
  builds with the same logits, and that vit.checkpoint.load reads back. timm's model has no test-time views: for
  a run that used them, its logits are the plain model's, not evaluation's.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from vit.atomic import WriteError, write_atomically
from vit.cli.checkpoint_args import add_checkpoint_arguments, load_checkpoint
from vit.data.facts import DATA_FACTS
from vit.interop.load import VIEWS_METADATA, VIT_CONFIG, Loaded
from vit.interop.timm import TIMM_CONFIG, TIMM_WEIGHTS, hub_config, to_timm

FORMATS = ("safetensors", "onnx", "timm")


def to_safetensors(loaded: Loaded, out: Path) -> None:
    metadata = {
        VIT_CONFIG: json.dumps(loaded.config.to_dict()),
        DATA_FACTS: json.dumps(loaded.facts()),
        VIEWS_METADATA: json.dumps(loaded.views()),
    }
    weights = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
    write_atomically(out, lambda path: save_file(weights, str(path), metadata=metadata))


def to_timm_folder(loaded: Loaded, out: Path) -> None:
    """The weights first, config.json last: a folder is a timm folder only once both are whole."""
    hub = hub_config(loaded.config, loaded.facts())  # refuses what timm's folders cannot state, before writing
    weights = {k: v.contiguous() for k, v in to_timm(loaded.model.state_dict(), loaded.config).items()}
    write_atomically(out / TIMM_WEIGHTS, lambda path: save_file(weights, str(path), metadata={"format": "pt"}))
    write_atomically(out / TIMM_CONFIG, lambda path: path.write_text(json.dumps(hub, indent=2)))


class _Scored(nn.Module):
    """The model as evaluation scored images (Loaded.logits), as a module torch.onnx can trace."""

    def __init__(self, loaded: Loaded):
        super().__init__()
        self.model, self.loaded = loaded.model, loaded

    def forward(self, images: Tensor) -> Tensor:
        return self.loaded.logits(images)


def to_onnx(loaded: Loaded, out: Path) -> None:
    c = loaded.config
    example = torch.zeros(2, c.in_chans, *c.img_size)
    batch = torch.export.Dim("batch", min=1, max=65536)

    def write(path: Path) -> None:
        program = torch.onnx.export(
            _Scored(loaded).eval(),  # the wrapper too: torch.onnx warns of a module left in training mode
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes={"images": {0: batch}},
            verbose=False,
        )
        program.save(str(path))

    write_atomically(out, write)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vit.cli.export", description=__doc__.split("\n\n")[0])
    add_checkpoint_arguments(parser)
    parser.add_argument("--format", required=True, choices=FORMATS)
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        help="the file to write (NAME.safetensors for safetensors; a folder for timm)",
    )
    args = parser.parse_args(argv)
    if args.format == "safetensors" and args.out.suffix != ".safetensors":
        raise SystemExit(
            f"--out {args.out}: name a .safetensors file: vit.checkpoint.load knows the format by that suffix"
        )
    try:
        loaded = load_checkpoint(args)
        {"safetensors": to_safetensors, "onnx": to_onnx, "timm": to_timm_folder}[args.format](loaded, args.out)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    except WriteError as err:
        raise SystemExit(f"--out {err}") from None
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
