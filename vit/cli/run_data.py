"""The data a run was tested on, for the command lines that evaluate its checkpoint again (visualize confusion) or
calibrate its int8 export (export --quantize int8-static): the data config that the run folder's config.yaml records
beside the checkpoint (RUN/checkpoints/CKPT beside RUN/config.yaml), or train.py's data group where `data=NAME` is
given; either with `data.KEY=VALUE` over it. Images are read at the model's size and normalised with the
checkpoint's statistics, as its evaluation read them; every mistake is one line (a ValueError) naming the override,
the file or the key."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException, InstantiationException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from vit.data.loading import SplitDataModule
from vit.interop.finetune import pretrained_normalization
from vit.interop.load import Loaded
from vit.model import ConfigError
from vit.model.presets import conf_dir
from vit.training.checks import DATA_FAULTS, data_fault
from vit.training.data_checks import check_data_values
from vit.training.registry import register
from vit.training.run import instantiate_setting
from vit.training.run_folder import CHECKPOINT_DIR, RUN_CONFIG


def run_config(checkpoint: Path) -> Path | None:
    """The config.yaml of the run whose checkpoints/ holds `checkpoint`, where there is one."""
    path = checkpoint.parent.parent / RUN_CONFIG
    return path if checkpoint.parent.name == CHECKPOINT_DIR and path.is_file() else None


def data_config(checkpoint: Path, overrides: Sequence[str]) -> DictConfig:
    """The data group to test on: the run's (run_config), or train.py's with data=NAME; data.KEY=VALUE over it."""
    if wrong := [o for o in overrides if not o.startswith(("data=", "data."))]:
        raise ConfigError(f"{wrong[0]}: give the data to test on as data=NAME and data.KEY=VALUE")
    register()  # the data configs count their classes through its resolvers
    try:
        if any(o.startswith("data=") for o in overrides):
            with initialize_config_dir(str(conf_dir()), version_base="1.3"):
                data = compose("train", overrides=list(overrides)).data
        else:
            if (path := run_config(checkpoint)) is None:
                raise ConfigError(
                    f"{checkpoint}: no {RUN_CONFIG} of its run beside it (RUN/{CHECKPOINT_DIR}/CKPT and "
                    f"RUN/{RUN_CONFIG}): name the data to test on, e.g. data=cifar10 data.root=DIR"
                )
            data = OmegaConf.merge(
                OmegaConf.load(path).data, OmegaConf.from_dotlist([o.removeprefix("data.") for o in overrides])
            )
        OmegaConf.resolve(data)
    except (HydraException, OmegaConfBaseException) as err:  # the data's own line is behind OmegaConf's
        raise ConfigError(str(data_fault(err) or err).strip().splitlines()[0]) from None
    return data


def evaluation_data(checkpoint: Path, overrides: Sequence[str], loaded: Loaded) -> SplitDataModule:
    """The data module of data_config, set up for testing `loaded`'s model."""
    data = data_config(checkpoint, overrides)
    height, width = loaded.input_size or loaded.config.img_size  # an imported image processor's crop, if it has one
    if height != width and data.get("max_tokens") is None:
        raise ConfigError(f"the model reads {height}x{width} images; the data modules make square ones")
    data.img_size = height  # the model's input, as evaluation fed it
    classifies = loaded.config.num_classes > 0  # a network without a head (MAE's) reads any labels' images
    check_data_values(data, classifies=classifies)
    if classifies and data.get("num_classes") != loaded.config.num_classes:
        raise ConfigError(
            f"data.num_classes={data.get('num_classes')}, but {checkpoint} tells {loaded.config.num_classes} classes "
            f"apart: test it on the data it was trained for"
        )
    try:
        module = instantiate_setting(data, "data")
        module.patch_size = loaded.config.patch_size  # images at their own size are fitted to the network's patches
        if module.in_chans != loaded.config.in_chans:
            raise ConfigError(
                f"data.in_chans={module.in_chans}, but {checkpoint} reads {loaded.config.in_chans}-channel images"
            )
        if isinstance(stats := pretrained_normalization(loaded, module.in_chans), tuple):
            module.normalize_with(*stats)
        module.prepare_data()
        module.setup("test")
    except DATA_FAULTS as err:
        raise ValueError(str(err)) from None
    except (InstantiationException, OmegaConfBaseException) as err:
        raise ValueError(str(data_fault(err) or err.__cause__ or err).splitlines()[0]) from None
    return module


def calibration_images(checkpoint: Path, overrides: Sequence[str], loaded: Loaded, count: int) -> list[Tensor]:
    """The first `count` images of the run's validation split (data_config's), read as its evaluation read them,
    in batches of up to 32 (B, C, H, W): what a static int8 export fixes its activations' ranges on. Images the
    run neither trained on nor was tested on: the test split stays a fair measure of the quantized model."""
    data = evaluation_data(checkpoint, overrides, loaded)
    batches, seen = [], 0
    try:
        for batch in data.evaluation_loader("val"):
            images, _ = data.on_after_batch_transfer(batch, 0)
            for part in images[: count - seen].split(32):
                batches.append(part)
                seen += len(part)
            if seen == count:
                break
    except DATA_FAULTS as err:
        raise ValueError(str(err).splitlines()[0]) from None
    if not batches:
        raise ValueError(f"{checkpoint}: its run's validation split holds no image to calibrate on")
    return batches
