"""What a run sends to Lightning's loggers beyond metrics, each in its own way: figures, and the end of a W&B run.
And, before anything runs, whether the chosen loggers can start: their packages installed, W&B logged in, MLflow's
tracking server answering."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
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
# MLflow retries a request nobody answers 7 times with growing pauses, each try waiting up to 120 s for an answer
# (about 4 minutes: its MLFLOW_HTTP_REQUEST_MAX_RETRIES and MLFLOW_HTTP_REQUEST_TIMEOUT), which a run keeps, to ride
# out a busy server; the check at start-up tries once and waits this long, so that a wrong or stopped server is
# named in seconds
TRACKING_SERVER_WAIT_S = 5
OFFLINE_WANDB_MODES = ("offline", "dryrun", "disabled")  # W&B's modes that need no login


def check_logger_packages(loggers: DictConfig | None) -> None:
    """Refuse, naming what to do, a logger that cannot start: its package not installed (`pip install`), W&B with no
    login, an MLflow tracking server that does not answer. Lightning would fail only once the trainer is built or
    the data read, in a traceback (MLflow's after 4 minutes of retries)."""
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
        if uri and urlparse(uri).scheme in ("http", "https"):
            _check_tracking_server(f"logger.{name}", uri, node.get("experiment_name") or "lightning_logs")
        if issubclass(kind, WandbLogger):
            _check_wandb_login(f"logger.{name}", node)


def _check_wandb_login(key: str, node: DictConfig) -> None:
    """W&B credentials where the run logs online, found as wandb.init finds them (WANDB_API_KEY, ~/.netrc from
    `wandb login`, W&B's settings files), without a request: wandb.init would otherwise raise once the data module
    is built, or, at a terminal, stop the run at a prompt. wandb.login has no such quiet form (it prints the account,
    asked of the server, and writes W&B's settings file), hence its own lookup, `prompt=False`."""
    from wandb.errors import AuthenticationError
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    settings = wandb_setup.singleton().settings  # the environment and settings files wandb.init reads too
    # WandbLogger's offline=true, then a mode passed through to wandb.init, override the environment's
    mode = "offline" if node.get("offline") else node.get("mode") or settings.mode
    if mode in OFFLINE_WANDB_MODES:
        return
    offline = f"or log offline ({key}.offline=true or WANDB_MODE=offline, then `wandb sync`)"
    try:
        found = wbauth.authenticate_session(
            host=wbauth.HostUrl(settings.base_url, app_url=settings.app_url),
            source=key,
            prompt=False,
            update_session=False,
        )
    except AuthenticationError as err:  # a key of the wrong form, in WANDB_API_KEY or ~/.netrc
        raise ConfigError(f"{key} (WandbLogger): {err} Run `wandb login`, {offline}") from None
    if found is None:
        raise ConfigError(
            f"{key} (WandbLogger) is not logged in to {settings.base_url}: run `wandb login` (or set WANDB_API_KEY), "
            f"{offline}"
        )


def _check_tracking_server(key: str, uri: str, experiment: str) -> None:
    """One request to the MLflow tracking server at `uri` (the one MLFlowLogger makes first, read-only), tried once
    and answered within TRACKING_SERVER_WAIT_S, else one line naming the URI and what happened."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    wait = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(TRACKING_SERVER_WAIT_S)}
    try:
        with _environment(wait):  # MLflow reads them at each request, and the client has no arguments for them
            MlflowClient(uri).get_experiment_by_name(experiment)
    except MlflowException as err:
        cause, elsewhere = _innermost(err), f"or point {key}.tracking_uri (or MLFLOW_TRACKING_URI) at one that runs"
        if isinstance(cause, TimeoutError):
            why = f"the MLflow tracking server there did not answer within {TRACKING_SERVER_WAIT_S} s: start it, "
        elif isinstance(cause, OSError) and cause.strerror:  # connection refused, a host name that does not resolve
            why = f"no MLflow tracking server answers there ({cause.strerror.lower()}): start it, "
        else:  # it answered, with an error: a login it refuses, a path that is not MLflow's
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            why = f"the server refused MLflow's first request ({first}): check the URI and MLflow's credentials, "
        raise ConfigError(f"{key}.tracking_uri={uri}: {why}{elsewhere}") from None


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """os.environ with `values` set, put back as it was afterwards."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _innermost(err: BaseException) -> BaseException:
    """The error at the bottom of a failed request: MLflow's wraps requests', which wraps urllib3's (its `reason`),
    which wraps the socket's."""
    while True:
        below = err.__cause__ or err.__context__ or getattr(err, "reason", None)
        if not isinstance(below, BaseException) and err.args and isinstance(err.args[0], BaseException):
            below = err.args[0]
        if not isinstance(below, BaseException):
            return err
        err = below


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
