"""Pretrained weights by hub name: hf-hub:ORG/REPO[@REVISION] read through huggingface_hub's cache, which the tests
write by hand in its own layout (no network, ever: offline mode), and torchvision:ARCH[.WEIGHTS] through torch.hub's
cache. A name gives the model its folder gives, says which repo, commit and files it came from, and a name the cache
lacks is one line naming the repo and the cache."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import pytest
import timm
import torch
import torchvision
from timm.models import save_for_hf

from tests.helpers import perturb_
from vit.checkpoint import CheckpointError, load

COMMIT, OTHER_COMMIT = "1" * 40, "2" * 40
SMALL = dict(embed_dim=64, depth=1, num_heads=4, patch_size=8, img_size=32, num_classes=5)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """huggingface_hub's cache in tmp_path, offline: what it reads at call time, and the environment a process
    started from the test would read."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def cache_repo(cache: Path, repo: str, folder: Path, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """folder's files as huggingface_hub keeps a download of `repo` at `commit`: blobs, the snapshot's links to
    them, and the ref (a branch or tag) naming the commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for path in folder.iterdir():
        blob = root / "blobs" / f"{commit[:8]}-{path.name}"
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(blob)
    if ref is not None:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


def timm_folder(folder: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    model = perturb_(timm.create_model("vit_base_patch16_224", pretrained=False, **SMALL), std=0.05)
    save_for_hf(model, str(folder), safe_serialization=True)
    return folder


def _logits(loaded, images):
    with torch.no_grad():
        return loaded.model(images)


def test_a_timm_repo_by_name_is_the_folder_it_names_and_says_where_it_came_from(tmp_path, hub_cache):
    folder = timm_folder(tmp_path / "folder")
    cache_repo(hub_cache, "timm/vit_tiny_test", folder)
    by_name, by_folder = load("hf-hub:timm/vit_tiny_test"), load(folder)
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_logits(by_name, images), _logits(by_folder, images), atol=0, rtol=0)
    assert by_name.config == by_folder.config and by_name.crop_pct == by_folder.crop_pct
    assert by_name.source == {
        "name": "hf-hub:timm/vit_tiny_test",
        "repo": "timm/vit_tiny_test",
        "revision": COMMIT,
        "files": ["config.json", "model.safetensors"],
    }


def test_a_revision_pins_a_tag_or_a_commit(tmp_path, hub_cache):
    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "main"))
    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "v1", seed=1), OTHER_COMMIT, ref="v1")
    images = torch.randn(2, 3, 32, 32)
    latest, tagged, pinned = (load(f"hf-hub:timm/vit_tiny_test{at}") for at in ("", "@v1", f"@{OTHER_COMMIT}"))
    assert (latest.source["revision"], tagged.source["revision"], pinned.source["revision"]) == (
        COMMIT,
        OTHER_COMMIT,
        OTHER_COMMIT,
    )
    torch.testing.assert_close(_logits(tagged, images), _logits(load(tmp_path / "v1"), images), atol=0, rtol=0)
    assert not torch.equal(_logits(latest, images), _logits(tagged, images))


def test_a_transformers_repo_by_name_reads_its_preprocessor_too(tmp_path, hub_cache):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8, num_labels=5,
    )  # fmt: skip
    model = perturb_(transformers.ViTForImageClassification(config), std=0.05).eval()
    model.save_pretrained(tmp_path / "folder")
    processor = dict(image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6], do_normalize=True)
    (tmp_path / "folder" / "preprocessor_config.json").write_text(json.dumps(processor))
    cache_repo(hub_cache, "google/vit-tiny-test", tmp_path / "folder")
    loaded = load("hf-hub:google/vit-tiny-test")
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_logits(loaded, images), model(pixel_values=images).logits, atol=1e-5, rtol=0)
    assert loaded.mean == (0.1, 0.2, 0.3) and loaded.std == (0.4, 0.5, 0.6)
    assert loaded.source["files"] == ["config.json", "model.safetensors", "preprocessor_config.json"]


def test_a_local_path_that_exists_wins_over_the_name(tmp_path, hub_cache, monkeypatch):
    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "cached"))
    monkeypatch.chdir(tmp_path)
    timm_folder(tmp_path / "hf-hub:timm" / "vit_tiny_test", seed=3)  # a folder spelled like the name
    images = torch.randn(2, 3, 32, 32)
    local = load("hf-hub:timm/vit_tiny_test")
    assert local.source is None
    torch.testing.assert_close(_logits(local, images), _logits(load(tmp_path / "hf-hub:timm/vit_tiny_test"), images))


@pytest.mark.parametrize(
    "name, said",
    [
        ("hf-hub:timm/not_cached", r"^hf-hub:timm/not_cached: not in the Hugging Face cache \(cache: .*hf_cache; "
         r"HF_HUB_OFFLINE is set\): download timm/not_cached once where the hub can be reached$"),
        ("hf-hub:timm/vit_tiny_test@v9", r"^hf-hub:timm/vit_tiny_test@v9: not in the Hugging Face cache .* at v9 "),
        ("hf-hub:vit_tiny_test", r"^hf-hub:vit_tiny_test: a Hugging Face name is hf-hub:ORG/REPO"),
        # huggingface_hub's HFValidationError was a traceback; a revision with .. was a path in the cache
        ("hf-hub:../x", r"^hf-hub:\.\./x: not a Hugging Face repo name \(Repo id must use alphanumeric chars"),
        ("hf-hub:x/..", r"^hf-hub:x/\.\.: not a Hugging Face repo name \(Repo id must"),
        ("hf-hub:timm/vit_tiny_test@../../x", r"^hf-hub:timm/vit_tiny_test@(\.\./){2}x: '(\.\./){2}x' is not a branch, "
         r"tag or commit name$"),
        ("torchvision:resnet50", r"^torchvision:resnet50: torchvision's ViTs are vit_b_16, "),
        ("torchvision:vit_b_16.IMAGENET9K", r"^torchvision:vit_b_16.IMAGENET9K: torchvision's vit_b_16 has no weights "
         r"IMAGENET9K \(it has IMAGENET1K_V1, IMAGENET1K_SWAG_E2E_V1, IMAGENET1K_SWAG_LINEAR_V1\)$"),
    ],
)  # fmt: skip
def test_a_name_that_cannot_be_had_is_one_line_naming_it(tmp_path, hub_cache, name, said):
    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "folder"))
    with pytest.raises(CheckpointError, match=said) as refused:
        load(name)
    assert "\n" not in str(refused.value)


@pytest.fixture
def unreachable_hub(hub_cache, monkeypatch):
    """Online, with HF_ENDPOINT a closed port on this machine: the hub cannot be reached, as with the network down."""
    from huggingface_hub import constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)  # and the URL template huggingface_hub built from it
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    return hub_cache


def test_a_cached_name_loads_at_once_when_the_hub_cannot_be_reached(tmp_path, unreachable_hub):
    """huggingface_hub retried each file the cache lacks (the configs a timm repo does not have): 52 s before it
    loaded from the cache."""
    cache_repo(unreachable_hub, "timm/vit_tiny_test", timm_folder(tmp_path / "folder"))
    start = time.perf_counter()
    loaded = load("hf-hub:timm/vit_tiny_test")
    assert time.perf_counter() - start < 3
    assert loaded.source["revision"] == COMMIT and loaded.source["files"] == ["config.json", "model.safetensors"]
    with pytest.raises(CheckpointError, match=r"^hf-hub:timm/other: not in the Hugging Face cache .*; the Hugging Face "
                       r"Hub could not be reached\): download timm/other once"):  # fmt: skip
        load("hf-hub:timm/other")
    assert time.perf_counter() - start < 3


@pytest.mark.parametrize("ref", ["../../../outside", "main\n" + "1" * 40])
def test_a_cached_ref_that_is_not_a_commit_hash_is_refused_naming_it(tmp_path, hub_cache, ref):
    """A ref is a path to huggingface_hub and to the cache lookup here: ../../../outside, a folder beside the cache,
    was huggingface_hub's ValueError traceback; a damaged ref, a repo 'not in the cache'."""
    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "folder"))
    timm_folder(tmp_path / "outside", seed=1)
    refs = hub_cache / "models--timm--vit_tiny_test" / "refs" / "main"
    refs.write_text(ref)
    with pytest.raises(CheckpointError) as refused:
        load("hf-hub:timm/vit_tiny_test")
    assert str(refused.value) == f"{refs}: a ref of the Hugging Face cache holds {ref!r}, not a commit hash"


def _torchvision_b16(hidden_dim=768):
    """torchvision's vit_b_16 as its width says it (12 heads), one layer and a 32-px input: its file stays small."""
    values = dict(image_size=32, patch_size=16, num_layers=1, num_heads=12, hidden_dim=hidden_dim, mlp_dim=64)
    return perturb_(torchvision.models.vision_transformer.VisionTransformer(**values), std=0.02).eval()


def test_torchvision_weights_by_name_read_torch_hubs_cache_with_their_framing_and_classes(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "torch_hub"))
    theirs = _torchvision_b16()
    weights = torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1
    cached = tmp_path / "torch_hub" / "checkpoints" / Path(weights.url).name
    cached.parent.mkdir(parents=True)
    torch.save(theirs.state_dict(), cached)
    loaded = load("torchvision:vit_b_16")  # its DEFAULT weights, IMAGENET1K_V1
    images = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_logits(loaded, images), theirs(images), atol=1e-5, rtol=0)
    assert (loaded.crop_pct, loaded.interpolation) == (224 / 256, "bilinear")
    assert loaded.mean == (0.485, 0.456, 0.406) and loaded.classes[:2] == ("tench", "goldfish")
    assert loaded.source["weights"] == "ViT_B_16_Weights.IMAGENET1K_V1" and loaded.source["url"] == weights.url


def test_torchvision_weights_not_cached_and_not_downloadable_are_one_line(tmp_path, monkeypatch):
    from urllib.error import URLError

    monkeypatch.setattr(torch.hub, "_hub_dir", str(tmp_path / "torch_hub"))

    def offline(*args, **kwargs):
        raise URLError("no network")

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", offline)  # what torchvision's weights download with
    said = (
        r"^torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1: not in torch.hub's cache \(.*torch_hub/checkpoints\) and "
        r"https://download.pytorch.org/.* could not be downloaded"
    )
    with pytest.raises(CheckpointError, match=said):
        load("torchvision:vit_b_16.IMAGENET1K_SWAG_E2E_V1")


@pytest.mark.slow  # a run and a train.py process: ~10 s
def test_train_py_fine_tunes_from_a_cached_name_and_records_which_weights(tmp_path, hub_cache):
    from tests.helpers import compose, run_train_py
    from vit.training.run import train

    cache_repo(hub_cache, "timm/vit_tiny_test", timm_folder(tmp_path / "folder"))
    run = ["data=synthetic", "data.img_size=32", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
           "trainer.limit_val_batches=1", "callbacks.pos_embed_figure=null"]  # fmt: skip
    results = train(compose(*run, "model.pretrained=hf-hub:timm/vit_tiny_test", f"output_dir={tmp_path / 'run'}"))
    recorded = {"name": "hf-hub:timm/vit_tiny_test", "repo": "timm/vit_tiny_test", "revision": COMMIT}
    assert results["pretrained_from"] | recorded == results["pretrained_from"]
    saved = torch.load(results["best_checkpoint"], weights_only=True)
    assert saved["hyper_parameters"]["pretrained_from"] == results["pretrained_from"]
    assert load(results["best_checkpoint"]).config.embed_dim == SMALL["embed_dim"]  # the named network, fine-tuned
    # a name the cache lacks, offline: one line through train.py
    lacking = run_train_py(*run, "model.pretrained=hf-hub:timm/not_cached", "hydra.run.dir=lacking", cwd=tmp_path)
    assert lacking.returncode == 1, lacking.stderr[-2000:]
    assert (
        lacking.stderr.strip()
        .splitlines()[-1]
        .startswith("error: hf-hub:timm/not_cached: not in the Hugging Face cache (cache: ")
    )
