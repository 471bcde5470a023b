"""A pretrained checkpoint as the start of a fine-tuning run at another resolution, class count, channel
count or pooling: each difference handled explicitly, anything else refused with the reason.

- grid: a learned position table is resampled bicubically to the new patch grid (vit.model.pos_embed.resample);
  fixed tables are recomputed by the model itself;
- classes: a head for another number of classes is replaced by a freshly initialised one;
- channels: the patch embedding is adapted by timm's adapt_input_conv (e.g. RGB -> grayscale sums the
  colour filters);
- pooling: class token -> average pooling drops the class token and its position; average pooling ->
  class token is refused (the token would start untrained);
- width, depth, heads, MLP, patch size, norms, tokens: every other field must match: they are the pretrained
  network. `finetune_config` reads them from the file, so a fine-tuning run restates none of them.

A run starts from the file in one call, `start_from`, and fills its network with `Pretrained.fill_`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vit.interop.adapt import ARCHITECTURE, RUN_FIELDS, adapt, config_hint
from vit.interop.files import CheckpointError
from vit.interop.load import Loaded, load
from vit.model import VisionTransformer
from vit.model.config import ConfigError, ViTConfig
from vit.model.size import check_memory


@dataclass(frozen=True)
class Pretrained:
    """A fine-tuning run's start: the pretrained file as read, the network the run builds from it, and the mean and
    std its images are normalised with (or why the file cannot give them)."""

    loaded: Loaded
    config: ViTConfig  # finetune_config: the file's architecture with the run's own fields over it
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | str  # pretrained_normalization, the run's channels

    @property
    def architecture(self) -> str:
        """The file's architecture in one line (describe)."""
        return describe(self.loaded.config)

    @property
    def source(self) -> dict[str, Any]:
        """Where the weights came from, as the run's checkpoints record it: a hub name's repo, commit and files,
        or the absolute path."""
        return self.loaded.source or {"path": str(Path(self.loaded.path).resolve())}

    @property
    def resized(self) -> bool:
        """Whether the run's patch grid differs from the file's (a learned position table is resampled)."""
        return self.loaded.config.grid_size != self.config.grid_size

    def fill_(self, model: VisionTransformer) -> list[str]:
        """Fill the run's network (built from `config`) with the file's weights; a line per change made."""
        return load_pretrained_(model, self.loaded.path, self.loaded)


def start_from(path: str | Path, requested: dict[str, Any], explicit: Iterable[str] = ()) -> Pretrained:
    """Read the pretrained file at `path` (a hub name too) as the start of a run whose model fields are `requested`,
    `explicit` those its command line set (finetune_config)."""
    loaded = load(path, config=config_hint(requested))
    config = finetune_config(loaded.config, requested, explicit)
    return Pretrained(loaded, config, pretrained_normalization(loaded, config.in_chans))


def describe(config: ViTConfig) -> str:
    """One line of the architecture a checkpoint holds: sizes, then every switch away from the classic ViT."""
    c, default = config, ViTConfig()
    sizes = f"D={c.embed_dim}, {c.depth} layers, {c.num_heads} heads, MLP {c.mlp_hidden_dim}, patch {c.patch_size}"
    switches = [
        f"{f}={getattr(c, f)}" for f in ARCHITECTURE if f not in ("embed_dim", "depth", "num_heads", "mlp_ratio",
        "patch_size") and getattr(c, f) != getattr(default, f)
    ]  # fmt: skip
    return ", ".join([f"architecture read from the file: {sizes}", f"pool={c.pool}", *switches])


def finetune_config(source: ViTConfig, requested: dict[str, Any], explicit: Iterable[str] = ()) -> ViTConfig:
    """The network a fine-tuning run builds: the checkpoint's architecture with the run's own fields (RUN_FIELDS,
    from the data and the recipe) and the fields the command line set (`explicit`, e.g. pool), which adapt()
    then carries out or refuses. A preset's architecture is not applied: the file is the network."""
    own = set(RUN_FIELDS) | set(explicit)
    values = {**source.to_dict(), **{k: v for k, v in requested.items() if k in own}}
    if "pool" in own - set(RUN_FIELDS) and "class_token" not in own:
        values["class_token"] = None  # follows the pool asked for
    try:
        config = ViTConfig.from_dict(values)
    except ConfigError as err:
        raise ConfigError(
            f"the pretrained network cannot take this run's settings: {str(err).replace('ViTConfig.', 'model.')}"
        ) from None
    check_memory(config, where="model.")  # the run's image size sets the position table's
    return config


def pretrained_normalization(loaded: Loaded, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]] | str:
    """The per-channel mean and std that fine-tuning normalises images with: those the pretrained weights saw,
    as timm's resolve_data_config takes them; or, where the file cannot give them, the reason why."""
    if not loaded.stats_recorded:
        return "the file records no mean and std"
    if len(loaded.mean) != channels:
        return f"its statistics are of {len(loaded.mean)} channels, the data has {channels}"
    return loaded.mean, loaded.std


def load_pretrained_(model: VisionTransformer, path: str | Path, loaded: Loaded | None = None) -> list[str]:
    """Fill `model` with the checkpoint at `path` (read already as `loaded`, or now), adapted to model.config;
    returns what was changed."""
    loaded = loaded or load(path, config=model.config)
    try:
        weights, notes = adapt(loaded.model.state_dict(), loaded.config, model.config)
    except ValueError as err:
        raise CheckpointError(f"{path}: {err}") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    fresh = {k for k in missing if k.startswith(("head.", "head_dist."))}
    if set(missing) - fresh or unexpected:
        raise CheckpointError(
            f"{path}: after adapting, keys still do not match: missing {sorted(set(missing) - fresh)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return notes
