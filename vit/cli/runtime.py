"""--runtime, shared by predict and serve: what computes a model's logits. torch runs the checkpoint
(Loaded.logits); onnx runs an ONNX graph in ONNX Runtime on the CPU: the .onnx file `python -m vit.cli.export
--format onnx` wrote (fp32 or int8), or, given a checkpoint, its fp32 graph exported here. Either way images are read
as the run's evaluation read them (Loaded.preprocess, from the checkpoint's or the graph's records) and scored with
its test-time views (the graph holds them), so fp32 answers equal torch's up to float rounding."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor

from vit.cli.checkpoint_args import load_checkpoint
from vit.interop.load import Loaded, load_graph

RUNTIMES = ("torch", "onnx")
GRAPH_SUFFIX = ".onnx"


@dataclass(frozen=True)
class Model:
    """A model as a runtime scores it: `loaded` reads images and names the outputs (preprocess, classes, task);
    `logits` scores them, (B, C, H, W) -> (B, K), as evaluation did."""

    loaded: Loaded
    logits: Callable[[Tensor], Tensor]


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        choices=RUNTIMES,
        default="torch",
        help="torch (a checkpoint) or onnx: ONNX Runtime on the CPU, with a .onnx export or a checkpoint's graph",
    )


def read_model(args: argparse.Namespace) -> Loaded:
    """What reads images and outputs for --checkpoint under --runtime, refusing in one line (ValueError) what that
    runtime cannot score as evaluation did; the network itself is not made ready to run (load_model)."""
    graph = args.checkpoint.suffix == GRAPH_SUFFIX
    if args.runtime == "torch":
        if graph:
            raise ValueError(f"{args.checkpoint}: an ONNX graph runs in ONNX Runtime: add --runtime onnx")
        return load_checkpoint(args)
    _onnxruntime()
    if graph and args.preset:
        raise ValueError(f"--preset {args.preset}: {args.checkpoint} records its own model")
    loaded = load_graph(args.checkpoint) if graph else load_checkpoint(args)
    if loaded.max_tokens is not None:
        raise ValueError(
            f"{args.checkpoint}: its run read each image at its own aspect ratio (data.max_tokens={loaded.max_tokens}),"
            f" but an ONNX graph reads one size ({loaded.config.img_size[0]}x{loaded.config.img_size[1]}): use "
            "--runtime torch"
        )
    return loaded


def load_model(args: argparse.Namespace) -> Model:
    """The model of --checkpoint under --runtime, ready to score. ONNX Runtime gets torch's thread count, which a
    serving worker has divided among the workers already."""
    loaded = read_model(args)
    if args.runtime == "torch":
        loaded.model.eval()
        return Model(loaded, loaded.logits)
    onnxruntime = _onnxruntime()
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.log_severity_level = 3  # errors only: not its notes on which nodes it placed where

    def opened(path: Path) -> Any:  # an onnxruntime.InferenceSession
        return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    if args.checkpoint.suffix == GRAPH_SUFFIX:
        graph = opened(args.checkpoint)
    else:
        from vit.cli.export import to_onnx  # the export's own graph: the views as evaluation scored them

        with tempfile.TemporaryDirectory(prefix="vit-runtime-") as folder:
            to_onnx(loaded, Path(folder) / "model.onnx")
            graph = opened(Path(folder) / "model.onnx")  # read whole: the folder can go

    def logits(images: Tensor) -> Tensor:
        (scores,) = graph.run(["logits"], {"images": images.float().numpy()})
        return torch.from_numpy(scores)

    return Model(loaded, logits)


def _onnxruntime() -> ModuleType:
    try:
        import onnxruntime
    except ImportError:
        raise ValueError("--runtime onnx needs ONNX Runtime: pip install onnxruntime") from None
    return onnxruntime
