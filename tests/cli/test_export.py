import json
import re
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from tests.helpers import tiny_run, write_timm
from vit.checkpoint import CheckpointError, load
from vit.cli import export as export_module
from vit.cli.export import main as export
from vit.cli.export import to_safetensors
from vit.cli.predict import main as predict
from vit.cli.predict import predict as top_classes
from vit.interop.files import read_safetensors
from vit.interop.loaded import MULTILABEL, TASK_METADATA
from vit.model.presets import preset_config
from vit.training.module import ViTClassifier
from vit.training.run import train

THRESHOLDS = [0.2, 0.35, 0.5, 0.9]  # a multi-label model's, one a class of the run's four


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")  # no position-embedding figure: nothing here reads it
    return train(tiny_run(folder, "trainer.max_epochs=1", "callbacks.pos_embed_figure=null"))["best_checkpoint"]


@pytest.fixture(scope="module")
def onnx_graph(run, tmp_path_factory):
    """The run's fp32 graph, as `--format onnx` writes it: one export for the tests that compare against it."""
    out = tmp_path_factory.mktemp("onnx") / "m.onnx"
    export(["--checkpoint", run, "--format", "onnx", "--out", str(out)])
    return out


def test_ckpt_to_safetensors_round_trip_is_exact(run, tmp_path):
    export(["--checkpoint", run, "--format", "safetensors", "--out", str(tmp_path / "m.safetensors")])
    original, exported = load(run), load(tmp_path / "m.safetensors")
    assert exported.config == original.config and exported.classes == original.classes
    assert exported.mean == original.mean and exported.std == original.std
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(exported.model(images), original.model(images))
    assert not list(tmp_path.glob(".*partial"))


def test_safetensors_keep_every_data_fact(run, tmp_path):
    """How evaluation framed images (an image folder's crop_pct and filter) travels with the weights."""
    loaded = load(run)
    names = tuple(f"kind {k}" for k in range(loaded.config.num_classes))  # one per class: load refuses other counts
    framed = replace(loaded, crop_pct=0.875, interpolation="bilinear", classes=names)
    to_safetensors(framed, tmp_path / "m.safetensors")
    assert load(tmp_path / "m.safetensors").facts() == framed.facts()


def test_a_safetensors_export_is_named_so_that_load_reads_it_back(exported, tmp_path):
    out = tmp_path / "m.st"
    with pytest.raises(SystemExit) as exit:
        export(["--checkpoint", exported(), "--format", "safetensors", "--out", str(out)])
    assert (
        str(exit.value) == f"--out {out}: name a .safetensors file: vit.checkpoint.load knows the format by that suffix"
    )
    assert not out.exists()


def test_a_timm_file_exports_with_the_preset_named(tmp_path):
    checkpoint = write_timm(tmp_path / "timm.safetensors")
    out = tmp_path / "m.safetensors"
    with pytest.raises(SystemExit, match=r"timm\.safetensors: a timm state dict does not record the number of heads"):
        export(["--checkpoint", checkpoint, "--format", "safetensors", "--out", str(out)])
    export(["--checkpoint", checkpoint, "--preset", "vit_fashion_mnist", "--format", "safetensors", "--out", str(out)])
    original, exported = load(checkpoint, config=preset_config("vit_fashion_mnist")), load(out)
    assert exported.config == original.config and exported.config.num_heads == 1
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(exported.model(images), original.model(images))


def test_onnx_matches_pytorch_with_a_dynamic_batch_and_carries_the_task(run, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    source = tmp_path / "tags.safetensors"  # the run's model, read as several labels per image
    to_safetensors(replace(load(run), task=MULTILABEL, thresholds=tuple(THRESHOLDS)), source)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export(["--checkpoint", str(source), "--format", "onnx", "--out", str(tmp_path / "m.onnx")])
    assert not [w for w in caught if "training mode" in str(w.message)]  # the scoring wrapper was left in it
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    record = json.loads(session.get_modelmeta().custom_metadata_map[TASK_METADATA])
    assert record == {"kind": MULTILABEL, "thresholds": THRESHOLDS}
    model = load(run).model
    for batch in (1, 5):
        images = torch.randn(batch, 3, 16, 16)
        (logits,) = session.run(["logits"], {"images": images.numpy()})
        with torch.no_grad():
            np.testing.assert_allclose(logits, model(images).numpy(), atol=1e-4, rtol=1e-4)


def test_predict_and_the_exports_score_images_as_evaluation_did(tmp_path):
    """A run validated and tested on each image, its mirror and two shifted copies: predict and the ONNX graph
    scored the plain model's logits, so they disagreed with the accuracy the run reported (103 of 1,000
    Fashion-MNIST predictions, in the review's check)."""
    onnxruntime = pytest.importorskip("onnxruntime")
    views = ["test_time_flip=true", "test_time_shift=1", "trainer.max_epochs=1"]
    smaller = ["model.depth=1", "callbacks.pos_embed_figure=null"]  # six views traced into the graph: one layer each
    run = train(tiny_run(tmp_path / "run", *views, *smaller))["best_checkpoint"]
    loaded = load(run)
    assert loaded.views() == {"test_time_flip": True, "test_time_shift": 1}
    module = ViTClassifier.load_from_checkpoint(run, weights_only=True).eval()
    module.set_black(loaded.mean, loaded.std)
    images = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        scored = loaded.logits(images)
        torch.testing.assert_close(scored, module.views(images), rtol=0, atol=0)  # evaluation's own
        assert not torch.allclose(scored, loaded.model(images), atol=1e-3)  # the views change the logits
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8))
    ((_, p), *_) = top_classes(loaded, image)
    with torch.no_grad():
        assert p == pytest.approx(loaded.logits(loaded.preprocess(image)).softmax(-1).max().item())
    export(["--checkpoint", run, "--format", "safetensors", "--out", str(tmp_path / "m.safetensors")])
    assert load(tmp_path / "m.safetensors").views() == loaded.views()
    export(["--checkpoint", run, "--format", "onnx", "--out", str(tmp_path / "m.onnx")])
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    (logits,) = session.run(["logits"], {"images": images.numpy()})
    np.testing.assert_allclose(logits, scored.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.slow  # two ONNX exports with external weights: ~10 s
def test_an_onnx_export_with_its_weights_beside_it_replaces_the_previous_pair(exported, tmp_path, monkeypatch):
    """Past torch.onnx's threshold (1.5 GB of weights) the graph names a weights file beside it: that file was named
    after the temporary graph (.m.onnx.HOST.PID-TID.partial.data), stayed hidden beside m.onnx, and every export
    left one more."""
    onnxruntime = pytest.importorskip("onnxruntime")
    monkeypatch.setattr(export_module, "ONNX_WEIGHTS_INSIDE", 0)  # this tiny model's weights go beside it too
    out = tmp_path / "m.onnx"
    export(["--checkpoint", exported("first.safetensors"), "--format", "onnx", "--out", str(out)])
    second = exported("second.safetensors", depth=3)
    export(["--checkpoint", second, "--format", "onnx", "--out", str(out)])
    beside = sorted(p.name for p in tmp_path.iterdir() if ".onnx" in p.name)
    assert len(beside) == 2 and beside[0] == "m.onnx" and re.fullmatch(r"m\.onnx\.[0-9a-f]{12}\.data", beside[1])
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    images = torch.randn(2, 3, 16, 16)
    (logits,) = session.run(["logits"], {"images": images.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(logits, load(second).model(images).numpy(), atol=1e-4, rtol=1e-4)


def test_predict_prints_top_k_names_for_any_image_mode(run, tmp_path, capsys):
    paths = []
    for mode in ("L", "RGBA", "P", "I;16"):
        path = tmp_path / f"{mode.replace(';', '')}.png"
        Image.new(mode, (20, 12)).save(path)
        paths.append(str(path))
    predict(["--checkpoint", run, "--top-k", "2", *paths])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4
    for line, path in zip(lines, paths, strict=True):
        assert line.startswith(f"{path}: class_") and line.count("%") == 2
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(SystemExit):
        predict(["--checkpoint", run, str(tmp_path / "bad.png")])
    assert "bad.png: not a readable image" in capsys.readouterr().err


def test_a_model_trained_here_exports_to_a_timm_folder_that_timm_loads_with_the_same_logits(run, tmp_path):
    import timm

    out = tmp_path / "timm_folder"
    export(["--checkpoint", run, "--format", "timm", "--out", str(out)])
    ours = load(run).model
    theirs = timm.create_model(f"local-dir:{out}", pretrained=True).eval()  # timm's own reader of the folder
    images = torch.randn(2, ours.config.in_chans, *ours.config.img_size)
    with torch.no_grad():
        torch.testing.assert_close(theirs(images), ours(images), atol=1e-5, rtol=0)
    assert load(out).config == ours.config  # and our loader reads it back as the same network


def test_safetensors_and_timm_folders_carry_the_task_and_each_classs_threshold(run, tmp_path):
    """How to read the logits (a softmax, or a sigmoid per class from its threshold) travels with the weights, and
    vit.checkpoint.load reads it back (ONNX's metadata_props: test_onnx_matches_pytorch_...)."""
    import timm

    assert load(run).task_record() == {"kind": "classify", "thresholds": None}
    record = {"kind": MULTILABEL, "thresholds": THRESHOLDS}
    source = tmp_path / "tags.safetensors"
    to_safetensors(replace(load(run), task=MULTILABEL, thresholds=tuple(THRESHOLDS)), source)
    assert load(source).task_record() == record
    export(["--checkpoint", str(source), "--format", "timm", "--out", str(tmp_path / "timm")])
    assert json.loads((tmp_path / "timm" / "config.json").read_text())[TASK_METADATA] == record
    assert load(tmp_path / "timm").task_record() == record
    timm.create_model(f"local-dir:{tmp_path / 'timm'}", pretrained=True)  # timm passes over the key


@pytest.mark.parametrize(
    ("record", "says"),
    [
        ({"kind": "detect"}, r"task 'detect' is not one of classify, multilabel, mae"),
        ({"kind": "classify", "thresholds": [0.5] * 4}, r"thresholds recorded for task classify"),
        ({"kind": MULTILABEL, "thresholds": [0.5, 2.0, 0.5, 0.5]}, r"thresholds must be 4 probabilities in \[0, 1\]"),
        (["multilabel"], r"its task record is list, not a mapping"),
    ],
)
def test_a_task_record_predict_would_misread_is_one_line_naming_the_file(run, tmp_path, record, says):
    to_safetensors(load(run), tmp_path / "m.safetensors")
    tensors, metadata = read_safetensors(tmp_path / "m.safetensors")
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={**metadata, TASK_METADATA: json.dumps(record)})
    with pytest.raises(CheckpointError, match=rf"m\.safetensors: (its metadata {TASK_METADATA} holds .*|{says})"):
        load(tmp_path / "m.safetensors")


def test_a_pt2_program_scores_as_evaluation_did_with_a_dynamic_batch_and_carries_the_task(run, tmp_path):
    export(["--checkpoint", run, "--format", "pt2", "--out", str(tmp_path / "m.pt2")])
    extra = {export_module.PT2_TASK: ""}
    program = torch.export.load(str(tmp_path / "m.pt2"), extra_files=extra).module()
    assert json.loads(extra[export_module.PT2_TASK]) == load(run).task_record()
    loaded = load(run)
    for batch in (1, 5):
        images = torch.randn(batch, 3, 16, 16)
        with torch.no_grad():
            torch.testing.assert_close(program(images), loaded.logits(images))
    with pytest.raises(SystemExit, match=r"--out .*m\.bin: name a \.pt2 file"):
        export(["--checkpoint", run, "--format", "pt2", "--out", str(tmp_path / "m.bin")])


def test_an_int8_onnx_export_predicts_as_the_float_model_within_half_a_point(run, onnx_graph, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    import onnx

    from vit.data.memory.synthetic import SyntheticDataModule

    export(["--checkpoint", run, "--format", "onnx", "--quantize", "int8", "--out", str(tmp_path / "m8.onnx")])
    graph = onnx.load(tmp_path / "m8.onnx")
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {node.op_type for node in graph.graph.node}
    assert (tmp_path / "m8.onnx").stat().st_size < onnx_graph.stat().st_size
    assert json.loads({p.key: p.value for p in graph.metadata_props}[TASK_METADATA]) == load(run).task_record()
    data = SyntheticDataModule(
        "data", num_classes=4, in_chans=3, img_size=16, val_size=64, test_size=2000, eval_batch_size=2000
    )
    data.setup()
    images, labels = data.on_after_batch_transfer(next(iter(data.test_dataloader())), 0)
    accuracy = {}
    for name, path in (("m.onnx", onnx_graph), ("m8.onnx", tmp_path / "m8.onnx")):
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (logits,) = session.run(["logits"], {"images": images.numpy()})
        accuracy[name] = float((logits.argmax(-1) == labels.numpy()).mean())
    assert accuracy["m.onnx"] > 0.5 and abs(accuracy["m8.onnx"] - accuracy["m.onnx"]) <= 0.005
    with pytest.raises(SystemExit, match=r"--quantize int8 --format timm: only an onnx export is quantized here"):
        export(["--checkpoint", run, "--format", "timm", "--quantize", "int8", "--out", str(tmp_path / "t")])


def test_a_static_int8_export_is_calibrated_on_the_runs_images_and_predicts_as_the_float_model(run, tmp_path):
    """--quantize int8-static: QDQ nodes with each activation's range fixed from the run's validation images (read
    by vit.cli.run_data as evaluation read them), weights per output channel, the export's records kept; on 2,000
    test images it picks the float model's class within its bound."""
    onnxruntime = pytest.importorskip("onnxruntime")
    import onnx

    from vit.cli.run_data import calibration_images, evaluation_data
    from vit.data.memory.synthetic import SyntheticDataModule

    loaded = load(run)
    batches = calibration_images(Path(run), [], loaded, 40)
    val = evaluation_data(Path(run), [], loaded)
    first = val.on_after_batch_transfer(next(iter(val.evaluation_loader("val"))), 0)[0][:40]
    assert [len(b) for b in batches] == [32, 8] and torch.equal(torch.cat(batches), first)
    out = tmp_path / "m8s.onnx"
    export(["--checkpoint", run, "--format", "onnx", "--quantize", "int8-static", "--calibration-images", "64",
            "--out", str(out)])  # fmt: skip
    graph = onnx.load(out)
    kinds = [node.op_type for node in graph.graph.node]
    assert kinds.count("QuantizeLinear") >= 10 and "DynamicQuantizeLinear" not in kinds
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer}
    weights = [n for n in graph.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in constants]
    assert any(constants[n.input[1]].size > 1 for n in weights)  # a scale per output channel
    assert {p.key: p.value for p in graph.metadata_props} == export_module.export_metadata(loaded)
    data = SyntheticDataModule(
        "data", num_classes=4, in_chans=3, img_size=16, val_size=64, test_size=2000, eval_batch_size=2000
    )
    data.setup()
    images, labels = data.on_after_batch_transfer(next(iter(data.test_dataloader())), 0)
    quantized = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (logits,) = quantized.run(["logits"], {"images": images.numpy()})
    with torch.no_grad():
        float_accuracy = float((loaded.logits(images).argmax(-1) == labels).float().mean())
    accuracy = float((logits.argmax(-1) == labels.numpy()).mean())
    assert float_accuracy > 0.5 and abs(accuracy - float_accuracy) <= 0.01


def test_a_static_int8_export_without_the_runs_data_is_one_line(exported, tmp_path):
    out = tmp_path / "m8s.onnx"
    with pytest.raises(SystemExit) as exit:
        export(["--checkpoint", exported(), "--format", "onnx", "--quantize", "int8-static", "--out", str(out)])
    assert re.fullmatch(r".*model\.safetensors: no config\.yaml of its run beside it .*data=cifar10 data\.root=DIR",
                        str(exit.value))  # fmt: skip
    with pytest.raises(SystemExit, match=r"^image folder not found: data\.root=.*missing does not exist$"):
        export(["--checkpoint", exported(), "--format", "onnx", "--quantize", "int8-static", "--out", str(out),
                "data=imagefolder", f"data.root={tmp_path / 'missing'}"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"^--calibration-images: only --quantize int8-static reads the run's images"):
        export(["--checkpoint", exported(), "--format", "onnx", "--quantize", "int8", "--calibration-images", "8",
                "--out", str(out)])  # fmt: skip
    assert not out.exists()
