"""Shards written and read as a hostile user or a bad disk would have them: a folder whose index.json asks litdata to
unpickle its items (code that would run), a corrupted chunk header, an index or shards.json of the wrong shape, OUT
a file, and a disk that fills up mid-write. Each stops with one line naming the file, the value or the disk; nothing
in the shards runs; a write stopped by a full disk finishes, identical, when rerun with room."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from litdata import optimize

from tests.data.encoded.test_stream import module, write_folder
from tests.helpers import ROOT
from vit.cli.shards import main
from vit.data.errors import DataError
from vit.data.shards.writer import write_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile_shards")
    write_shards(str(write_folder(root / "folder")), str(root / "out"), val_fraction=1 / 6, workers=1, chunk_bytes=700)
    return root / "out"


def _copy(shards: Path, to: Path) -> Path:
    shutil.copytree(shards, to)
    return to


def _edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


class Payload:
    """Unpickled, it creates the file it names: the proof that a shard's item ran code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _payload_item(k: int, marker: str = "") -> dict:
    return {"image": Payload(marker), "label": 0, "source": f"payload {k}"}


def test_a_folder_whose_items_would_be_unpickled_is_refused_before_any_item_is_read(shards, tmp_path):
    """litdata stores objects it has no format for with pickle and unpickles them when read: such a split, in
    place of ours, is refused naming its index.json and the format, and the payload never runs."""
    marker = tmp_path / "ran"
    bad = _copy(shards, tmp_path / "bad")
    shutil.rmtree(bad / "train")
    optimize(
        fn=_PayloadWriter(str(marker)), inputs=list(range(4)), output_dir=str(bad / "train"), chunk_bytes=700,
        num_workers=1, verbose=False, start_method="fork",  # as vit's writer: a spawned worker imports torch anew
    )  # fmt: skip
    assert "pickle" in json.loads((bad / "train" / "index.json").read_text())["config"]["data_format"]
    for workers in (0, 2):
        dm = module(bad, num_workers=workers)
        with pytest.raises(
            DataError, match=rf"^{bad / 'train' / 'index.json'} states items of another format .*pickle"
        ):
            dm.setup()
    assert not marker.exists()


class _PayloadWriter:
    def __init__(self, marker: str):
        self.marker = marker

    def __call__(self, k: int) -> dict:
        return _payload_item(k, self.marker)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda i: i["config"].update(data_format=["bytes", "int", "weird"]), r"states items of another format"),
        (lambda i: i["config"].update(item_loader="TokensLoader"), r"item_loader='TokensLoader'"),
        (lambda i: i["config"].update(compression="zstd"), r"compression='zstd'"),
        (lambda i: i["config"].update(data_spec='[1, {"type": "builtins.list"}]'), r"data_spec="),
        (lambda i: i["chunks"][0].pop("filename"), r"chunk 0 has no plain file name \(filename=None\)"),
        (lambda i: i["chunks"][0].update(filename="../../shards.json"), r"chunk 0 has no plain file name"),
        (lambda i: i["chunks"][1].update(chunk_bytes="many"), r"chunk chunk-0-1.bin states .*chunk_bytes='many'"),
        (lambda i: i.pop("config"), r"is not a litdata index"),
    ],
    ids=["unknown format", "another loader", "compressed", "another item shape", "no file name", "a path",
         "bytes not a count", "no config"],
)  # fmt: skip
def test_an_index_of_another_shape_or_format_is_one_error_naming_it(shards, tmp_path, change, message):
    bad = _copy(shards, tmp_path / "bad")
    _edit(bad / "train" / "index.json", change)
    with pytest.raises(DataError, match=rf"^{bad / 'train' / 'index.json'}(:| ).*{message}"):
        module(bad).setup()


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("splits", ["train", "val"], r"splits=\['train', 'val'\] is not a mapping"),
        ("num_classes", "abc", r"num_classes='abc' is not a whole number"),
        ("classes", "c00", r"classes='c00' is not a list"),
        ("complete", "yes", r"complete='yes' is not true or false"),
    ],
)
def test_a_shards_json_of_the_wrong_types_is_one_error_naming_the_file_and_key(shards, tmp_path, key, value, message):
    from tests.helpers import compose

    bad = _copy(shards, tmp_path / "bad")
    _edit(bad / "shards.json", lambda info: info.update({key: value}))
    with pytest.raises(DataError, match=rf"^{bad / 'shards.json'}: {message}"):
        module(bad).setup()
    # the config counts the classes from it as it resolves: the same line, not OmegaConf's AttributeError
    with pytest.raises(Exception) as raised:
        compose("data=stream", f"data.root={bad}").data.num_classes  # noqa: B018
    from vit.training.checks import data_fault

    assert str(data_fault(raised.value) or raised.value).startswith(f"{bad / 'shards.json'}: {key}=")


def test_a_shard_whose_header_was_corrupted_in_place_is_one_error_naming_it(shards, tmp_path):
    """litdata checks a chunk's header as it reads ahead, outside the dataset's own item reads."""
    bad = _copy(shards, tmp_path / "bad")
    chunk = bad / "train" / "chunk-0-0.bin"
    data = bytearray(chunk.read_bytes())
    data[:4] = b"\xff\xff\xff\xff"  # the item count
    chunk.write_bytes(bytes(data))
    dm = module(bad)
    dm.setup()
    with pytest.raises(DataError, match=rf"^cannot read the shards in {bad / 'train'} \(RuntimeError: .*{chunk}"):
        list(dm.train_dataloader())


def test_shards_onto_an_existing_file_is_one_line(shards, tmp_path):
    (tmp_path / "taken").write_text("not a folder")
    with pytest.raises(SystemExit) as stopped:
        main([str(shards.parent / "folder"), str(tmp_path / "taken")])
    assert str(stopped.value.code) == (
        f"error: OUT={tmp_path / 'taken'} is a file, not a folder: choose a folder to write the shards into"
    )


# A disk that fills: a tmpfs of a few blocks, mounted in a mount namespace of the test's own (no root needed beyond
# what unshare allows, nothing left mounted); the same shell grows it and reruns the write.
FULL_DISK = """
set -u
mount -t tmpfs -o size={size} tmpfs {disk}
{python} -c "$WRITE" {src} {disk}/out > {log}.1 2>&1; echo $? > {log}.rc1
mount -o remount,size=4m {disk}
{python} -c "$WRITE" {src} {disk}/out > {log}.2 2>&1; echo $? > {log}.rc2
cp -r {disk}/out {copy}
"""
WRITE = """
import sys
import vit.data.shards.disk_space, vit.data.shards.writer
vit.data.shards.disk_space.STALL_SECONDS = 1.0
if {unforeseen}:  # the disk fills from elsewhere: the estimate before writing sees room, the watch must stop it
    vit.data.shards.writer.check_space = lambda *args: None
from vit.cli.shards import main
main([*sys.argv[1:], "--workers", "1", "--chunk-bytes", "700", "--val-fraction", "0.1666"])
"""


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return (
        subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True).returncode == 0
    )


@pytest.mark.slow  # three writes in processes of their own, each importing litdata: ~20 s
@pytest.mark.skipif(not _unshare_works(), reason="no mount namespace to mount a small disk in (unshare -rm)")
@pytest.mark.parametrize("unforeseen", [False, True], ids=["known before writing", "filled while writing"])
def test_a_disk_that_fills_stops_the_write_in_one_line_and_a_rerun_with_room_finishes_it(tmp_path, unforeseen):
    """litdata's writer hung for ever when the disk filled at its last write: now the write stops naming the disk
    and the bytes, every process it started ended, and the same command with room writes what a roomy disk does."""
    src = write_folder(tmp_path / "folder")
    disk, log = tmp_path / "disk", tmp_path / "log"
    disk.mkdir()
    script = FULL_DISK.format(
        size="100k", disk=disk, python=sys.executable, src=src, log=log, copy=tmp_path / "written"
    )
    env = {**os.environ, "WRITE": WRITE.format(unforeseen=unforeseen), "PYTHONPATH": str(ROOT)}
    subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, cwd=ROOT, timeout=180, check=True)
    first = Path(f"{log}.1").read_text().strip().splitlines()[-1]
    assert Path(f"{log}.rc1").read_text().strip() == "1", first
    if unforeseen:  # stopped in the middle of some split's write
        assert re.match(rf"error: the disk of {disk / 'out'}/(train|val|test) is full \([\d,]+ bytes free; ", first)
    else:  # before anything is written
        assert re.match(
            rf"error: the disk of {disk / 'out'} has [\d,]+ bytes free, but writing train, val, test ", first
        )
    assert first.endswith("then rerun to continue")
    assert Path(f"{log}.rc2").read_text().strip() == "0", Path(f"{log}.2").read_text()[-2000:]
    roomy = tmp_path / "roomy"
    subprocess.run(["sh", "-c", f'{sys.executable} -c "$WRITE" {src} {roomy}'], env=env, cwd=ROOT, check=True)
    for split in ("train", "val", "test"):
        written, expected = tmp_path / "written" / split, roomy / split
        assert sorted(p.name for p in written.glob("chunk-*")) == sorted(p.name for p in expected.glob("chunk-*"))
        for chunk in expected.glob("chunk-*"):
            assert (written / chunk.name).read_bytes() == chunk.read_bytes(), chunk
        assert (
            json.loads((written / "index.json").read_text())["chunks"]
            == json.loads((expected / "index.json").read_text())["chunks"]
        )
