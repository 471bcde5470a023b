"""The resolvers conf/ names, registered by one call, `register_resolvers`, which train.py (and every other
composer of conf/train.yaml) makes before Hydra composes a config: sweep job folder names, and the class counts
the data groups read from the data, so that nobody types data.num_classes."""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import OmegaConf

from vit.data.encoded.folders import count_classes
from vit.data.encoded.shard_info import count_classes as count_shard_classes
from vit.model import ConfigError
from vit.training.job_folder import JOB_FOLDER, job_folder
from vit.training.objective import direction

CLASS_FOLDERS = "vit.class_folders"  # conf/data/imagefolder.yaml: train_dir's class folders, or data.labels' classes
DATASET_CLASSES = "vit.dataset_classes"  # conf/data/{cifar*,fashion_mnist*}.yaml: the dataset's, or class_subset's
HF_CLASSES = "vit.hf_classes"  # conf/data/hf.yaml: the classes of the label column of the dataset at data.root
SHARD_CLASSES = "vit.shard_classes"  # conf/data/stream.yaml: the classes shards.json at data.root names
REQUIRED = "vit.required"  # conf/experiment/finetune_*.yaml: a value the command line must give (model.pretrained)
SEARCH_DIRECTION = "vit.search_direction"  # conf/hparams_search/optuna.yaml: the task's, maximize or minimize


def dataset_classes(target: str, class_subset: list[int] | None) -> int:
    """The classes of an in-memory dataset (`target`, its data module) that a model tells apart."""
    return get_class(target).count_classes(class_subset)


def hf_classes(root: str, label_column: str | None, cache_dir: str | None) -> int:
    """The classes of a Hugging Face dataset's label column. datasets is imported here, by the runs that read one:
    imported with the resolvers it slowed the start of every run (benchmarks/NOTES.md change 40)."""
    from vit.data.encoded.hf_source import count_classes

    return count_classes(root, label_column, cache_dir)


def required(key: str) -> None:
    """A value the experiment needs from the command line. `???` cannot say so in an experiment: merged onto
    train.yaml's `model.pretrained: null` it leaves the null, and the fine-tune trained from scratch."""
    raise ConfigError(f"{key} is required by this experiment: add {key}=PATH")


def register_resolvers() -> None:
    """Make the resolvers conf/ names known to OmegaConf; call before Hydra composes a config."""
    OmegaConf.register_new_resolver(JOB_FOLDER, job_folder, replace=True)
    OmegaConf.register_new_resolver(CLASS_FOLDERS, count_classes, replace=True)
    OmegaConf.register_new_resolver(DATASET_CLASSES, dataset_classes, replace=True)
    OmegaConf.register_new_resolver(HF_CLASSES, hf_classes, replace=True)
    OmegaConf.register_new_resolver(REQUIRED, required, replace=True)
    OmegaConf.register_new_resolver(SEARCH_DIRECTION, direction, replace=True)
    OmegaConf.register_new_resolver(
        SHARD_CLASSES, lambda root, options: count_shard_classes(root, OmegaConf.to_container(options)), replace=True
    )
