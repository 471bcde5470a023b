"""Export a trained model:
`python -m vit.cli.export --checkpoint CKPT [--preset NAME] --format safetensors|onnx|timm|pt2 --out PATH
[--quantize int8|int8-static [--calibration-images N] [data=NAME data.KEY=VALUE ...]]`.

- safetensors: the model's weights, with its ViTConfig, data facts, test-time views and task as metadata, so
  `vit.checkpoint.load` rebuilds it (and nothing in the file can run code).
- onnx: images (B, C, H, W) -> logits (B, classes) as evaluation scored them (averaged over the run's test-time
  views, if it used any: Loaded.logits), with a dynamic batch dimension; weights past 1.5 GB in a file beside it.
  The graph's metadata_props hold what the safetensors metadata holds but the weights (ViTConfig, data facts, views,
  task), so that predict and serve --runtime onnx read images for it as evaluation did.
- onnx with --quantize int8: the same graph with its matrix products' weights in int8 and their inputs quantized
  as each batch comes (ONNX Runtime's dynamic quantization; onnxruntime must be installed); the records kept.
- onnx with --quantize int8-static: every activation's int8 range fixed beforehand from N images of the run's
  validation split (--calibration-images, 512), read as its evaluation read them: the data config of the run's
  config.yaml beside the checkpoint, or data=NAME data.KEY=VALUE given after the options (vit.cli.run_data).
- pt2: a torch.export program of the same function (dynamic batch): `torch.export.load(PATH).module()(images)`;
  the task in its extra file vit_task.json.
- timm: a hub folder (config.json + model.safetensors) that timm.create_model('local-dir:PATH', pretrained=True)
  builds with the same logits, and that vit.checkpoint.load reads back. timm's model has no test-time views: for
  a run that used them, its logits are the plain model's, not evaluation's. config.json's vit_task, which timm
  ignores, holds the task.

The task says how to read the logits: one class an image (a softmax), or, task=multilabel, a sigmoid per class with
each class's threshold ({"kind": ..., "thresholds": [...]}, JSON).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import sys
import tempfile
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import Tensor, nn

from vit.atomic import WriteError, write_atomically, write_folder_atomically
from vit.cli.checkpoint_args import add_checkpoint_arguments, load_checkpoint
from vit.cli.output import write_out
from vit.cli.predict import positive
from vit.interop.load import EXPORT_METADATA, Loaded
from vit.interop.loaded import TASK_METADATA
from vit.interop.timm import TIMM_CONFIG, TIMM_WEIGHTS, hub_config, to_timm

FORMATS = ("safetensors", "onnx", "timm", "pt2")
DYNAMIC, STATIC = "int8", "int8-static"
QUANTIZE = (DYNAMIC, STATIC)
CALIBRATION_IMAGES = 512  # images an int8-static export calibrates on by default
PT2_TASK = f"{TASK_METADATA}.json"  # a pt2 program's extra file holding the task
# bytes of weights past which an ONNX export keeps them in a file beside the graph: torch.onnx's own threshold,
# below protobuf's 2 GB limit on one file
ONNX_WEIGHTS_INSIDE = 1_500_000_000


def export_metadata(loaded: Loaded) -> dict[str, str]:
    """What an export records beside the weights (EXPORT_METADATA: safetensors metadata, ONNX metadata_props), JSON
    each, as vit.checkpoint.load and load_graph read it back."""
    records = (loaded.config.to_dict(), loaded.facts(), loaded.views(), loaded.task_record())
    return {key: json.dumps(record) for key, record in zip(EXPORT_METADATA, records, strict=True)}


def to_safetensors(loaded: Loaded, out: Path) -> None:
    metadata = export_metadata(loaded)
    weights = {k: v.contiguous() for k, v in loaded.model.state_dict().items()}
    write_atomically(out, lambda path: save_file(weights, str(path), metadata=metadata))


def to_timm_folder(loaded: Loaded, out: Path) -> None:
    """config.json and model.safetensors, put in place together: the weights of one export beside the config of
    another would not load (or, worse, would, as another network)."""
    hub = hub_config(loaded.config, loaded.facts())  # refuses what timm's folders cannot state, before writing
    hub[TASK_METADATA] = loaded.task_record()  # a key of ours, which timm's reader passes over
    weights = {k: v.contiguous() for k, v in to_timm(loaded.model.state_dict(), loaded.config).items()}

    def write(folder: Path) -> None:
        save_file(weights, str(folder / TIMM_WEIGHTS), metadata={"format": "pt"})
        (folder / TIMM_CONFIG).write_text(json.dumps(hub, indent=2))

    write_folder_atomically(out, write, names=(TIMM_CONFIG, TIMM_WEIGHTS))


class _Scored(nn.Module):
    """The model as evaluation scored images (Loaded.logits), as a module torch.onnx can trace."""

    def __init__(self, loaded: Loaded):
        super().__init__()
        self.model, self.loaded = loaded.model, loaded

    def forward(self, images: Tensor) -> Tensor:
        return self.loaded.logits(images)


def _example(loaded: Loaded) -> tuple[Tensor, dict[str, dict[int, Any]]]:
    """An input of the size preprocess gives (an image processor's crop where it is not the model's own), and its
    batch dimension as dynamic."""
    c = loaded.config
    size = loaded.input_size or c.img_size
    return torch.zeros(2, c.in_chans, *size), {"images": {0: torch.export.Dim("batch", min=1, max=65536)}}


def to_pt2(loaded: Loaded, out: Path) -> None:
    example, dynamic = _example(loaded)
    program = torch.export.export(_Scored(loaded).eval(), (example,), dynamic_shapes=dynamic)
    extra = {PT2_TASK: json.dumps(loaded.task_record())}

    def write(path: Path) -> None:
        with open(path, "wb") as f:  # a file object: torch names a path's format by its suffix, a temporary's has none
            torch.export.save(program, f, extra_files=extra)

    write_atomically(out, write)


class _Calibration:
    """Batches of images (B, C, H, W) as ONNX Runtime's CalibrationDataReader gives them: get_next, then None."""

    def __init__(self, batches: Iterable[Tensor]):
        self.batches = iter(batches)

    def get_next(self) -> dict[str, Any] | None:
        images = next(self.batches, None)
        return None if images is None else {"images": images.numpy()}


def to_int8_onnx(loaded: Loaded, out: Path, calibration: Sequence[Tensor] | None = None) -> None:
    """to_onnx's graph quantized to int8 by ONNX Runtime (weights inside the file only). Dynamically without
    `calibration`: the matrix products' weights in int8, their inputs quantized as each batch comes. Statically
    with it (batches of images as evaluation read them): QDQ nodes around every quantizable op, each activation's
    range the calibration batches' min and max, weights per output channel; activations unsigned and weights
    signed (U8S8), the pair ONNX Runtime's x86 kernels run fastest (benchmarks/NOTES.md change 47)."""
    try:
        import onnx
        from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    except ImportError:
        raise SystemExit("--quantize needs ONNX Runtime: pip install onnxruntime") from None
    if sum(t.nbytes for t in loaded.model.state_dict().values()) > ONNX_WEIGHTS_INSIDE:
        raise SystemExit(f"--quantize: weights past {ONNX_WEIGHTS_INSIDE:,} bytes are not quantized here")
    with tempfile.TemporaryDirectory(prefix="vit-onnx-") as folder:
        plain = Path(folder) / "fp32.onnx"
        to_onnx(loaded, plain)

        def write(path: Path) -> None:
            logging.disable(logging.WARNING)  # its advice to pre-process, on the root logger at every call
            try:
                if calibration is None:
                    quantize_dynamic(plain, path, weight_type=QuantType.QInt8)
                else:
                    quantize_static(
                        plain, path, _Calibration(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    )  # fmt: skip
            finally:
                logging.disable(logging.NOTSET)
            graph = onnx.load(path)  # the records, as to_onnx wrote them, whether or not the quantizer kept them
            del graph.metadata_props[:]
            for key, value in export_metadata(loaded).items():
                graph.metadata_props.add(key=key, value=value)
            onnx.save(graph, path)

        write_atomically(out, write)


def to_onnx(loaded: Loaded, out: Path) -> None:
    """The graph as `out`; weights past ONNX_WEIGHTS_INSIDE in a file beside it (OUT.TOKEN.data), named anew by each
    export and named in the graph, so that the one rename that puts the graph in place changes both together. The
    previous export's weights file goes once the new graph is in place."""
    import onnx_ir as ir  # torch.onnx's own representation, installed with onnxscript

    example, dynamic = _example(loaded)
    large = sum(t.nbytes for t in loaded.model.state_dict().values()) > ONNX_WEIGHTS_INSIDE
    data = out.with_name(f"{out.name}.{uuid.uuid4().hex[:12]}.data") if large else None

    def write(path: Path) -> None:
        program = torch.onnx.export(
            _Scored(loaded).eval(),  # the wrapper too: torch.onnx warns of a module left in training mode
            (example,),
            dynamo=True,
            input_names=["images"],
            output_names=["logits"],
            dynamic_shapes=dynamic,
            verbose=False,
        )
        program.model.metadata_props.update(export_metadata(loaded))
        # not program.save: past its own threshold it names the weights file after the temporary graph's name
        ir.save(program.model, path, external_data=None if data is None else data.name)
        if data is not None:
            with open(data, "rb") as f:
                os.fsync(f.fileno())

    try:
        write_atomically(out, write)
    except WriteError:
        if data is not None:
            data.unlink(missing_ok=True)
        raise
    for previous in out.parent.glob(f"{glob.escape(out.name)}.*.data"):  # a name may hold [ ] * ?
        if previous != data:
            previous.unlink(missing_ok=True)


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
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE,
        help=f"onnx: int8 weights; {DYNAMIC}: inputs quantized per batch; {STATIC}: calibrated on the run's images",
    )
    parser.add_argument(
        "--calibration-images",
        type=positive,
        metavar="N",
        help=f"{STATIC}: images of the run's validation split to calibrate on ({CALIBRATION_IMAGES})",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help=f"{STATIC}: the data to calibrate on, where not the run's: train.py's data=NAME data.KEY=VALUE",
    )
    args = parser.parse_args(argv)
    if args.quantize and args.format != "onnx":
        raise SystemExit(f"--quantize {args.quantize} --format {args.format}: only an onnx export is quantized here")
    if args.quantize != STATIC and (args.calibration_images or args.overrides):
        what = "--calibration-images" if args.calibration_images else " ".join(args.overrides)
        raise SystemExit(f"{what}: only --quantize {STATIC} reads the run's images")
    if args.format == "safetensors" and args.out.suffix != ".safetensors":
        raise SystemExit(
            f"--out {args.out}: name a .safetensors file: vit.checkpoint.load knows the format by that suffix"
        )
    if args.format == "pt2" and args.out.suffix != ".pt2":
        raise SystemExit(f"--out {args.out}: name a .pt2 file, the suffix torch.export.load expects")
    writer = {"safetensors": to_safetensors, "onnx": to_int8_onnx if args.quantize else to_onnx,
              "timm": to_timm_folder, "pt2": to_pt2}[args.format]  # fmt: skip

    def write() -> None:
        loaded = load_checkpoint(args)
        if args.quantize == STATIC:  # the run's images first: data that cannot be found fails before any export
            count = args.calibration_images or CALIBRATION_IMAGES
            from vit.cli.run_data import calibration_images  # brings Lightning and Hydra: the static export alone

            to_int8_onnx(loaded, args.out, calibration_images(args.checkpoint, args.overrides, loaded, count))
        else:
            writer(loaded, args.out)

    write_out(args.out, write, folder=args.format == "timm")


if __name__ == "__main__":
    sys.exit(main())
