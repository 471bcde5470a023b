"""What a run sends to Lightning's loggers beyond metrics, each in its own way: figures, and the end of a W&B run.
And, before anything runs, whether the packages the chosen loggers import are installed."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.util import find_spec
from urllib.parse import urlparse

from hydra.utils import get_class
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger, WandbLogger
from matplotlib.figure import Figure
from omegaconf import DictConfig

from vit.figures.drawing import figure_pixels
from vit.model import ConfigError

# the packages each of Lightning's loggers can work with, the first the one to install (pip's name is the module's)
PACKAGES = {TensorBoardLogger: ("tensorboard", "tensorboardX"), WandbLogger: ("wandb",), MLFlowLogger: ("mlflow",)}
# MLflow's tracking stores in a database (its default, sqlite:///mlflow.db, among them) need SQLAlchemy, which the
# full mlflow package installs and mlflow-skinny (enough for a tracking server) does not
DATABASES = ("sqlite", "postgresql", "mysql", "mssql")


def check_logger_packages(loggers: DictConfig | None) -> None:
    """Refuse, naming the `pip install`, a logger whose package is not installed: Lightning would fail only once the
    trainer is built, in a traceback."""
    for name, node in (loggers or {}).items():
        if not node or "_target_" not in node:
            continue
        kind = get_class(node._target_)
        packages = next((packages for cls, packages in PACKAGES.items() if issubclass(kind, cls)), ())
        if packages and not any(find_spec(p) for p in packages):
            raise ConfigError(
                f"logger.{name} ({kind.__name__}) needs the {packages[0]} package: pip install {packages[0]}"
            )
        uri = node.get("tracking_uri") if issubclass(kind, MLFlowLogger) else None
        if uri and urlparse(uri).scheme.split("+")[0] in DATABASES and find_spec("sqlalchemy") is None:
            raise ConfigError(
                f"logger.{name}.tracking_uri={uri} is a database, which MLflow reads with sqlalchemy: pip install "
                "mlflow (mlflow-skinny has no database stores), or point MLFLOW_TRACKING_URI at a tracking server"
            )


def log_figure(loggers: Iterable[Logger], key: str, figure: Figure, step: int) -> None:
    """The figure, as `key` at `step`, in each logger that keeps images (TensorBoard, W&B, MLflow): rendered once."""
    keepers = [logger for logger in loggers if isinstance(logger, (TensorBoardLogger, WandbLogger, MLFlowLogger))]
    pixels = figure_pixels(figure) if keepers else None  # (H, W, 3) uint8
    for logger in keepers:
        if isinstance(logger, TensorBoardLogger):
            logger.experiment.add_image(key, pixels, step, dataformats="HWC")
        elif isinstance(logger, WandbLogger):
            logger.log_image(key, [pixels], step=step)
        else:  # MLflow's images at a step, which its UI pages through
            logger.experiment.log_image(logger.run_id, pixels, key=key, step=step)


def finish_runs(loggers: Iterable[Logger]) -> None:
    """End the W&B run: Lightning leaves it open, and the next run in this process (a sweep's next job) would log
    into it."""
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            logger.experiment.finish()
