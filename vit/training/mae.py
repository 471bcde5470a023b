"""task=mae: masked-autoencoder pretraining (He et al. 2022) on images without their labels. Each image keeps a random
⌊(1 - r) N⌋ of its patches (task.mask_ratio r, 0.75); the encoder, the run's network, reads those alone
(VisionTransformer.forward_features with `keep`); a light decoder (vit/model/mae.py, task.decoder_dim, _depth and
_heads, by default scaled to the encoder) reconstructs every patch, and the loss is the mean squared error of the
masked patches' pixels, each patch normalised by its own mean and variance (task.norm_pix).

The decoder is the task's: it learns with the network and is saved in the run's checkpoints beside it (task.decoder.*),
so that a run continued from one (model.pretrained with task=mae) starts from both, while a fine-tuning run reads the
network alone (vit.checkpoint.load keeps the model.* weights). A run continued from a Hugging Face ViTMAEForPreTraining
folder starts from its decoder too (vit/interop/hugging_face/mae_decoder.py): its width, depth and heads where the
run leaves task.decoder_dim, _depth and _heads null; a size the run states otherwise, or task.norm_pix against the
folder's norm_pix_loss, is refused in one line, as continuing that decoder would relearn it. The network's head is not
built (num_classes=0): it would learn nothing here.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor
from torchmetrics import MeanMetric, Metric

from vit.interop.files import CheckpointError, read
from vit.interop.hugging_face.mae_decoder import FolderDecoder, mae_decoder
from vit.model import kernels
from vit.model.config import ConfigError, ViTConfig
from vit.model.mae import MAEDecoder, masked_loss, patch_targets, unpatchify
from vit.model.masking import random_keep
from vit.model.size import check_fits, weight_bytes
from vit.training.task import STAGES, TEST_LOSS, VAL_LOSS, Task, best_key

if TYPE_CHECKING:
    from vit.training.tasks import TaskConfig

log = logging.getLogger(__name__)
DECODER = "task.decoder."  # its weights' prefix in a run's checkpoint


def decoder_sizes(encoder: ViTConfig, dim: int | None, depth: int | None, heads: int | None) -> tuple[int, int, int]:
    """The decoder's width, depth and heads; those not given scaled to the encoder: half its width (a multiple of
    4, for the decoder's sincos2d table), two thirds of its depth up to MAE's 8, heads of 64 dims (at least one)."""
    dim = dim or max(16, encoder.embed_dim // 2 // 4 * 4)
    depth = depth or min(8, max(1, 2 * encoder.depth // 3))
    heads = heads or max(1, dim // 64)
    return dim, depth, heads


def check_mae_settings(mask_ratio: float, dim: int | None, depth: int | None, heads: int | None) -> None:
    """task.mask_ratio and the decoder's sizes, one line naming the key (the decoder's memory: MaskedAutoencoder)."""
    if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, (int, float)) or not 0 < mask_ratio < 1:
        raise ConfigError(f"task.mask_ratio={mask_ratio!r}: the share of each image's patches masked, in (0, 1)")
    for key, value in (("decoder_dim", dim), ("decoder_depth", depth), ("decoder_heads", heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"task.{key}={value!r}: a whole number >= 1, or null for the encoder's scale")


def _check_decoder(encoder: ViTConfig, dim: int, depth: int, heads: int) -> None:
    """The decoder the encoder gets, and what it cannot pretrain, before anything is built."""
    if dim % 4 or dim % heads:
        raise ConfigError(
            f"task.decoder_dim={dim} must be divisible by 4 (its sincos2d table) and by task.decoder_heads={heads}"
        )
    if encoder.pool == "map" or encoder.final_norm == "pooled":
        raise ConfigError(
            f"task=mae with model.pool={encoder.pool} model.final_norm={encoder.final_norm}: the decoder reads the "
            "encoder's tokens, so what pools them would never learn here; pretrain with pool=token or avg and "
            "final_norm=tokens (fine-tuning may pool otherwise)"
        )
    layer = replace(encoder, embed_dim=dim, depth=1, num_heads=heads, kv_heads=None, num_classes=0)
    check_fits(depth * weight_bytes(layer) * 4, f"task.decoder_dim={dim}, task.decoder_depth={depth}: the decoder")


class Reconstruction(NamedTuple):
    """A batch's reconstruction: every patch's pixels (B, N, p_h p_w C), their targets, and the patches the encoder
    saw (B, n)."""

    pixels: Tensor
    target: Tensor
    keep: Tensor


class MaskedAutoencoder(Task):
    """The mae task's answers to the module (vit/training/task.py): its own forward (the encoder on the visible
    patches, then the decoder), the masked-patch loss as the validation metric (lower is better), and the decoder's
    weights from a pretrained MAE checkpoint."""

    monitor, mode, learns_labels = VAL_LOSS, "min", False

    def __init__(self, config: TaskConfig, network: ViTConfig, label_smoothing: float = 0.0, mixup: Any = None):
        super().__init__()
        if mixup is not None:
            raise ConfigError("task=mae with mixup: the images are the targets, and mixing them reconstructs a blend")
        sizes = decoder_sizes(network, config.decoder_dim, config.decoder_depth, config.decoder_heads)
        _check_decoder(network, *sizes)
        self.encoder, self.mask_ratio, self.norm_pix = network, config.mask_ratio, config.norm_pix
        self.stated = {"decoder_dim": config.decoder_dim, "decoder_depth": config.decoder_depth,
                       "decoder_heads": config.decoder_heads}  # fmt: skip
        self.continued: dict[str, int] = {}  # the sizes of a Hugging Face folder's decoder, where it continues one
        self.compiled = False  # compile=true: compile() ran as the module was built, before start_from
        self.decoder = MAEDecoder(network, *sizes)
        self.losses = torch.nn.ModuleDict({stage: MeanMetric() for stage in STAGES})

    @staticmethod
    def network(config: ViTConfig) -> ViTConfig:
        """The encoder the run builds: its head left out."""
        return replace(config, num_classes=0)

    def compile(self, module: Any) -> bool:
        """Each encoder layer and the decoder: outputs runs the encoder through forward_features on each batch's
        visible patches, never the network's compiled forward; the masking's gathers stay eager."""
        for layer in module.model.layers:
            layer.compile()
        self.decoder.compile()
        self.compiled = True
        return True

    def mix(self, images: Tensor, labels: Any) -> tuple[Tensor, Any]:
        return images, labels  # the target is the image itself (outputs); the labels are not read

    def outputs(self, module: Any, images: Tensor, evaluation_batch: int | None = None) -> Reconstruction:
        """A random mask an image (from torch's random state in training; in evaluation from the batch's index, so
        that every validation scores the same masks), the encoder on the visible patches, the decoder on its tokens."""
        (ph, pw), n = self.encoder.patch_size, self.encoder.num_patches
        generator = None if evaluation_batch is None else torch.Generator().manual_seed(evaluation_batch)
        keep = random_keep(len(images), n, self.mask_ratio, generator=generator).to(images.device)
        latent = module.model.forward_features(images, keep=keep)
        grid = (images.shape[-2] // ph, images.shape[-1] // pw)
        target = patch_targets(images, (ph, pw), self.norm_pix)
        return Reconstruction(self.decoder(latent, keep, grid), target, keep)

    @torch.no_grad()
    def panels(self, module: Any, images: Tensor, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
        """The MAE paper's Fig. 2 for a batch of model inputs (B, C, H, W), each (B, C, H, W) as the inputs are
        normalised: the masked images (each masked patch 0, the data's mean), the reconstructions (each patch's
        predicted pixels, where norm_pix brought back by the original patch's own mean and variance), and the
        reconstructions with the visible patches pasted back. The masks are validation's of batch `seed`."""
        out = self.outputs(module, images, evaluation_batch=seed)
        patch, channels = self.encoder.patch_size, images.shape[1]
        grid = (images.shape[-2] // patch[0], images.shape[-1] // patch[1])
        original, predicted = kernels.patchify(images.float(), patch), out.pixels.float()  # (B, N, C p_h p_w)
        if self.norm_pix:  # patch_targets' normalisation undone with the patch's own statistics
            mean, var = original.mean(dim=-1, keepdim=True), original.var(dim=-1, keepdim=True)
            predicted = predicted * (var + 1e-6) ** 0.5 + mean
        seen = torch.zeros((*original.shape[:2], 1), device=images.device).scatter(1, out.keep[..., None], 1.0)
        masked, pasted = original * seen, original * seen + predicted * (1 - seen)
        return tuple(unpatchify(x, patch, grid, channels) for x in (masked, predicted, pasted))

    def loss(self, outputs: Reconstruction, targets: Any) -> Tensor:
        return masked_loss(outputs.pixels, outputs.target, outputs.keep)

    def evaluate(self, stage: str, outputs: Reconstruction, labels: Any) -> dict[str, Metric]:
        self.losses[stage](self.loss(outputs, None), len(outputs.keep))
        return {f"{stage}/loss": self.losses[stage]}

    def results(self, tested: dict[str, float], best: float | None) -> dict[str, Any]:
        return {"test_loss": tested.get(TEST_LOSS), best_key(self.monitor): best}

    def _fits(self, state: dict[str, Any]) -> dict[str, Tensor] | None:
        """The decoder's weights in a checkpoint's state_dict, where it holds a decoder of this shape."""
        weights = {k.removeprefix(DECODER): v for k, v in state.items() if k.startswith(DECODER)}
        own = self.decoder.state_dict()
        return weights if weights.keys() == own.keys() and all(weights[k].shape == own[k].shape for k in own) else None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The sizes of a decoder continued from a Hugging Face folder, over the record's (null: the encoder's
        scale), so that what rebuilds the task from the record (ViTClassifier.load_from_checkpoint) builds this one."""
        record = checkpoint.get("hyper_parameters", {}).get("task")
        if self.continued and isinstance(record, dict):
            record.update(self.continued)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The run's own checkpoint, read for evaluation (ViTClassifier.load_from_checkpoint): its decoder."""
        if (weights := self._fits(checkpoint.get("state_dict", {}))) is not None:
            self.decoder.load_state_dict(weights)

    def start_from(self, path: str | Path) -> None:
        """A run continued from an MAE run's checkpoint starts its decoder there too, where the file has one of
        this shape, and from a Hugging Face ViTMAEForPreTraining folder's decoder (_continue); else the decoder starts
        fresh, as a run from any other network's weights does."""
        if Path(path).is_dir():
            try:
                found = mae_decoder(Path(path), self.encoder)
            except ValueError as err:
                raise CheckpointError(str(err)) from None
            if found is not None and found.channels == self.encoder.in_chans:
                self._continue(found, path)
                return
            if found is not None:
                why = f"{path}'s predicts {found.channels} channels, the images have {self.encoder.in_chans}"
                log.info("task=mae: the decoder starts fresh (%s)", why)
                return
        try:
            state = read(path).get("state_dict", {})
        except Exception:  # not a training checkpoint of ours (a hub folder, a timm file): no decoder in it
            state = {}
        if (weights := self._fits(state)) is not None:
            self.decoder.load_state_dict(weights)
            log.info("task=mae: the decoder continues from %s", path)
        else:
            log.info("task=mae: the decoder starts fresh (%s holds none of this shape)", path)

    def _continue(self, found: FolderDecoder, path: str | Path) -> None:
        """The folder's decoder, its sizes where the run's are null; a stated setting it contradicts refused."""
        theirs = {"decoder_dim": found.dim, "decoder_depth": found.depth, "decoder_heads": found.heads}
        for key, value in self.stated.items():
            if value is not None and value != theirs[key]:
                raise ConfigError(
                    f"task.{key}={value}: {path}'s MAE decoder has {theirs[key]}; leave task.{key} null to continue it"
                )
        if self.norm_pix != found.norm_pix:
            raise ConfigError(
                f"task.norm_pix={str(self.norm_pix).lower()}: {path}'s MAE decoder learnt with norm_pix_loss="
                f"{str(found.norm_pix).lower()}; set task.norm_pix={str(found.norm_pix).lower()} to continue it"
            )
        _check_decoder(self.encoder, found.dim, found.depth, found.heads)
        self.continued = theirs
        self.decoder = MAEDecoder(self.encoder, found.dim, found.depth, found.heads)
        self.decoder.load_state_dict(found.weights)
        if self.compiled:
            self.decoder.compile()
        log.info("task=mae: the decoder continues from %s (D=%d, %d layers, %d heads)", path, *theirs.values())
