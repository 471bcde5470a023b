"""--runtime onnx (vit/cli/runtime.py): predict scores a .onnx export in ONNX Runtime as torch scores its checkpoint,
the run's test-time views and reading of images included; what it cannot score as evaluation did is one line."""

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers import perturb_, tiny_config
from vit.checkpoint import Loaded, load
from vit.cli.export import main as export
from vit.cli.export import to_safetensors
from vit.cli.predict import main as predict
from vit.cli.predict import predict as top_classes
from vit.cli.runtime import load_model
from vit.model import VisionTransformer

pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A folder with m.safetensors, a tiny model whose run scored each image with its mirror image and normalised
    with statistics of its own, and m.onnx, its fp32 export."""
    folder = tmp_path_factory.mktemp("runtime")
    network = perturb_(VisionTransformer(tiny_config(num_classes=4, depth=1))).eval()  # one layer: a quicker export
    path = folder / "m.safetensors"
    names = ("cat", "dog", "sky", "sea")
    to_safetensors(Loaded(network, (0.4, 0.5, 0.6), (0.2, 0.25, 0.3), names, path, test_time_flip=True), path)
    export(["--checkpoint", str(path), "--format", "onnx", "--out", str(folder / "m.onnx")])
    return folder


def _images(folder: Path) -> list[str]:
    """Files of three modes and sizes, each read and resized as evaluation read images."""
    rng = np.random.default_rng(0)
    paths = []
    for mode, size in (("RGB", (40, 30)), ("L", (16, 16)), ("RGBA", (20, 33))):
        path = folder / f"{mode}.png"
        pixels = rng.integers(0, 256, (size[1], size[0], len(mode)), dtype=np.uint8)
        Image.fromarray(pixels.squeeze(-1) if mode == "L" else pixels, mode).save(path)
        paths.append(str(path))
    return paths


def test_predict_in_onnx_runtime_answers_as_in_torch(model, tmp_path, capsys):
    images = _images(tmp_path)
    predict(["--checkpoint", str(model / "m.safetensors"), "--top-k", "3", *images])
    in_torch = capsys.readouterr().out
    predict(["--checkpoint", str(model / "m.onnx"), "--runtime", "onnx", "--top-k", "3", *images])
    assert capsys.readouterr().out == in_torch and in_torch.count("\n") == 3
    loaded = load(model / "m.safetensors")
    graph = load_model(argparse.Namespace(checkpoint=model / "m.onnx", preset=None, runtime="onnx"))
    assert graph.loaded.classes == loaded.classes and graph.loaded.facts() == loaded.facts()
    for path in images:
        expected = top_classes(loaded, Image.open(path), top_k=4)
        answered = top_classes(graph.loaded, Image.open(path), top_k=4, logits=graph.logits)
        assert [name for name, _ in answered] == [name for name, _ in expected]
        np.testing.assert_allclose([p for _, p in answered], [p for _, p in expected], atol=1e-4, rtol=0)
    unviewed = top_classes(replace(loaded, test_time_flip=False), Image.open(images[0]), top_k=4)
    assert max(abs(p - q) for (_, p), (_, q) in zip(unviewed, expected, strict=True)) > 1e-3  # the view counts


@pytest.mark.slow  # a second ONNX export: ~5 s
def test_a_checkpoint_in_onnx_runtime_is_scored_by_its_own_graph(model, tmp_path):
    """--runtime onnx given a checkpoint: its fp32 graph, exported on the spot, answers as torch does."""
    images = _images(tmp_path)
    graph = load_model(argparse.Namespace(checkpoint=model / "m.safetensors", preset=None, runtime="onnx"))
    assert graph.logits != graph.loaded.logits  # ONNX Runtime's, not the checkpoint's network
    loaded = load(model / "m.safetensors")
    for path in images:
        expected = top_classes(loaded, Image.open(path), top_k=4)
        answered = top_classes(graph.loaded, Image.open(path), top_k=4, logits=graph.logits)
        assert [name for name, _ in answered] == [name for name, _ in expected]
        np.testing.assert_allclose([p for _, p in answered], [p for _, p in expected], atol=1e-4, rtol=0)


def test_what_onnx_runtime_cannot_score_as_evaluation_did_is_one_line(model, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    image = _images(tmp_path)[0]
    onnx_file = str(model / "m.onnx")
    with pytest.raises(SystemExit, match=r"m\.onnx: an ONNX graph runs in ONNX Runtime: add --runtime onnx$"):
        predict(["--checkpoint", onnx_file, image])
    with pytest.raises(SystemExit, match=r"^--preset vit_fashion_mnist: .*m\.onnx records its own model$"):
        predict(["--checkpoint", onnx_file, "--runtime", "onnx", "--preset", "vit_fashion_mnist", image])
    bare = tmp_path / "bare.onnx"  # another tool's graph, recording the task only
    node = helper.make_node("Identity", ["images"], ["logits"])
    io = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 4]) for name in ("images", "logits")]
    graph = helper.make_model(helper.make_graph([node], "bare", io[:1], io[1:]))
    graph.metadata_props.add(key="vit_task", value='{"kind": "classify"}')
    onnx.save(graph, bare)
    with pytest.raises(SystemExit, match=r"bare\.onnx: its metadata_props record no vit_config, so how it reads"):
        predict(["--checkpoint", str(bare), "--runtime", "onnx", image])
    (tmp_path / "junk.onnx").write_bytes(b"\xff not a graph")
    with pytest.raises(SystemExit, match=r"junk\.onnx: not an ONNX graph"):
        predict(["--checkpoint", str(tmp_path / "junk.onnx"), "--runtime", "onnx", image])
    native = tmp_path / "native.safetensors"  # a data.max_tokens run's: each image at its own aspect ratio
    to_safetensors(replace(load(model / "m.safetensors"), max_tokens=16), native)
    with pytest.raises(SystemExit, match=r"data\.max_tokens=16\), but an ONNX graph reads one size \(16x16\)"):
        predict(["--checkpoint", str(native), "--runtime", "onnx", image])
