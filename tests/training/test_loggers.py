"""W&B and MLflow, offline (W&B's offline mode, MLflow's local file store), get what the run's other outputs hold: its
resolved config, its metrics and the figure it draws each epoch. A logger whose package is missing is refused in
one line before anything runs."""

import ipaddress
import socket
import sys

import pytest
import yaml

from tests.helpers import tiny_run
from vit.model import ConfigError
from vit.training.run import train

EPOCHS = ["trainer.max_epochs=2", "trainer.limit_train_batches=2", "trainer.limit_val_batches=1"]
FIGURE = "pos_embed/similarity"


@pytest.fixture
def offline(monkeypatch):
    """Nothing leaves the machine: W&B offline, MLflow's and W&B's reports off, and any connection this process
    opens to an address other than its own refused (W&B's own service listens on localhost)."""
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_ALLOW_FILE_STORE": "true",  # recent MLflow refuses its file store without it
    }.items():
        monkeypatch.setenv(name, value)
    connect = socket.socket.connect

    def local_only(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                local = address[0] == "localhost" or ipaddress.ip_address(address[0]).is_loopback
            except ValueError:  # a host name
                local = False
            assert local, f"a test tried to reach {address}"
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)


def flattened(tree: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow's parameters: keys joined by '/', values as text (Lightning's MLFlowLogger)."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat |= flattened(value, f"{prefix}{key}/")
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


def test_wandb_offline_gets_the_config_the_metrics_and_each_epochs_figure(tmp_path, offline, monkeypatch):
    from wandb.sdk.wandb_run import Run

    seen = {}
    finish = Run.finish

    def keep(run, *args, **kwargs):  # what the run holds as it ends: its summary is gone afterwards
        seen.update(config=dict(run.config), summary=dict(run.summary))
        return finish(run, *args, **kwargs)

    monkeypatch.setattr(Run, "finish", keep)
    train(tiny_run(tmp_path, "logger=wandb", "logger.wandb.offline=true", *EPOCHS))
    assert seen, "the W&B run was not finished: the next run in this process would log into it"
    assert seen["config"] == yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert {"train/loss", "val/acc", "test/acc", FIGURE} <= set(seen["summary"])
    [run] = (tmp_path / "wandb").glob("offline-run-*")
    figures = sorted((run / "files" / "media" / "images" / "pos_embed").glob("similarity_*.png"))
    assert len(figures) == 2  # one an epoch


def test_mlflow_file_store_gets_the_config_the_metrics_and_each_epochs_figure(tmp_path, offline):
    from mlflow.tracking import MlflowClient

    store = f"file:{tmp_path}/mlruns"
    train(tiny_run(tmp_path, "logger=mlflow", f"logger.mlflow.tracking_uri={store}", *EPOCHS))
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("vit").experiment_id])
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert run.data.params == {k: v[:250] for k, v in flattened(config).items()}
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 2
    assert "test/acc" in run.data.metrics
    images = [a.path for a in client.list_artifacts(run.info.run_id, "images") if a.path.endswith(".png")]
    steps = sorted(int(path.split("+step+")[1].split("+")[0]) for path in images)
    assert all(FIGURE.replace("/", "~") in path for path in images) and steps == [2, 4]  # each epoch's end


@pytest.mark.parametrize(
    "overrides, missing, line",
    [
        (["logger=wandb"], ["wandb"], r"logger\.wandb \(WandbLogger\) needs the wandb package: pip install wandb$"),
        (
            ["logger=mlflow"],
            ["mlflow"],
            r"logger\.mlflow \(MLFlowLogger\) needs the mlflow package: pip install mlflow$",
        ),
        (
            ["logger=tensorboard"],
            ["tensorboard", "tensorboardX"],
            r"needs the tensorboard package: pip install tensorboard$",
        ),
        # mlflow-skinny's, without the database support MLflow's default local store needs
        (["logger=mlflow"], ["sqlalchemy"], r"tracking_uri=sqlite:///mlflow\.db is a database.*: pip install mlflow"),
    ],
)
def test_a_logger_without_its_package_is_refused_before_anything_runs(tmp_path, monkeypatch, overrides, missing, line):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # what importlib then finds: nothing
    with pytest.raises(ConfigError, match=line) as refused:
        train(tiny_run(tmp_path, *overrides))
    assert "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == []
