"""Files and commands written to do harm, or by mistake: an export that dies half way, a one-kilobyte config that
states a million layers, entries of the wrong kind. Each is refused in one line naming the file, the key or the
value, in seconds and without building what it asks for; the previous export survives a failed one."""

from __future__ import annotations

import errno
import io
import json
import re
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tests.helpers import compose, run_train_py, tiny_config
from vit.checkpoint import CheckpointError, Loaded, load
from vit.cli import export, visualize
from vit.cli.export import to_safetensors, to_timm_folder
from vit.interop.files import MAX_JSON_DEPTH, parse_json
from vit.interop.finetune import finetune_config
from vit.model import ConfigError, VisionTransformer
from vit.model.presets import preset_config
from vit.training.checks import check_config

# the same files took minutes and gigabytes before they were refused, if they were: now they take a second
QUICKLY = pytest.mark.timeout(30)


def _at(path: Path) -> str:
    return re.escape(str(path))


def _loaded(path: Path, **overrides) -> Loaded:
    model = VisionTransformer(tiny_config(**overrides)).eval()
    return Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path)


def _exported(path: Path, **overrides) -> Path:
    to_safetensors(_loaded(path, **overrides), path)
    return path


def _edit_json(path: Path, **changes) -> None:
    values = json.loads(path.read_text())
    for key, value in changes.items():  # 'a.b' edits values['a']['b']
        *parents, last = key.split(".")
        node = values
        for parent in parents:
            node = node[parent]
        node[last] = value
    path.write_text(json.dumps(values))


def _edit_metadata(path: Path, **entries: str) -> None:
    with safe_open(str(path), framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())  # noqa: SIM118
    save_file(tensors, str(path), metadata=metadata | entries)


def _edit_config_metadata(path: Path, **changes) -> None:
    with safe_open(str(path), framework="pt") as f:
        config = json.loads(f.metadata()["vit_config"])
    _edit_metadata(path, vit_config=json.dumps(config | changes))


# an export onto an export ----------------------------------------------------------------------------------


def test_a_timm_export_that_fails_half_way_leaves_the_previous_export_whole(tmp_path, monkeypatch):
    """config.json was written after model.safetensors, each in place: a failure between them left the new weights
    beside the old config, a folder that no longer loaded, while the message said the previous file was intact."""
    out = tmp_path / "timm_folder"
    to_timm_folder(_loaded(out), out)
    checkpoint = _exported(tmp_path / "deeper.safetensors", depth=3)
    write_text = Path.write_text

    def full_disk(self, *args, **kwargs):
        if self.name == "config.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit) as exit:
        export.main(["--checkpoint", str(checkpoint), "--format", "timm", "--out", str(out)])
    assert str(exit.value) == (
        f"--out {out}: could not be written (OSError: [Errno {errno.ENOSPC}] No space left on device); the previous "
        "folder, if any, is intact"
    )
    monkeypatch.undo()
    assert load(out).config.depth == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deeper.safetensors", "timm_folder"]
    export.main(["--checkpoint", str(checkpoint), "--format", "timm", "--out", str(out)])
    assert load(out).config.depth == 3


def test_a_timm_export_onto_a_folder_of_other_files_is_refused_and_touches_nothing(tmp_path):
    """Replacing the folder whole would delete what else it holds; writing into it left them beside the export."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("not an export")
    checkpoint = _exported(tmp_path / "m.safetensors")
    with pytest.raises(SystemExit, match=rf"^--out {out}: not replaced: it holds notes\.txt, which replacing the"):
        export.main(["--checkpoint", str(checkpoint), "--format", "timm", "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


# sizes a file states --------------------------------------------------------------------------------------


def _hf_folder(path: Path, **changes) -> Path:
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=4,
        num_labels=3,
    )  # fmt: skip
    transformers.ViTForImageClassification(config).save_pretrained(path)
    _edit_json(path / "config.json", **changes)
    return path


def _timm_folder(path: Path, **model_args) -> Path:
    to_timm_folder(_loaded(path), path)
    _edit_json(path / "config.json", **{f"model_args.{key}": value for key, value in model_args.items()})
    return path


@QUICKLY
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("num_hidden_layers", 1_000_000, r"states depth=1000000, but its weights hold 2 layers"),
        ("intermediate_size", 10**11, r"an MLP 100000000000 wide\), .* the network needs 52\.0 TB for its weights"),
        ("hidden_size", 10**12, r"embed_dim=1000000000000, .* needs more than 9\.2 EB .*\(a tensor's size overflows"),
    ],
)
def test_a_hugging_face_config_stating_sizes_its_weights_lack_is_refused_unbuilt(tmp_path, key, value, said):
    folder = _hf_folder(tmp_path / "hf", **{key: value})
    with pytest.raises(CheckpointError, match=rf"^{_at(folder)}: .*{said}"):
        load(folder)


@QUICKLY
@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("depth", 1_000_000, r"config\.json: model_args\.depth=1000000, but model\.safetensors holds 2 layers"),
        (
            "mlp_ratio",
            1e9,
            r"an MLP 32000000000 wide\), .* needs 16\.6 TB .*largest tensor, layers\.0\.mlp\.fc1\.weight",
        ),
    ],
)
def test_a_timm_config_stating_sizes_its_weights_lack_is_refused_unbuilt(tmp_path, key, value, said):
    folder = _timm_folder(tmp_path / "timm", **{key: value})
    with pytest.raises(CheckpointError, match=rf"^{_at(folder)}: .*{said}"):
        load(folder)


@QUICKLY
@pytest.mark.parametrize(
    ("overrides", "changes", "said"),
    [
        ({}, {"depth": 1_000_000}, r"its configuration states depth=1000000, but its weights hold 2 layers"),
        ({}, {"embed_dim": 10**12}, r"embed_dim=1000000000000, .* needs more than 9\.2 EB for its weights alone"),
        ({}, {"mlp_ratio": 1e10}, r"an MLP 320000000000 wide\), .* needs 166\.4 TB for its weights alone"),
        ({}, {"num_classes": 10**12}, r"num_classes=1000000000000: .*needs 132\.0 TB .*tensor, head\.weight, is"),
        # no table in the file to compare with: the fixed table of a 10^6 x 10^6 grid is computed when built
        ({"pos_embed": "sincos2d"}, {"img_size": 4 * 10**6}, r"1000000x1000000 patch grid .*needs 128\.0 TB for"),
        ({}, {"mlp_ratio": 1.5}, r"weights do not match .*size mismatch for layers\.0\.mlp\.fc1\.weight: the file"),
        ({}, {"mlp_ratio": "4"}, r"its model configuration is invalid: ViTConfig\.mlp_ratio must be a finite number"),
        ({}, {"mlp_ratio": 1e308}, r"ViTConfig\.mlp_ratio=1e\+308 at embed_dim=32 gives the MLP no finite width"),
    ],
)
def test_our_export_stating_sizes_its_weights_lack_is_refused_unbuilt(tmp_path, overrides, changes, said):
    path = _exported(tmp_path / "m.safetensors", **overrides)
    _edit_config_metadata(path, **changes)
    with pytest.raises(CheckpointError, match=rf"^{_at(path)}: .*{said}"):
        load(path)


@QUICKLY
def test_a_training_checkpoint_stating_a_million_layers_is_refused_unbuilt(tmp_path):
    model = VisionTransformer(tiny_config())
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    path = tmp_path / "deep.ckpt"
    torch.save(
        {"hyper_parameters": {"model": replace(tiny_config(), depth=1_000_000).to_dict()}, "state_dict": state}, path
    )
    with pytest.raises(
        CheckpointError, match=rf"^{_at(path)}: its configuration states depth=1000000, but its weights"
    ):
        load(path)


@QUICKLY
@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("model.depth=1000000000", r"model\.depth=1000000000, .*: the network needs 133\.9 TB for its weights"),
        ("model.embed_dim=4000000", r"model\.embed_dim=4000000, .*needs 2\.0 PB for its weights alone \(its largest"),
        ("model.mlp_ratio=abc", r"model\.mlp_ratio must be a finite number, got 'abc'"),
    ],
)
def test_train_py_refuses_a_model_larger_than_the_machine_before_building_it(tmp_path, override, said):
    cfg = compose("data=synthetic", "model.patch_size=4", f"output_dir={tmp_path}", override)
    with pytest.raises(ConfigError, match=said):
        check_config(cfg)


def test_fine_tuning_at_an_image_size_whose_table_outgrows_the_machine_is_refused():
    with pytest.raises(ConfigError, match=r"a 1000000x1000000 patch grid .*needs 128\.0 TB for its weights alone"):
        finetune_config(tiny_config(), {"img_size": 4 * 10**6})


@QUICKLY
def test_visualize_resample_to_a_size_whose_table_outgrows_the_machine_is_refused(tmp_path):
    path = _exported(tmp_path / "m.safetensors")
    with pytest.raises(SystemExit, match=r"^--img-size 4000000: .*a 1000000x1000000 patch grid .*needs 128\.0 TB"):
        visualize.main(
            ["resample", "--checkpoint", str(path), "--img-size", "4000000", "--out", str(tmp_path / "r.png")]
        )
    assert not (tmp_path / "r.png").exists()


@QUICKLY
def test_attention_maps_of_more_images_than_the_memory_holds_are_refused_before_they_are_made(tmp_path, monkeypatch):
    """Every layer's maps are kept at once: the default 256 images of a ViT-L/16 need 15 GB."""
    from vit.model import size

    path = _exported(tmp_path / "m.safetensors")
    monkeypatch.setattr(size, "machine_memory", lambda: size.weight_bytes(tiny_config()) + 1000)  # the network fits
    monkeypatch.setattr(VisionTransformer, "attention_maps", None)  # never reached
    command = ["attention-distance", "--checkpoint", str(path), "--data", "synthetic", "--num-images", "64"]
    with pytest.raises(SystemExit) as refused:
        visualize.main([*command, "--out", str(tmp_path / "d.png")])
    maps = 4 * 2 * 64 * 4 * 17**2  # fp32, 2 layers x (64 images, 4 heads, 17 x 17 tokens)
    assert str(refused.value) == (
        f"--num-images 64: 64 images' attention maps needs {size.readable(maps)}, more than this machine's "
        f"{size.readable(size.machine_memory())} of memory; give fewer"
    )


def _npz_member(shape: tuple[int, ...], data: bytes = b"", descr: str = "<f4") -> bytes:
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
    return header.getvalue() + data


@QUICKLY
@pytest.mark.parametrize(
    ("member", "said"),
    [
        (
            _npz_member((10**12,), b"\0" * 64),
            r"embedding/kernel: its header claims shape \(1000000000000,\) of float32, 4\.0 TB, but the file "
            r"holds 64\.0 bytes",
        ),
        (_npz_member((1,), b"\0" * 8, descr="|O"), r"embedding/kernel: an array of pickled objects, not numbers"),
    ],
)
def test_a_jax_array_header_claiming_more_than_its_file_holds_is_refused_unread(tmp_path, member, said):
    path = tmp_path / "w.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("embedding/kernel.npy", member)
    with pytest.raises(CheckpointError, match=rf"^{_at(path)}: .*{said}"):
        load(path, config=preset_config("vit_fashion_mnist"))
    path.write_bytes(b"not a zip archive")
    with pytest.raises(CheckpointError, match=rf"^{_at(path)}: not a readable \.npz file \(File is not a zip file\)"):
        load(path, config=preset_config("vit_fashion_mnist"))


# entries of the wrong kind --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("id2label", "said"),
    [
        (["a", "b", "c"], r"id2label holds an array, not a mapping of class indices to names"),
        ("abc", r"id2label holds a string, not a mapping of class indices to names"),
        ({"x": "a", "1": "b", "2": "c"}, r"id2label\['x'\]='a' is not a class index and its name"),
        ({"0": 5, "1": "b", "2": "c"}, r"id2label\['0'\]=5 is not a class index and its name"),
    ],
)
def test_a_hugging_face_id2label_that_is_not_a_mapping_of_names_is_named(tmp_path, id2label, said):
    folder = _hf_folder(tmp_path / "hf", id2label=id2label)
    with pytest.raises(CheckpointError, match=rf"^{_at(folder)}: config\.json: {said}$"):
        load(folder)


@pytest.mark.parametrize(
    ("folder_of", "weights"),
    [("hf", "pytorch_model.bin"), ("timm", "pytorch_model.bin"), ("open_clip", "open_clip_pytorch_model.bin")],
)
def test_a_pickled_weights_file_holding_something_else_than_tensors_is_named(tmp_path, folder_of, weights):
    if folder_of == "open_clip":
        folder, state = tmp_path / "clip", {"visual.conv1.weight": torch.zeros(32, 3, 4, 4)}
        folder.mkdir()
        (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": {}, "preprocess_cfg": {}}))
    else:
        folder = (_hf_folder if folder_of == "hf" else _timm_folder)(tmp_path / folder_of)
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        (folder / "model.safetensors").unlink()
    torch.save({**state, "extra": [1, 2, 3]}, folder / weights)
    with pytest.raises(CheckpointError, match=rf"^{_at(folder / weights)}: extra is not a tensor \(a Python list\)$"):
        load(folder)
    torch.save({**state, 7: torch.zeros(1)}, folder / weights)
    with pytest.raises(
        CheckpointError, match=rf"^{_at(folder / weights)}: an entry is named 7, a int, not a weight's name"
    ):
        load(folder)


@pytest.mark.parametrize("key", ["vit_config", "data_facts", "test_time_views"])
@pytest.mark.parametrize(
    ("value", "said"),
    [("[1, 2]", "holds an array, not a JSON object"), ("null", "holds null, not a JSON object"), ("{", "is not JSON")],
)
def test_an_exported_metadata_entry_that_is_not_a_json_object_is_named(tmp_path, key, value, said):
    path = _exported(tmp_path / "m.safetensors")
    _edit_metadata(path, **{key: value})
    with pytest.raises(CheckpointError, match=rf"^{_at(path)}: its metadata {key} {said}"):
        load(path)


def _nested(depth: int) -> str:
    return '{"a": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


@QUICKLY
@pytest.mark.parametrize("kind", ["timm", "hugging_face", "open_clip", "export"])
def test_a_config_nested_past_pythons_recursion_limit_is_named(tmp_path, kind):
    """json.loads raised RecursionError, a traceback, on 100,000 nested arrays in a 200-KB config.json."""
    deep = _nested(100_000)
    if kind == "export":
        path, file = _exported(tmp_path / "m.safetensors"), "its metadata data_facts"
        _edit_metadata(path, data_facts=deep)
    else:
        path, file = tmp_path / kind, "open_clip_config.json" if kind == "open_clip" else "config.json"
        {"timm": _timm_folder, "hugging_face": _hf_folder, "open_clip": Path.mkdir}[kind](path)
        (path / file).write_text(deep)
    with pytest.raises(CheckpointError) as refused:
        load(path)
    assert str(refused.value) == f"{path}: {file} nests arrays or objects more than 32 deep, which no config does"


def test_json_deeper_than_any_config_is_refused_by_its_depth():
    assert parse_json(_nested(MAX_JSON_DEPTH), "x") == json.loads(_nested(MAX_JSON_DEPTH))
    with pytest.raises(ValueError, match=r"^x nests arrays or objects more than 32 deep"):
        parse_json(_nested(MAX_JSON_DEPTH + 1), "x")


def test_a_bare_state_dict_with_names_that_are_not_strings_is_read_by_its_named_weights(tmp_path):
    path = tmp_path / "w.pth"
    torch.save({7: torch.zeros(1), "extra": "x"}, path)
    with pytest.raises(CheckpointError, match=rf"^{_at(path)}: not a ViT checkpoint of a known kind"):
        load(path)


def _with_checkpoint_path(tmp_path: Path) -> tuple[Path, Path]:
    """A timm folder whose model_args would have timm read another file: here one that would fail loudly."""
    elsewhere = tmp_path / "elsewhere.pth"
    torch.save({"not": "weights"}, elsewhere)
    return _timm_folder(tmp_path / "timm", checkpoint_path=str(elsewhere)), elsewhere


def test_a_timm_config_naming_a_checkpoint_path_is_refused_not_followed(tmp_path):
    folder, elsewhere = _with_checkpoint_path(tmp_path)
    said = rf"config\.json: model_args\.checkpoint_path='{_at(elsewhere)}' would have timm load weights other than"
    with pytest.raises(CheckpointError, match=rf"^{_at(folder)}: {said} the folder's own model\.safetensors"):
        load(folder)


@pytest.mark.slow  # ~8 s: train.py processes
def test_train_py_names_a_timm_config_naming_a_checkpoint_path(tmp_path):
    """It printed 'error: ' and nothing else: timm followed the path and raised a FileNotFoundError without words."""
    folder, elsewhere = _with_checkpoint_path(tmp_path)
    elsewhere.unlink()
    run = run_train_py(
        "data=synthetic", f"model.pretrained={folder}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path
    )
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: {folder}: config.json: model_args.checkpoint_path='{elsewhere}' would have timm load weights"
        )
    )
