"""data=stream: shards the tests write (24 training images, each its own colour and label) read from a folder and
from an S3 server the test starts, trained one epoch, under DDP and by the README's two-node torchrun command with
each image once an epoch, resumed mid-epoch to the same weights; every bad input one error naming the shard, item
or path."""

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from PIL import Image

from tests.helpers import NO_COMPILING, ROOT, compose, one_epoch, run_train_py
from tests.reliability.faults import recorded_labels, stopped_and_resumed_end_alike
from vit.data.encoded.stream import StreamDataModule
from vit.data.errors import DataError
from vit.data.shards.writer import write_shards
from vit.training.run import train
from vit.training.run_folder import LAST

SIZE = 16
IMAGES = 28  # 24 training images (one class folder each), 4 test images


def colour(k: int) -> tuple[int, int, int]:
    return (9 * k, 255 - 9 * k, (70 * k) % 256)


def write_folder(root):
    """Image k (PNG, every third a JPEG), left half colour(k), in class folder c<k>: train/ 0..23 and val/ (the
    test set) 24..27."""
    for k in range(IMAGES):
        folder = root / ("train" if k < 24 else "val") / f"c{k % 24:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        kind = "JPEG" if k % 3 == 0 else "PNG"
        image = Image.new("RGB", (SIZE, SIZE), colour(k))
        image.paste((255, 255, 255), (SIZE // 2, 0, SIZE, SIZE))  # a white right half: a flip shows
        image.save(folder / f"{k}.{'jpg' if kind == 'JPEG' else 'png'}", kind)
    return root


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """The folder written as shards: train/ 20 images (5 steps of 4), val/ 4 held out, test/ 4; several shards."""
    root = tmp_path_factory.mktemp("stream")
    write_shards(str(write_folder(root / "folder")), str(root / "out"), val_fraction=1 / 6, workers=1, chunk_bytes=700)
    return root / "out"


def module(root, **settings) -> StreamDataModule:
    values = dict(num_classes=24, img_size=SIZE, batch_size=4, eval_batch_size=4, num_workers=0, crop_pct=1.0)
    return StreamDataModule(root=str(root), **{**values, **settings})


def pixels(dm, batch):
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    return ((batch * std + mean) * 255).round()


def test_the_splits_decode_to_each_images_own_colour_and_the_training_order_follows_the_seed(shards):
    dm = module(shards)
    dm.setup()
    assert dm.classes == [f"c{k:02d}" for k in range(24)]
    batches = [dm.on_after_batch_transfer(batch, 0) for batch in dm.test_dataloader()]  # as the model reads them
    assert sorted(label for _, labels in batches for label in labels.tolist()) == [0, 1, 2, 3]
    for images, labels in batches:  # JPEG's loss aside, each test image is its own colour (images 24..27)
        for image, label in zip(pixels(dm, images), labels.tolist(), strict=True):
            if (24 + label) % 3:
                assert torch.equal(image[:, 0, 0], torch.tensor(colour(24 + label), dtype=torch.float32))
    loader = dm.train_dataloader()
    epochs = [[label for _, labels in loader for label in labels.tolist()] for _ in range(2)]
    val = [label for _, labels in dm.val_dataloader() for label in labels.tolist()]
    assert len(val) == 4 and sorted(epochs[0] + val) == list(range(24))  # 20 trained, 4 held out, none twice
    assert sorted(epochs[1]) == sorted(epochs[0]) and epochs[1] != epochs[0]  # reshuffled by epoch
    torch.manual_seed(1)
    other = module(shards)
    other.setup()
    assert [label for _, labels in other.train_dataloader() for label in labels.tolist()] != epochs[0]  # by seed


RUN = one_epoch("stream", SIZE)  # TINY's model on SIZE-pixel images, in batches of 4


RANDOM = [  # everything random on: shuffling, RandAugment, crops, flips, dropout, drop path, Mixup/CutMix, EMA
    "trainer.max_epochs=2",
    "model.dropout=0.1",
    "model.drop_path=0.1",
    "+mixup={mixup_alpha: 0.8, cutmix_alpha: 1.0, switch_prob: 0.5}",
    "ema_decay=0.9",
]


def witness(folder) -> str:
    """The override of a callback recording every training batch's labels into `folder`."""
    return f"+callbacks.witness={{_target_: tests.reliability.faults.RecordLabels, folder: {folder}}}"


@pytest.fixture(scope="module")
def whole(shards, tmp_path_factory):
    """One uninterrupted run of two epochs from the shards, everything random on, its labels witnessed in seen/:
    the run the tests below stop and resume must end alike. Returns its folder and its results."""
    folder = tmp_path_factory.mktemp("whole")
    results = train(compose(*RUN, *RANDOM, f"data.root={shards}", f"output_dir={folder}", witness(folder / "seen")))
    return folder, results


def test_a_run_trains_from_local_shards_with_the_classes_counted_from_them(shards, whole):
    cfg = compose(*RUN, f"data.root={shards}")
    assert cfg.data.num_classes == cfg.model.num_classes == 24
    _, results = whole
    assert results["global_steps"] == 10 and results["test_acc"] is not None
    saved = torch.load(results["best_checkpoint"], weights_only=True)
    assert saved["data_facts"]["classes"] == [f"c{k:02d}" for k in range(24)]


@pytest.mark.parametrize(
    "workers, decode",
    [  # in the main process without decoding on the device: test_a_run_stopped_mid_run_reads_...
        (0, ["data.auto_augment=null", "data.decode=device"]),
        pytest.param(2, [], marks=pytest.mark.slow),  # with workers: ~4 s
    ],
    ids=["decoded on the device", "2 workers"],
)
def test_a_run_stopped_mid_epoch_and_resumed_ends_bit_identical(shards, tmp_path, workers, decode):
    def run(folder, *more):
        return compose(
            *RUN,
            *RANDOM,
            *decode,
            f"data.root={shards}",
            f"data.num_workers={workers}",
            f"output_dir={tmp_path / folder}",
            *more,
        )

    stopped_and_resumed_end_alike(run, tmp_path, step=6, steps=10)  # epoch 2's second step


@pytest.mark.parametrize("step", [1, 4, 6], ids=["mid-epoch", "at the epoch's end", "mid-epoch 2"])
def test_a_run_stopped_mid_run_reads_what_the_whole_run_read_and_ends_bit_identical(shards, whole, tmp_path, step):
    """Stopped at epoch 1's second step, or its last (the checkpoint then follows the epoch's validation, and
    Lightning restores no loader state from it), or epoch 2's second step, the resumed run reads what the whole run
    read, epoch 2 included, and ends with its weights."""

    def run(folder, *more):
        return compose(*RUN, *RANDOM, f"data.root={shards}", f"output_dir={tmp_path / folder}", *more)

    stop = f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"
    with pytest.raises(SystemExit) as stopped:
        train(run("runs/1", witness(tmp_path / "seen"), stop))
    assert stopped.value.code == 128 + signal.SIGTERM
    assert torch.load(tmp_path / "runs/1/checkpoints" / LAST)["global_step"] == step + 1
    assert train(run("runs/2", witness(tmp_path / "seen"), stop, "resume=auto"))["global_steps"] == 10
    folder, _ = whole
    assert recorded_labels(str(tmp_path / "seen")) == recorded_labels(str(folder / "seen"))
    expected, got = (torch.load(f / "checkpoints" / LAST)["state_dict"] for f in (folder, tmp_path / "runs/2"))
    assert expected.keys() == got.keys()
    assert not [k for k in expected if not torch.equal(expected[k], got[k])]


def test_a_run_resumed_from_its_shards_moved_elsewhere_ends_bit_identical(shards, whole, tmp_path):
    """litdata's loader state names the folder it read from: resume=PATH with data.root at the shards' new place
    reads them there; a state of other shards is one error naming data.root."""

    def run(root, folder, *more):
        return compose(*RUN, *RANDOM, f"data.root={root}", f"output_dir={tmp_path / folder}", *more)

    stop = "+callbacks.fault={_target_: tests.reliability.faults.SignalAt, step: 6}"  # epoch 2's second step
    with pytest.raises(SystemExit):
        train(run(_copy(shards, tmp_path / "old"), "runs/1", stop))
    (tmp_path / "old").rename(tmp_path / "new")
    last = tmp_path / "runs/1/checkpoints" / LAST
    assert train(run(tmp_path / "new", "runs/2", f"resume={last}"))["global_steps"] == 10
    expected, got = (torch.load(f / "checkpoints" / LAST)["state_dict"] for f in (whole[0], tmp_path / "runs/2"))
    assert not [k for k in expected if not torch.equal(expected[k], got[k])]
    (state,) = torch.load(last)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    state["dataset"]["subsampled_files"] = state["dataset"]["subsampled_files"][1:]
    dm = module(tmp_path / "new")
    dm.setup()
    with pytest.raises(DataError, match=rf"^cannot resume: .* are not those at data.root={tmp_path / 'new'}$"):
        dm.train_dataloader().load_state_dict(state)


@pytest.mark.slow  # two DDP processes of train.py: ~20 s
def test_under_ddp_every_training_image_is_seen_once_an_epoch_across_two_ranks(shards, tmp_path):
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    run = run_train_py(
        *RUN,
        *ddp,
        "trainer.max_epochs=2",
        "data.batch_size=2",
        witness(tmp_path / "seen"),
        f"data.root={shards}",
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    _each_image_once_an_epoch_on_two_ranks(shards, tmp_path / "seen")


@pytest.mark.slow  # three runs of two DDP processes each: ~50 s
@pytest.mark.parametrize("step", [1, 4], ids=["mid-epoch", "at the epoch's end"])
def test_under_ddp_a_run_stopped_in_its_first_epoch_resumes_to_the_whole_runs_images_and_weights(
    shards, tmp_path, step
):
    """Both ranks stopped at epoch 1's second step, or at its last (5 steps of 2 images a rank), then resume=auto:
    each rank reads in epoch 1's rest and in epoch 2 what it read in the uninterrupted run, to the same weights."""
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]

    def run(folder, seen, *more):
        overrides = [*RUN, *RANDOM, *ddp, "data.batch_size=2", f"data.root={shards}", witness(tmp_path / seen)]
        return run_train_py(*overrides, f"output_dir={tmp_path / folder}", *more, cwd=tmp_path)

    whole = run("whole", "whole_seen")
    assert whole.returncode == 0, whole.stderr[-2000:]
    stop = f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"
    first = run("runs/1", "seen", stop)
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    assert torch.load(tmp_path / "runs/1/checkpoints" / LAST)["global_step"] == step + 1
    second = run("runs/2", "seen", stop, "resume=auto")
    assert second.returncode == 0, second.stderr[-2000:]
    assert recorded_labels(str(tmp_path / "seen")) == recorded_labels(str(tmp_path / "whole_seen"))
    expected, got = (torch.load(tmp_path / f / "checkpoints" / LAST)["state_dict"] for f in ("whole", "runs/2"))
    assert not [k for k in expected if not torch.equal(expected[k], got[k])]


def _each_image_once_an_epoch_on_two_ranks(shards, folder) -> None:
    """RecordLabels' witness of two epochs in batches of 2 on two ranks: 20 images an epoch, each on one rank."""
    seen = recorded_labels(str(folder))
    assert sorted(seen) == [0, 1]
    held_out = {label for _, labels in _val(shards) for label in labels}
    orders = []
    for epoch in (0, 1):
        by_rank = [[label for e, batch in seen[rank] if e == epoch for label in batch] for rank in (0, 1)]
        assert [len(labels) for labels in by_rank] == [10, 10]  # 5 batches of 2 each: 20 images, none dropped
        assert sorted(by_rank[0] + by_rank[1]) == sorted(set(range(24)) - held_out)  # each once, on one rank
        orders.append(by_rank)
    assert orders[0] != orders[1]  # reshuffled by epoch


def readme_command(program: str) -> list[str]:
    """The README's command that starts with `program`, its continued lines joined, its comment left out."""
    lines = iter((ROOT / "README.md").read_text().splitlines())
    for line in lines:
        if line.startswith(f"{program} "):
            while line.endswith("\\"):
                line = line[:-1] + next(lines)
            return shlex.split(line, comments=True)
    raise AssertionError(f"README.md has no command starting with {program}")


@pytest.mark.slow  # two torchrun agents and their train.py processes: ~20 s
def test_the_readmes_two_node_command_runs_as_two_nodes_on_one_machine(shards, tmp_path):
    """The README's torchrun line, started twice as its two nodes would start it, on localhost: one process a
    node on the CPU (gloo), the shards from a folder and a tiny model; each image once an epoch across the nodes."""
    command = readme_command("torchrun")
    local = {  # the README's words that name a cluster, and what stands for them here
        "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        "HOST:29500": [f"127.0.0.1:{_free_port()}"],
        "train.py": [str(ROOT / "train.py")],
        "data.root=s3://bucket/shards": [f"data.root={shards}"],
        "model=vit_small_16": [o for o in RUN if o != "data=stream"],
        "trainer.devices=4": ["trainer.devices=1", "trainer.accelerator=cpu", "trainer.precision=32-true"],
    }
    assert set(local) <= set(command), f"the README's command changed: {command}"
    assert command[command.index("--nproc-per-node") + 1] == "4"
    command[command.index("--nproc-per-node") + 1] = "1"
    args = [word for token in command for word in local.get(token, [token])]
    args += ["trainer.max_epochs=2", "data.batch_size=2", witness(tmp_path / "seen")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **NO_COMPILING}
    nodes = [subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(node.poll() for node in nodes):  # until both end, or one fails
        if all(node.poll() == 0 for node in nodes):
            break
        time.sleep(0.5)
    for node in nodes:
        node.kill()
    outputs = [node.communicate()[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(out[-2000:] for out in outputs)
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in "".join(outputs)
    _each_image_once_an_epoch_on_two_ranks(shards, tmp_path / "seen")
    run_dir = tmp_path / next(word.split("=", 1)[1] for word in command if word.startswith("hydra.run.dir="))
    assert json.loads((run_dir / "results.json").read_text())["epochs"] == 2  # one run folder, named alike


def test_two_loader_workers_share_an_epoch_each_image_once(shards):
    """litdata splits the epoch among DataLoader workers itself (so train.py silences Lightning's warning about an
    IterableDataset with a length): every training image once an epoch, reshuffled the next."""
    dm = module(shards, num_workers=2)
    dm.setup()
    loader = dm.train_dataloader()
    epochs = [[label for _, labels in loader for label in labels.tolist()] for _ in range(2)]
    held_out = {label for _, labels in _val(shards) for label in labels}
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(set(range(24)) - held_out)
    assert epochs[0] != epochs[1]


def test_a_process_never_seeded_below_2_to_the_32_still_shuffles(shards):
    """Outside train.py (a notebook, a benchmark) torch's seed is any 64-bit number; litdata's numpy shuffle
    refuses those above 2**32, which made the first pass raise 'Seed must be between 0 and 2**32 - 1'."""
    torch.manual_seed(2**40 + 5)
    dm = module(shards)
    dm.setup()
    assert len([label for _, labels in dm.train_dataloader() for label in labels.tolist()]) == 20


def test_reading_shards_logs_no_cache_budget_of_litdatas_choosing(shards, caplog, capfd, recwarn):
    """Without max_cache_size litdata logs 'max_cache_size is unset; using 32.9 GB (75% of free disk ...)' each
    time a reader starts: train.py printed it on stderr for every split and pass, though a folder has no cache."""
    caplog.set_level(logging.INFO)
    dm = module(shards)
    dm.setup()
    next(iter(dm.train_dataloader()))
    next(iter(dm.val_dataloader()))
    said = [caplog.text, capfd.readouterr().err, *(str(w.message) for w in recwarn)]
    assert not [text for text in said if "max_cache_size" in text]


def _val(shards):
    dm = module(shards)
    dm.setup()
    return [(images, labels.tolist()) for images, labels in dm.val_dataloader()]


S3_CREDENTIALS = dict(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1")


@pytest.fixture
def s3(s3_server):
    """The local S3 server's endpoint (s3_server)."""
    return s3_server[0]


@pytest.fixture
def s3_server(monkeypatch):
    """A local S3 server (moto) on a free port of 127.0.0.1, this process's credentials set for it: its endpoint and
    its process. In a process of its own: in a thread of this one, it would draw from the random state a run's
    augmentation draws from."""
    pytest.importorskip("boto3")
    for key, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert server.poll() is None and time.monotonic() < deadline, "the S3 server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.kill()
        server.wait()


def _upload(shards, endpoint: str, bucket: str, prefix: str):
    """The shards copied to s3://bucket/prefix on the server at `endpoint` (the bucket made where new)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    if bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=bucket)
    for path in shards.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(shards).as_posix()}")
    return client


def _weights(folder):
    return torch.load(folder / "checkpoints" / LAST)["state_dict"]


@pytest.mark.slow  # four runs and a server: ~20 s
def test_a_run_streams_from_s3_end_to_end_as_from_the_folder(shards, tmp_path, s3):
    """The documented command, data.root=s3://... with the server's endpoint: it trains, validates and tests on
    the same images in the same order as from the local folder (each split's labels alike), ends with the same
    weights and accuracy, and a run stopped mid-epoch resumes from the bucket to those weights too."""
    _upload(shards, s3, "data", "sets/tiny")
    url = ["data.root=s3://data/sets/tiny", f"+data.storage_options.endpoint_url={s3}"]

    def run(folder, root, tag, *more):
        settings = [
            *RUN,
            "trainer.max_epochs=2",
            f"data.cache_dir={tmp_path / tag}_cache",
            witness(tmp_path / tag),
            *more,
        ]
        return compose(*settings, *root, f"output_dir={tmp_path / folder}")

    streamed, local = train(run("s3", url, "s3_seen")), train(run("local", [f"data.root={shards}"], "local_seen"))
    assert streamed["global_steps"] == 10 and streamed["test_acc"] is not None
    assert (streamed["best_val_acc"], streamed["test_acc"]) == (local["best_val_acc"], local["test_acc"])
    assert recorded_labels(str(tmp_path / "s3_seen")) == recorded_labels(str(tmp_path / "local_seen"))
    expected = _weights(tmp_path / "local")
    assert not [k for k, v in _weights(tmp_path / "s3").items() if not torch.equal(v, expected[k])]
    # evaluation reads every image of val/ and test/ from the bucket, in the folder's order
    remote = module("s3://data/sets/tiny", storage_options={"endpoint_url": s3}, cache_dir=str(tmp_path / "eval"))
    remote.setup()
    folder = module(shards)
    folder.setup()
    for loader in ("val_dataloader", "test_dataloader"):
        read = [[labels.tolist() for _, labels in getattr(dm, loader)()] for dm in (remote, folder)]
        assert read[0] == read[1] and sum(map(len, read[0])) == 4, loader
    # stopped in epoch 2 and resumed, both from the bucket
    stop = "+callbacks.fault={_target_: tests.reliability.faults.SignalAt, step: 6}"
    with pytest.raises(SystemExit):
        train(run("runs/1", url, "resumed_seen", stop))
    assert train(run("runs/2", url, "resumed_seen", stop, "resume=auto"))["global_steps"] == 10
    assert not [k for k, v in _weights(tmp_path / "runs/2").items() if not torch.equal(v, expected[k])]
    assert recorded_labels(str(tmp_path / "resumed_seen")) == recorded_labels(str(tmp_path / "s3_seen"))


@pytest.mark.slow  # a train.py process: ~15 s
def test_the_documented_s3_command_trains_validates_and_tests_in_a_process_of_its_own(shards, tmp_path, s3):
    """docs/training.md's command, as a user types it, against the local server: exit 0 and every split's figures."""
    _upload(shards, s3, "data", "sets/tiny")
    command = ["data.root=s3://data/sets/tiny", f"+data.storage_options.endpoint_url={s3}"]
    result = run_train_py(*RUN, *command, f"data.cache_dir={tmp_path / 'cache'}", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["test_acc"] is not None and results["best_val_acc"] is not None


@pytest.mark.slow  # ~10 s: an S3 server in its own process
def test_shards_are_read_from_an_s3_server(shards, tmp_path, monkeypatch, caplog, s3):
    boto3 = pytest.importorskip("boto3")
    caplog.set_level(logging.INFO)
    endpoint = s3
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket="data")
    short = sorted((shards / "train").glob("chunk-*.bin"))[1]
    for path in shards.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "data", f"sets/tiny/{path.relative_to(shards).as_posix()}")
            body = path.read_bytes()[:100] if path == short else path.read_bytes()  # as an interrupted sync
            client.put_object(Bucket="data", Key=f"sets/short/{path.relative_to(shards).as_posix()}", Body=body)
    url, options = "s3://data/sets/tiny", {"endpoint_url": endpoint}
    cfg = compose("data=stream", f"data.root={url}", f"+data.storage_options.endpoint_url={endpoint}")
    assert cfg.data.num_classes == 24
    dm = module(url, storage_options=options, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    trained = [label for _, labels in dm.train_dataloader() for label in labels.tolist()]
    local = module(shards)
    local.setup()
    assert trained == [label for _, labels in local.train_dataloader() for label in labels.tolist()]
    assert list((tmp_path / "cache").rglob("chunk-*.bin"))  # fetched from the server into the cache
    assert "max_cache_size" not in caplog.text  # data.max_cache_size's budget, not one litdata picks and logs
    # a checkpoint's loader state from one bucket resumes from the shards copied to another
    client.create_bucket(Bucket="moved")
    for path in shards.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "moved", f"tiny/{path.relative_to(shards).as_posix()}")
    stopped = module(url, storage_options=options, cache_dir=str(tmp_path / "stopped"))
    stopped.setup()
    loader = stopped.train_dataloader()
    batches = iter(loader)
    head = [label for _ in range(2) for label in next(batches)[1].tolist()]
    state = loader.state_dict()
    moved = module("s3://moved/tiny", storage_options=options, cache_dir=str(tmp_path / "moved"))
    moved.setup()
    resumed = moved.train_dataloader()
    resumed.load_state_dict(state)
    assert head + [label for _, labels in resumed for label in labels.tolist()] == trained
    with pytest.raises(FileNotFoundError, match=r"data.root=s3://nobucket/x \(no bucket 'nobucket'\)"):
        module("s3://nobucket/x", storage_options=options).setup()
    with pytest.raises(DataError, match=r"data.root=s3://data/none holds no shards.json"):
        module("s3://data/none", storage_options=options).setup()
    # litdata used to wait for the rest of a short shard for ever; now setup names it
    name = f"s3://data/sets/short/train/{short.name}"
    with pytest.raises(DataError, match=rf"shard {name} is 100 bytes, but index.json says \d+ bytes: truncated"):
        module("s3://data/sets/short", storage_options=options).setup()
    # and one cut short after setup checked it: litdata waits for the rest (shortened here), then it is named
    monkeypatch.setattr("litdata.streaming.item_loader._MAX_WAIT_TIME", 3)
    later = module("s3://data/sets/tiny", storage_options=options, cache_dir=str(tmp_path / "later"))
    later.setup()
    client.put_object(Bucket="data", Key=f"sets/tiny/train/{short.name}", Body=short.read_bytes()[:100])
    name = f"s3://data/sets/tiny/train/{short.name}"
    with pytest.raises(DataError, match=rf"shard {name} is 100 bytes, .* truncated or replaced since the run"):
        list(later.train_dataloader())


@pytest.mark.slow  # an S3 server in its own process: ~6 s
@pytest.mark.parametrize("workers", [0, 1], ids=["main process", "a worker"])
def test_an_s3_server_gone_mid_run_is_one_line_without_litdatas_traceback(shards, tmp_path, s3_server, capfd, workers):
    """litdata's download thread printed the failed download's traceback (60 lines), and the downloads still in flight
    one 'Event loop is closed' traceback each, before the run's one line."""
    endpoint, server = s3_server
    _upload(shards, endpoint, "data", "sets/tiny")
    dm = module("s3://data/sets/tiny", storage_options={"endpoint_url": endpoint}, num_workers=workers)
    dm.cache_dir = str(tmp_path / "cache")
    dm.setup()  # the server answered: the shards' sizes are listed
    server.kill()
    server.wait()
    capfd.readouterr()
    with pytest.raises(DataError, match=r"data\.root=s3://data/sets/tiny: cannot read ") as err:
        list(dm.train_dataloader())
    assert len(str(err.value).splitlines()) == 1
    said = capfd.readouterr().err
    assert "Traceback" not in said and "PrepareChunksThread" not in said, said


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy(shards, to):
    import shutil

    shutil.copytree(shards, to)
    return to


def test_bad_input_is_one_error_naming_the_shard_item_or_path(shards, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^shards not found: data.root=.*nowhere does not exist$"):
        module(tmp_path / "nowhere").setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"data.root=.*empty holds no shards.json: not shards written by"):
        module(tmp_path / "empty").setup()
    unfinished = _copy(shards, tmp_path / "unfinished")
    info = json.loads((unfinished / "shards.json").read_text())
    (unfinished / "shards.json").write_text(json.dumps({**info, "complete": False}))
    with pytest.raises(DataError, match=r"shards are not finished .* rerun the same python -m vit.cli.shards"):
        module(unfinished).setup()
    newer = _copy(shards, tmp_path / "newer")
    (newer / "shards.json").write_text(json.dumps({**info, "format": 2}))
    with pytest.raises(DataError, match=r"newer/shards.json holds shards of format 2; this version reads format 1"):
        module(newer).setup()
    no_images = _copy(shards, tmp_path / "no_images")
    (no_images / "shards.json").write_text(json.dumps({**info, "splits": {"train": 0, "val": 4}}))
    with pytest.raises(DataError, match=r"the shards hold no training images"):
        module(no_images).setup()
    truncated = _copy(shards, tmp_path / "truncated")
    shard = sorted((truncated / "train").glob("chunk-*.bin"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DataError, match=rf"shard {shard} is 100 bytes, but index.json says \d+ bytes: truncated"):
        module(truncated).setup()
    later = _copy(shards, tmp_path / "later")  # cut short after setup checked it, while a run reads it
    dm = module(later)
    dm.setup()
    shard = sorted((later / "train").glob("chunk-*.bin"))[1]
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(DataError, match=rf"shard {shard} is 100 bytes, .* truncated or replaced since the run started"):
        list(dm.train_dataloader())


def test_an_image_that_does_not_decode_is_named_by_shard_item_and_source(shards, tmp_path):
    corrupt = _copy(shards, tmp_path / "corrupt")
    shard = next(p for p in sorted((corrupt / "test").glob("chunk-*.bin")) if b"\x89PNG" in p.read_bytes())
    data = bytearray(shard.read_bytes())
    start = data.find(b"\x89PNG")  # a PNG's header: the item no longer decodes, its length unchanged
    data[start : start + 8] = b"garbage!"
    shard.write_bytes(bytes(data))
    named = rf"item \d+ of shard {shard.name} in .*test \(from val/c\d+/\d+.png\) does not decode"
    for workers in (0, 1):  # in a worker, torch raises it again with the worker's traceback as the message
        dm = module(corrupt, num_workers=workers)
        dm.setup()
        with pytest.raises(DataError, match=named) as err:
            list(dm.test_dataloader())
        assert len(str(err.value).splitlines()) == 1  # the one line train.py prints
        assert str(err.value).endswith("(in DataLoader worker process 0)") == (workers == 1)


@pytest.mark.slow  # a train.py process: ~10 s
def test_train_py_names_a_missing_root_in_one_line(tmp_path):
    run = run_train_py(*RUN, f"data.root={tmp_path / 'nowhere'}", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert run.returncode == 1
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .endswith(f"shards not found: data.root={tmp_path / 'nowhere'} does not exist")
    )
    assert "Traceback" not in run.stderr


# --- shards of several labels an image -------------------------------------------------------------------------------


def hot(k: int) -> list[float]:
    """Image k's multi-hot labels in multi_shards: classes k % 3 and (k + 1) % 3 of three, every fourth of none."""
    return [0.0] * 3 if k % 4 == 3 else [float(c in (k % 3, (k + 1) % 3)) for c in range(3)]


@pytest.fixture(scope="module")
def multi_shards(tmp_path_factory):
    """write_folder's 28 images with a label file of hot(k) each (images 24..27 the test set), written as shards."""
    root = tmp_path_factory.mktemp("multi_stream")
    folder = write_folder(root / "folder")
    rows = ["image,labels,split"]
    for path in sorted(folder.glob("*/*/*"), key=lambda p: int(p.stem)):
        k = int(path.stem)
        names = ";".join(f"c{c}" for c in range(3) if hot(k)[c])
        rows.append(f"{path.relative_to(folder).as_posix()},{names},{'test' if k >= 24 else 'train'}")
    (folder / "labels.csv").write_text("\n".join(rows) + "\n")
    labels = str(folder / "labels.csv")
    write_shards(str(folder), str(root / "out"), val_fraction=1 / 6, workers=1, chunk_bytes=700, labels=labels)
    return root / "out"


def test_shards_of_several_labels_an_image_give_each_its_multi_hot_targets(multi_shards):
    dm = module(multi_shards, num_classes=3)
    dm.setup()
    assert dm.multilabel and dm.facts()["multilabel"] is True and dm.classes == ["c0", "c1", "c2"]
    for loader in (dm.test_dataloader(), dm.val_dataloader()):
        for images, targets in (dm.on_after_batch_transfer(batch, 0) for batch in loader):
            assert targets.dtype == torch.float32 and targets.shape == (len(images), 3)
            for image, target in zip(pixels(dm, images), targets.tolist(), strict=True):
                k = min(range(IMAGES), key=lambda k: abs(colour(k)[1] - image[1, 0, 0]))  # green names the image
                assert target == hot(k)
    _, targets = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert targets.shape == (4, 3) and targets.dtype == torch.float32
    on_device = module(multi_shards, num_classes=3, decode="device", auto_augment=None)
    on_device.setup()
    images, targets = on_device.on_after_batch_transfer(next(iter(on_device.train_dataloader())), 0)
    assert images.shape == (4, 3, SIZE, SIZE) and targets.shape == (4, 3)


def test_a_training_pass_of_several_labels_an_image_resumed_mid_epoch_reads_what_the_whole_pass_read(multi_shards):
    def rest(state=None):
        torch.manual_seed(3)
        dm = module(multi_shards, num_classes=3)
        dm.setup()
        loader = dm.train_dataloader()
        if state is not None:
            loader.load_state_dict(state)
        batches = iter(loader)
        read = [next(batches) for _ in range(2)] if state is None else []
        return loader.state_dict(), read + list(batches)

    state, whole = rest()
    _, resumed = rest(state)
    assert len(whole) == 5 and len(resumed) == 3
    for (images, targets), (again, targets_again) in zip(whole[2:], resumed, strict=True):
        assert torch.equal(images, again) and torch.equal(targets, targets_again)


def test_shards_json_and_an_index_that_disagree_on_several_labels_are_one_error_naming_the_file(multi_shards, tmp_path):
    info = json.loads((multi_shards / "shards.json").read_text())
    single = _copy(multi_shards, tmp_path / "single")
    (single / "shards.json").write_text(json.dumps({**info, "multilabel": False}))
    with pytest.raises(DataError, match=r"train/index.json states items of another format \(data_format="):
        module(single, num_classes=3).setup()
    said = _copy(multi_shards, tmp_path / "said")
    (said / "shards.json").write_text(json.dumps({**info, "multilabel": "yes"}))
    with pytest.raises(DataError, match=r"shards.json: multilabel='yes' is not true or false"):
        module(said, num_classes=3).setup()
