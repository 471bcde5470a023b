"""W&B and MLflow, offline (W&B's offline mode, MLflow's local file store), get what the run's other outputs hold: its
resolved config, its metrics and the figure it draws each epoch. A logger that cannot start (its package missing,
W&B without a login, an MLflow server that does not answer) is refused in one line before anything runs."""

import ipaddress
import socket
import sys
import time

import pytest
import yaml

from tests.helpers import compose, tiny_run
from vit.model import ConfigError
from vit.training import loggers
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


@pytest.fixture
def no_wandb_login(tmp_path, monkeypatch):
    """W&B as on a machine where nobody ran `wandb login`: no key in the environment, an empty ~/.netrc and settings
    folder, and W&B's settings read afresh (wandb keeps them, once read, for the process)."""
    import wandb

    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_settings"))
    monkeypatch.chdir(tmp_path)  # W&B's workspace settings are ./wandb/settings
    wandb.teardown()
    yield tmp_path / "netrc"
    wandb.teardown()


def test_wandb_without_a_login_is_refused_naming_what_to_do_before_anything_runs(tmp_path, no_wandb_login):
    run = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        train(tiny_run(run, "logger=wandb"))
    line = str(refused.value)
    assert line.startswith("logger.wandb (WandbLogger) is not logged in to ") and "\n" not in line
    assert "`wandb login`" in line and "WANDB_MODE=offline" in line and "logger.wandb.offline=true" in line
    assert not run.exists()  # nothing written, no data read


def test_wandb_with_a_key_of_the_wrong_form_is_one_line_naming_it(tmp_path, no_wandb_login, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "abc")
    with pytest.raises(ConfigError, match=r"^logger\.wandb \(WandbLogger\): WANDB_API_KEY invalid: .*`wandb login`"):
        train(tiny_run(tmp_path / "run", "logger=wandb"))


@pytest.mark.parametrize(
    "login",
    ["netrc", "WANDB_API_KEY", "WANDB_MODE=offline", "WANDB_MODE=disabled", "logger.wandb.offline=true"],
)
def test_wandb_logged_in_or_offline_passes_the_check_without_a_request(no_wandb_login, monkeypatch, login):
    import wandb

    key = "k" * 40
    overrides = []
    if login == "netrc":  # what `wandb login` writes
        no_wandb_login.write_text(
            f"machine {wandb.Settings().base_url.split('://')[1]}\n  login user\n  password {key}\n"
        )
    elif login == "WANDB_API_KEY":
        monkeypatch.setenv("WANDB_API_KEY", key)
    elif login.startswith("WANDB_MODE"):
        monkeypatch.setenv("WANDB_MODE", login.split("=")[1])
    else:
        overrides.append(login)

    def no_request(*args, **kwargs):
        raise AssertionError("the check asked a server")

    monkeypatch.setattr(socket.socket, "connect", no_request)
    loggers.check_logger_packages(compose("logger=wandb", *overrides).logger)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "server, wait",
    [
        ("closed", loggers.TRACKING_SERVER_WAIT_S),
        ("silent", 1),  # a socket that accepts connections and never answers
        pytest.param("silent", loggers.TRACKING_SERVER_WAIT_S, marks=pytest.mark.slow, id="silent-as-set"),
    ],
)
def test_an_mlflow_server_that_does_not_answer_is_one_line_naming_the_uri_in_seconds(
    tmp_path, offline, monkeypatch, capfd, server, wait
):
    monkeypatch.setattr(loggers, "TRACKING_SERVER_WAIT_S", wait)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        uri = f"http://127.0.0.1:{silent.getsockname()[1] if server == 'silent' else _closed_port()}"
        start = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            train(tiny_run(tmp_path / "run", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}"))
        took = time.monotonic() - start
    why = f"did not answer within {wait} s" if server == "silent" else "answers there (connection refused)"
    line = str(refused.value)
    assert line.startswith(f"logger.mlflow.tracking_uri={uri}: ") and why in line and "\n" not in line
    assert took < wait + 3 <= 10  # one try: MLflow's own retries take minutes
    assert not (tmp_path / "run").exists()
    assert "Traceback" not in capfd.readouterr().err


def test_an_mlflow_server_that_refuses_the_first_request_is_one_line_naming_the_uri(tmp_path, offline):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Refusing(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(403, "no token")

        def log_message(self, *args):
            pass

    with HTTPServer(("127.0.0.1", 0), Refusing) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(ConfigError) as refused:
            train(tiny_run(tmp_path / "run", "logger=mlflow", f"logger.mlflow.tracking_uri={uri}"))
        server.shutdown()
    line = str(refused.value)
    assert line.startswith(f"logger.mlflow.tracking_uri={uri}: the server refused MLflow's first request (")
    assert "403" in line and "credentials" in line and "\n" not in line
