"""Mixup and CutMix (Zhang et al. 2018, Yun et al. 2019) as timm's Mixup mixes a batch: `mixup: {...}` in a run's
config (null: none), its arguments checked once here, with timm's defaults for those not given."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from timm.data import Mixup

from vit.model.config import ConfigError

RATES = {"mixup_alpha": math.inf, "cutmix_alpha": math.inf, "prob": 1, "switch_prob": 1}  # each in [0, its most]


@dataclass(frozen=True)
class MixupConfig:
    """timm.data.Mixup's arguments but the label smoothing and class count, which the run gives it."""

    mixup_alpha: float = 1.0  # Beta(α, α) of the mixing weight; 0: no Mixup
    cutmix_alpha: float = 0.0  # the same for CutMix's box; 0: no CutMix
    cutmix_minmax: tuple[float, float] | None = None  # CutMix's box as a share of the image, instead of cutmix_alpha
    prob: float = 1.0  # of mixing a batch at all
    switch_prob: float = 0.5  # of CutMix rather than Mixup where both are on
    mode: str = "batch"  # 'batch', 'pair' or 'elem': one weight for the batch, a pair, or each image
    correct_lam: bool = True  # CutMix's weight from the box as clipped by the image's borders

    def __post_init__(self) -> None:
        """timm's Mixup compares its arguments as it is built (a TypeError for mixup_alpha=abc, a bare
        AssertionError for cutmix_minmax=[0.2]) or at the first step (an AssertionError when nothing would be
        mixed), and takes prob=2 or NaN without a word."""
        for key, most in RATES.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= most:
                allowed = ">= 0" if most == math.inf else f"in [0, {most}]"
                raise ConfigError(f"mixup.{key}={value!r}: must be a number {allowed}")
        if not (self.mixup_alpha or self.cutmix_alpha or self.cutmix_minmax):
            raise ConfigError("mixup: mixes nothing (mixup_alpha and cutmix_alpha 0): raise one, or set mixup=null")
        try:
            Mixup(**self.arguments(), num_classes=2)
        except (AssertionError, TypeError, ValueError) as err:
            reason = str(err) or "cutmix_minmax must be [low, high]"  # its one bare assert
            defaults = {f.name: f.default for f in fields(self)}
            given = {k: v for k, v in self.arguments().items() if v != defaults[k]}  # what the config said
            raise ConfigError(f"mixup={given}: timm's Mixup refuses it ({reason})") from None

    @staticmethod
    def of(values: Mapping[str, Any] | None) -> MixupConfig | None:
        """From the config's mapping (None: no mixing), naming a key timm's Mixup does not take."""
        if values is None:
            return None
        known = [f.name for f in fields(MixupConfig)]
        if unknown := sorted(set(values) - set(known)):
            raise ConfigError(
                f"{', '.join(f'mixup.{k}' for k in unknown)}: not a setting of Mixup; drop it with "
                f"{' '.join(f'~mixup.{k}' for k in unknown)}; its settings: {', '.join(known)} (label_smoothing and "
                "num_classes come from the run)"
            )
        pairs = {k: tuple(v) for k, v in values.items() if k == "cutmix_minmax" and isinstance(v, (list, tuple))}
        return MixupConfig(**{**values, **pairs})

    def arguments(self) -> dict[str, Any]:
        """timm.data.Mixup's keyword arguments."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
