"""Builders shared by the tests: tiny CPU models and runs, weights moved off their initial values,
and small data files in the exact on-disk formats the loaders read."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import timm
import torch
from hydra import compose as compose_config
from hydra import initialize_config_dir
from omegaconf import DictConfig
from PIL import Image
from safetensors.torch import save_file

from vit.data.memory.fashion_mnist import DEBIAN_DIR
from vit.model.config import ViTConfig

if TYPE_CHECKING:
    from vit.training.module import ViTClassifier

needs_fashion_mnist = pytest.mark.skipif(
    not DEBIAN_DIR.is_dir(), reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
)


def tiny_config(**overrides) -> ViTConfig:
    """A 16x16 RGB, patch-4 ViT (4x4 grid, D=32, 2 layers, 4 heads of 8 dims): milliseconds per step."""
    values = dict(img_size=16, patch_size=4, in_chans=3, num_classes=5, embed_dim=32, depth=2, num_heads=4)
    return ViTConfig(**{**values, **overrides})


def classifier(
    config: ViTConfig,
    *,
    label_smoothing: float = 0.1,
    mixup: dict | None = None,
    optim: dict | None = None,
    finetune: dict | None = None,
    pretrained_from: dict | None = None,
    **kw,
) -> ViTClassifier:
    """The Lightning module of `config` classifying its num_classes (task=classify), as a run builds it; with
    `finetune` (its settings), the frozen-weight feature of a run started from `pretrained_from`."""
    from vit.interop.frozen import FinetuneConfig
    from vit.training.finetune import FrozenWeights
    from vit.training.mixup import MixupConfig
    from vit.training.module import ViTClassifier
    from vit.training.optim import OptimConfig
    from vit.training.tasks import TaskConfig

    task = TaskConfig().build(config, label_smoothing, MixupConfig.of(mixup))
    features = [FrozenWeights(FinetuneConfig.of(finetune), pretrained_from, False)] if finetune else []
    return ViTClassifier(config, task, OptimConfig.from_dict(optim or {}), features=features, **kw)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """‖a − b‖ / ‖b‖ in fp32."""
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def perturb_(module: torch.nn.Module, std: float = 0.1) -> torch.nn.Module:
    """Move every parameter off its initial value so that comparisons cannot pass on zeros and ones."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn_like(p) * std)
    return module


def hugging_face_mae(folder: Path | None = None, **values) -> torch.nn.Module:
    """transformers' ViTMAEForPreTraining on 32 x 32 images (a 4 x 4 grid of 8-pixel patches, D=64, two layers; a
    decoder of 32 dims, two layers and two heads unless `values` say otherwise), its weights moved off their initial
    values and its decoder table MAE's sin-cos one, as a pretrained folder holds it (transformers 5 builds it as
    zeros); in eval mode, saved into `folder` where given."""
    import transformers

    decoder = dict(decoder_hidden_size=32, decoder_num_hidden_layers=2, decoder_num_attention_heads=2,
                   decoder_intermediate_size=128)  # fmt: skip
    config = transformers.ViTMAEConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=32,
        patch_size=8, **decoder | values
    )  # fmt: skip
    torch.manual_seed(0)
    model = perturb_(transformers.ViTMAEForPreTraining(config), std=0.05)
    model.decoder.initialize_weights(model.vit.embeddings.patch_embeddings.num_patches)  # the table, a mask token
    if folder is not None:
        model.save_pretrained(folder)
    return model.eval()


ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"
# a one-layer model on synthetic data, as train.py overrides: a train.py run in seconds
TINY = ["data=synthetic", "model.embed_dim=32", "model.depth=1", "model.num_heads=4", "model.patch_size=4"]


# Tests check what a run does, not inductor's speed: their runs train eager (seconds, not a compile's ~20 s each)
# unless they say compile=true; the default experiment's own compile=true is checked in tests/training/test_run.py.
EAGER = "compile=false"
# the same for a train.py process, without an override that would name a sweep's job folders: torch.compile is a no-op
NO_COMPILING = {"TORCH_COMPILE_DISABLE": "1"}


def one_epoch(data: str, img_size: int, *more: str) -> list[str]:
    """train.py's overrides for one epoch of TINY's model on data=DATA of img_size-pixel images, in batches of 4
    read in the main process, without the position-embedding figure: the sources' end-to-end runs."""
    model = [o for o in TINY if not o.startswith("data=")]
    data_settings = [f"data.img_size={img_size}", "data.batch_size=4", "data.eval_batch_size=4", "data.num_workers=0"]
    return [f"data={data}", *data_settings, *more, *model, "trainer.max_epochs=1", "callbacks.pos_embed_figure=null"]


def run_train_py(*args: str, cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    """`python train.py ARGS` in a new process (one thread, eager: NO_COMPILING), as a user runs it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **NO_COMPILING}
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def compose(*overrides: str) -> DictConfig:
    """The training config as `python train.py compile=false OVERRIDES` would compose it, without Hydra's run
    folder."""
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return compose_config("train", overrides=[EAGER, *overrides])


def tiny_run(tmp_path: Path, *overrides: str) -> DictConfig:
    """A seconds-long run on synthetic data (7 batches of 64 an epoch) with a 2-layer model, writing into tmp_path."""
    return compose(
        "data=synthetic",
        "data.batch_size=64",
        "model.patch_size=4",
        "model.embed_dim=32",
        "model.depth=2",
        "model.num_heads=4",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=1",
        f"output_dir={tmp_path}",
        *overrides,
    )


def write_cifar(root: Path, kind: str = "cifar-10", per_file: int = 20) -> dict[str, np.ndarray]:
    """Files in torchvision's exact CIFAR layout (pickled dicts of uint8 rows [R | G | B]); returns the test batch."""
    folder, files, key, classes = {
        "cifar-10": ("cifar-10-batches-py", [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"], "labels", 10),
        "cifar-100": ("cifar-100-python", ["train", "test"], "fine_labels", 100),
    }[kind]
    (root / folder).mkdir(parents=True)
    rng = np.random.default_rng(0)
    batch = {}
    for name in files:
        batch = {
            "data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            key: list(rng.integers(0, classes, per_file)),
        }
        with open(root / folder / name, "wb") as f:
            pickle.dump(batch, f)
    return batch


def write_image_folder(root: Path, classes: dict[str, int], split: str, size: tuple[int, int] = (40, 48)) -> None:
    """root/split/<class>/<i>.png: solid-colour RGB images, a different colour per class."""
    for k, (name, count) in enumerate(sorted(classes.items())):
        folder = root / split / name
        folder.mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", size, (40 * k % 256, 100, 200 - 10 * i)).save(folder / f"{i}.png")


def write_vit_jax_npz(model: torch.nn.Module, path: Path) -> None:
    """A timm VisionTransformer's weights in the original ViT's .npz layout (google-research/vision_transformer:
    Flax kernels as (in, out), convolutions as HWIO, attention split per head), the layout timm's
    `_load_weights` reads. Written by hand here because no library exports it."""
    s = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    heads = model.blocks[0].attn.num_heads
    dim = s["cls_token"].shape[-1]
    arrays = {
        "embedding/kernel": s["patch_embed.proj.weight"].transpose(2, 3, 1, 0),  # OIHW -> HWIO
        "embedding/bias": s["patch_embed.proj.bias"],
        "cls": s["cls_token"],
        "Transformer/posembed_input/pos_embedding": s["pos_embed"],
        "Transformer/encoder_norm/scale": s["norm.weight"],
        "Transformer/encoder_norm/bias": s["norm.bias"],
        "head/kernel": s["head.weight"].T,
        "head/bias": s["head.bias"],
    }
    for i in range(len(model.blocks)):
        b, j = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        mha = j + "MultiHeadDotProductAttention_1/"
        for name, w, bias in zip(
            ("query", "key", "value"),
            np.split(s[b + "attn.qkv.weight"], 3),
            np.split(s[b + "attn.qkv.bias"], 3),
            strict=True,
        ):
            arrays[f"{mha}{name}/kernel"] = w.T.reshape(dim, heads, -1)  # (D, heads, head_dim)
            arrays[f"{mha}{name}/bias"] = bias.reshape(heads, -1)
        arrays[mha + "out/kernel"] = s[b + "attn.proj.weight"].reshape(dim, heads, -1).transpose(1, 2, 0)
        arrays[mha + "out/bias"] = s[b + "attn.proj.bias"]
        for flax, ours in (("LayerNorm_0", "norm1"), ("LayerNorm_2", "norm2")):
            arrays[f"{j}{flax}/scale"], arrays[f"{j}{flax}/bias"] = s[f"{b}{ours}.weight"], s[f"{b}{ours}.bias"]
        for r in range(2):
            arrays[f"{j}MlpBlock_3/Dense_{r}/kernel"] = s[f"{b}mlp.fc{r + 1}.weight"].T
            arrays[f"{j}MlpBlock_3/Dense_{r}/bias"] = s[f"{b}mlp.fc{r + 1}.bias"]
    np.savez(path, **arrays)


def write_timm(path):
    """A timm ViT whose 64 width and one head fit the vit_fashion_mnist preset (the heads come from it)."""
    model = timm.models.vision_transformer.VisionTransformer(
        img_size=32, patch_size=8, num_classes=5, embed_dim=64, depth=1, num_heads=1
    )
    save_file(model.state_dict(), str(path))
    return str(path)
