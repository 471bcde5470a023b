"""python -m vit.cli.shards: an image folder, a Hugging Face dataset and CIFAR's files written as litdata shards, each
image's original bytes kept (or resized once), splits held out by seed, bad images judged, and an interrupted write
finished by running the command again."""

import io
import json
import logging
import os
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value
from litdata import StreamingDataset
from PIL import Image as PILImage

from tests.helpers import ROOT, write_cifar
from vit.data.errors import DataError
from vit.data.shards.writer import Encode, write_shards

SIZE = 16


def colour(k: int) -> tuple[int, int, int]:
    return (10 * k, 255 - 10 * k, (70 * k) % 256)


def write_folder(root, per_class=8, test_per_class=2, classes=3, size=(SIZE, SIZE)):
    """root/train/c<i>/<k>.png|jpg and root/val/...: image k of the whole folder is colour(k), every third a JPEG."""
    k = 0
    for split, count in (("train", per_class), ("val", test_per_class)):
        for c in range(classes):
            (root / split / f"c{c}").mkdir(parents=True)
            for _ in range(count):
                kind = "JPEG" if k % 3 == 0 else "PNG"
                PILImage.new("RGB", size, colour(k)).save(
                    root / split / f"c{c}" / f"{k}.{'jpg' if kind == 'JPEG' else 'png'}", kind
                )
                k += 1
    return root


def items(out, split):
    """The items of one written split, in order: {'image', 'label', 'source'}."""
    dataset = StreamingDataset(str(out / split))
    return [dataset[i] for i in range(len(dataset))]


def write(src, out, **settings):
    return write_shards(str(src), str(out), workers=1, chunk_bytes=600, **settings)


def test_an_image_folder_is_written_split_by_split_with_each_files_own_bytes(tmp_path):
    src = write_folder(tmp_path / "folder")
    info = write(src, tmp_path / "out", val_fraction=0.25)
    assert info["classes"] == ["c0", "c1", "c2"] and info["splits"] == {"train": 18, "val": 6, "test": 6}
    assert json.loads((tmp_path / "out" / "shards.json").read_text()) == info
    assert len(list((tmp_path / "out" / "train").glob("chunk-*.bin"))) > 2  # several shards to spread over ranks
    written = {name: items(tmp_path / "out", name) for name in ("train", "val", "test")}
    for split in written.values():
        for item in split:  # the file's own bytes (JPEGs too), its class folder's label
            assert item["image"] == (src / item["source"]).read_bytes()
            assert item["label"] == int(item["source"].split(os.sep)[1][1:])
    sources = {name: sorted(item["source"] for item in split) for name, split in written.items()}
    assert sources["test"] == sorted(os.path.relpath(p, src) for p in src.glob("val/*/*"))
    assert sorted(sources["train"] + sources["val"]) == sorted(os.path.relpath(p, src) for p in src.glob("train/*/*"))
    again = write(src, tmp_path / "again", val_fraction=0.25)  # the held-out images follow the seed alone
    assert sorted(item["source"] for item in items(tmp_path / "again", "val")) == sources["val"] and again == info


def test_resizing_keeps_the_format_and_the_aspect_and_never_enlarges(tmp_path):
    src = tmp_path / "folder"
    for k, (size, kind) in enumerate([((64, 32), "JPEG"), ((30, 90), "PNG"), ((12, 10), "PNG"), ((40, 40), "PNG")]):
        (src / "train" / "c0").mkdir(parents=True, exist_ok=True)
        PILImage.new("RGB", size, colour(k)).save(src / "train" / "c0" / f"{k}.{kind.lower()}", kind)
    write(src, tmp_path / "out", resize_short_side=16, val_fraction=0.25)
    written = items(tmp_path / "out", "train") + items(tmp_path / "out", "val")
    found = {}
    for item in written:
        with PILImage.open(io.BytesIO(item["image"])) as image:
            found[item["source"].rsplit(os.sep, 1)[1]] = (image.format, image.size)
    assert found == {
        "0.jpeg": ("JPEG", (32, 16)),
        "1.png": ("PNG", (16, 48)),
        "2.png": ("PNG", (12, 10)),
        "3.png": ("PNG", (16, 16)),
    }
    small = next(item for item in written if item["source"].endswith("2.png"))
    assert small["image"] == (src / small["source"]).read_bytes()  # smaller than the side: untouched


def test_a_hugging_face_dataset_keeps_its_splits_classes_and_row_bytes(tmp_path):
    stored = [io.BytesIO() for _ in range(12)]
    for k, buffer in enumerate(stored):
        PILImage.new("RGB", (SIZE, SIZE), colour(k)).save(buffer, "JPEG" if k % 2 else "PNG")
    features = Features({"image": Image(), "label": ClassLabel(names=["x", "y", "z"])})

    def rows(first, count):
        return Dataset.from_dict(
            {
                "image": [{"bytes": b.getvalue(), "path": None} for b in stored[first : first + count]],
                "label": [k % 3 for k in range(first, first + count)],
            },
            features=features,
        )

    DatasetDict(train=rows(0, 8), validation=rows(8, 2), test=rows(10, 2)).save_to_disk(tmp_path / "saved")
    info = write(tmp_path / "saved", tmp_path / "out")
    assert info["source_kind"] == "Hugging Face dataset" and info["classes"] == ["x", "y", "z"]
    assert info["splits"] == {"train": 8, "val": 2, "test": 2}  # its own validation split, as there is a test split
    for name, first in (("train", 0), ("val", 8), ("test", 10)):
        written = items(tmp_path / "out", name)
        assert [item["source"] for item in written] == [
            f"{name if name != 'val' else 'validation'} row {r}" for r in range(len(written))
        ]
        assert [item["image"] for item in written] == [b.getvalue() for b in stored[first : first + len(written)]]
        assert [item["label"] for item in written] == [k % 3 for k in range(first, first + len(written))]


def test_the_shards_hold_out_the_images_data_imagefolder_and_data_hf_hold_out_with_bad_images_left_out_first(tmp_path):
    """One draw (vit/data/encoded/held_out.py) over the usable training images, whichever reads the folder or dataset:
    the writer used to draw over every file and judge them after, so one bad image moved the held-out split."""
    from vit.data.encoded.hf import HFDataModule
    from vit.data.encoded.imagefolder import ImageFolderDataModule

    src = write_folder(tmp_path / "folder")
    (src / "train" / "c0" / "1.png").write_bytes(b"")
    bad = dict(skip_bad_images=True, max_bad_fraction=0.1, val_fraction=0.25)
    info = write(src, tmp_path / "out", **bad)
    assert info["bad_images"] == [os.path.join("train", "c0", "1.png")]
    folder = ImageFolderDataModule(root=str(src), num_classes=3, img_size=SIZE, num_workers=0, **bad)
    with pytest.warns(UserWarning, match="leaving out 1 bad image"):
        folder.setup()
    held = sorted(os.path.relpath(folder.val_set.dataset.samples[k][0], src) for k in folder.val_set.indices)
    assert sorted(item["source"] for item in items(tmp_path / "out", "val")) == held

    rows = [(src / item["source"]).read_bytes() for item in items(tmp_path / "out", "train")]
    rows.insert(3, b"not an image")
    features = Features({"image": Image(), "label": ClassLabel(names=["x", "y"])})
    dataset = Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in rows], "label": [k % 2 for k in range(len(rows))]}, features
    )
    dataset.save_to_disk(tmp_path / "saved")
    info = write(tmp_path / "saved", tmp_path / "from_hf", **bad)
    assert info["bad_images"] == ["train row 3"]
    hf = HFDataModule(root=str(tmp_path / "saved"), num_classes=2, img_size=SIZE, num_workers=0, **bad)
    hf.setup()
    held = sorted(f"train row {row}" for row in hf.val_set.rows)
    assert sorted(item["source"] for item in items(tmp_path / "from_hf", "val")) == held


def write_label_file(src, multilabel=True, split=True):
    """A label file for write_folder's train/ images, none of val/'s: image k is of classes {k % 3, (k + 1) % 3} (or
    k % 3 alone), the first three test images (with a split column)."""
    paths = sorted(src.glob("train/*/*"), key=lambda p: int(p.stem))
    rows = [f"image,{'labels' if multilabel else 'label'}{',split' if split else ''}"]
    for k, path in enumerate(paths):
        names = f"c{k % 3};c{(k + 1) % 3}" if multilabel else f"c{k % 3}"
        where = f",{'test' if k < 3 else 'train'}" if split else ""
        rows.append(f"{path.relative_to(src).as_posix()},{names}{where}")
    (src / "labels.csv").write_text("\n".join(rows) + "\n")
    return src / "labels.csv"


@pytest.mark.parametrize(("split", "counts"), [(True, (16, 5, 3)), (False, (14, 4, 6))], ids=["split", "no split"])
def test_a_folder_with_a_label_file_is_written_with_its_splits_and_each_images_class_indices(tmp_path, split, counts):
    """Split by its split column, or held out by the seed, as data=imagefolder splits it."""
    from vit.data.encoded.imagefolder import ImageFolderDataModule

    src = write_folder(tmp_path / "folder", test_per_class=0)
    labels = write_label_file(src, split=split)
    info = write(src, tmp_path / "out", val_fraction=0.25, labels=str(labels))
    assert info["multilabel"] is True and info["classes"] == ["c0", "c1", "c2"]
    assert list(info["splits"].values()) == list(counts) and info["settings"]["labels"] == str(labels)
    written = {name: items(tmp_path / "out", name) for name in ("train", "val", "test")}
    for item in [item for split in written.values() for item in split]:  # 1-D int64: each image's own classes
        k = int(item["source"].rsplit("/", 1)[1].split(".")[0])
        assert item["label"].dtype == torch.int64 and item["label"].tolist() == sorted({k % 3, (k + 1) % 3})
    folder = ImageFolderDataModule(root=str(src), labels=str(labels), num_classes=3, img_size=SIZE, num_workers=0,
                                   val_fraction=0.25)  # fmt: skip
    folder.setup()
    for name, dataset in (("train", folder.train_set), ("val", folder.val_set), ("test", folder.test_set)):
        read = sorted(os.path.relpath(path, src) for path, _ in dataset.samples)  # the splits data=imagefolder reads
        assert sorted(item["source"] for item in written[name]) == read
    one = write(src, tmp_path / "one", labels=str(write_label_file(src, multilabel=False)))
    assert one["multilabel"] is False and {item["label"] for item in items(tmp_path / "one", "test")} == {0, 1, 2}


def test_a_hugging_face_sequence_of_class_labels_is_written_as_each_rows_class_indices(tmp_path):
    from datasets import List

    stored = [io.BytesIO() for _ in range(6)]
    for k, buffer in enumerate(stored):
        PILImage.new("RGB", (SIZE, SIZE), colour(k)).save(buffer, "PNG")
    sets = [[k % 3, (k + 2) % 3] if k % 2 else [] for k in range(6)]
    features = Features({"image": Image(), "label": List(ClassLabel(names=["x", "y", "z"]))})
    rows = Dataset.from_dict({"image": [{"bytes": b.getvalue(), "path": None} for b in stored], "label": sets},
                             features=features)  # fmt: skip
    DatasetDict(train=rows.select(range(4)), test=rows.select(range(4, 6))).save_to_disk(tmp_path / "saved")
    info = write(tmp_path / "saved", tmp_path / "out", val_fraction=0.25)
    assert info["multilabel"] is True and info["classes"] == ["x", "y", "z"]
    assert [item["label"].tolist() for item in items(tmp_path / "out", "test")] == [[], sorted(sets[5])]


def test_cifar_files_become_lossless_pngs_of_their_arrays(tmp_path):
    test_batch = write_cifar(tmp_path / "cifar", per_file=4)
    info = write(tmp_path / "cifar", tmp_path / "out")
    assert info["source_kind"] == "cifar10" and info["num_classes"] == 10
    assert info["splits"] == {"train": 19, "val": 1, "test": 4}
    written = items(tmp_path / "out", "test")
    for k, item in enumerate(written):
        pixels = np.asarray(PILImage.open(io.BytesIO(item["image"])))
        assert PILImage.open(io.BytesIO(item["image"])).format == "PNG"
        assert np.array_equal(pixels, test_batch["data"][k].reshape(3, 32, 32).transpose(1, 2, 0))
        assert item["label"] == test_batch["labels"][k]


def test_bad_images_are_named_or_left_out_and_listed(tmp_path):
    src = write_folder(tmp_path / "folder")
    (src / "train" / "c1" / "10.png").write_bytes((src / "train" / "c1" / "10.png").read_bytes()[:40])
    with pytest.raises(DataError, match=r"1 bad image\(s\) in split train of .*\n  train/c1/10.png: "):
        write(src, tmp_path / "out")
    info = write(src, tmp_path / "skipped", skip_bad_images=True, max_bad_fraction=0.1, val_fraction=0.25)
    assert info["bad_images"] == ["train/c1/10.png"] and info["splits"]["train"] + info["splits"]["val"] == 23


def test_a_dataset_row_naming_a_missing_file_is_a_bad_image_and_a_valid_split_is_its_validation_split(tmp_path):
    """As data=hf reads them: a row whose file is gone is judged (it ended the write with a bare FileNotFoundError),
    and a split saved as 'valid' is the dataset's validation split (it was left unwritten)."""
    paths = []
    for k in range(14):
        PILImage.new("RGB", (SIZE, SIZE), colour(k)).save(tmp_path / f"{k}.png")
        paths.append(str(tmp_path / f"{k}.png"))
    paths[3] = str(tmp_path / "gone.png")
    features = Features({"image": Value("string"), "label": ClassLabel(names=["x", "y"])})  # the files' paths

    def rows(first, count):
        labels = [k % 2 for k in range(first, first + count)]
        return Dataset.from_dict({"image": paths[first : first + count], "label": labels}, features)

    DatasetDict(train=rows(0, 10), valid=rows(10, 2), test=rows(12, 2)).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match=r"1 bad image\(s\) in split train of .*\n  train row 3: FileNotFoundError"):
        write(tmp_path / "saved", tmp_path / "out")
    with pytest.warns(UserWarning, match=r"leaving out 1 bad image"):
        info = write(tmp_path / "saved", tmp_path / "skipped", skip_bad_images=True, max_bad_fraction=0.1)
    assert info["bad_images"] == ["train row 3"] and info["splits"] == {"train": 9, "val": 2, "test": 2}
    assert [item["source"] for item in items(tmp_path / "skipped", "val")] == ["valid row 0", "valid row 1"]


def test_an_empty_source_other_settings_and_a_missing_source_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere does not exist"):
        write(tmp_path / "nowhere", tmp_path / "out", kind="imagefolder")
    # the source guessed: a missing path was "Hugging Face dataset not found: data.root=...", keys never given
    with pytest.raises(FileNotFoundError, match=r"nowhere does not exist \(nor is it a Hugging Face hub name\)$"):
        write(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty" / "train" / "c0").mkdir(parents=True)
    with pytest.raises(DataError, match=r"split train of .*empty holds no images"):
        write(tmp_path / "empty", tmp_path / "out")
    src = write_folder(tmp_path / "folder", per_class=2, test_per_class=1)
    with pytest.raises(DataError, match=r"val_fraction=1\.0 holds out 6 of 6 training images, leaving none"):
        write(src, tmp_path / "out", val_fraction=1.0)
    write(src, tmp_path / "out")
    with pytest.raises(DataError, match=r"shards.json was written with other settings"):
        write(src, tmp_path / "out", resize_short_side=8)


def test_bad_numbers_are_refused_in_one_line_naming_the_flag_before_any_work(tmp_path, capsys):
    """--resize-short-side 0 used to write the original bytes and -5 to fail in litdata's workers, after shards.json
    had taken the setting."""
    from vit.cli.shards import main

    src, out = write_folder(tmp_path / "folder", per_class=2, test_per_class=1), tmp_path / "out"
    for flag, value in [
        ("--resize-short-side", "0"),
        ("--resize-short-side", "-5"),
        ("--workers", "0"),
        ("--chunk-bytes", "0"),
        ("--chunk-bytes", "64XB"),
        ("--val-fraction", "1.5"),
        ("--max-bad-fraction", "nan"),
    ]:
        with pytest.raises(SystemExit) as refused:
            main([str(src), str(out), flag, value])
        assert refused.value.code == 2
        (line,) = capsys.readouterr().err.splitlines()  # one line: no usage, no traceback
        assert line.startswith(f"error: argument {flag}: '{value}' is not")
        assert not out.exists()
    with pytest.raises(DataError, match=r"resize_short_side=0: give 1 px or more"):
        write(src, out, resize_short_side=0)
    assert not out.exists()


def failing_at(position):
    """Encode.__call__ raising at item `position` of each split, as Pillow does when asked for a size of 0."""
    original = Encode.__call__

    def call(self, k):
        if k == position:
            raise ValueError("height and width must be > 0")
        return original(self, k)

    return call


def process_group() -> dict[int, int]:
    """The live processes of this process's group and each one's parent: forked writers stay in it, orphaned
    (parent 1) or not."""
    group, found = os.getpgid(0), {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError):  # ended meanwhile
            state, parent, pgid = stat.read_text().rsplit(")", 1)[1].split()[:3]  # after '(name)'
            if int(pgid) == group and state != "Z":
                found[int(stat.parent.name)] = int(parent)
    return found


def started_here(before: dict[int, int]) -> set[int]:
    """The processes of the group that are not in `before` and descend from this process or from none that was:
    this process's and its orphans', not those other test processes of the group (pytest -n) started meanwhile."""
    now = process_group()

    def ours(pid: int) -> bool:
        while pid not in before and pid in now:
            pid = now[pid]
        return pid == os.getpid() or pid not in before  # reached this process, or an orphan's parent 1

    return {pid for pid in now.keys() - before.keys() if ours(pid)}


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="reads processes from /proc (Linux)")
def test_a_failed_write_ends_every_process_it_started_and_names_its_cause_in_one_line(tmp_path, monkeypatch):
    """litdata terminated its workers but not the process each worker starts, which lived on orphaned, holding
    stdout (`... | tail` never ended); the error held a worker's whole traceback."""
    src, out = write_folder(tmp_path / "folder"), tmp_path / "out"
    monkeypatch.setattr(Encode, "__call__", failing_at(0))
    before = process_group()
    with pytest.raises(DataError) as failed:
        write(src, out, val_fraction=0.25)
    assert started_here(before) == set()
    assert str(failed.value) == (
        f"writing {out / 'train'} failed (ValueError: height and width must be > 0); rerun to continue"
    )


def test_a_write_that_failed_before_storing_an_image_takes_other_settings_and_one_that_stored_some_does_not(
    tmp_path, monkeypatch
):
    """shards.json, written before the first split, used to refuse a rerun with corrected settings although no image
    was stored under the first; once one is, other settings would mix two writes in one split."""
    src, out = write_folder(tmp_path / "folder"), tmp_path / "out"
    monkeypatch.setattr(Encode, "__call__", failing_at(0))
    with pytest.raises(DataError, match="failed"):
        write(src, out, val_fraction=0.25, resize_short_side=64)
    monkeypatch.undo()
    # other images too (12 in train/, not 18): litdata's record of the 18 would refuse them as another write's
    info = write(src, out, val_fraction=0.5, resize_short_side=8)
    assert info["complete"] and info["settings"]["resize_short_side"] == 8
    assert info["splits"] == {"train": 12, "val": 12, "test": 6}

    monkeypatch.setattr(Encode, "__call__", failing_at(13))  # of train/'s 18, after some shards are stored
    with pytest.raises(DataError, match="failed"):
        write(src, tmp_path / "stored", val_fraction=0.25)
    assert list((tmp_path / "stored" / "train").glob("chunk-*.bin"))
    monkeypatch.undo()
    with pytest.raises(DataError, match=r"shards.json was written with other settings"):
        write(src, tmp_path / "stored", val_fraction=0.5)
    info = write(src, tmp_path / "stored", val_fraction=0.25)  # the same settings finish it
    assert info["complete"] and info["splits"] == {"train": 18, "val": 6, "test": 6}


# A write killed outright (SIGKILL to its process group, as a scheduler ends a job) at item 13 of train/'s 18
KILLED = """
import os, signal, sys
import vit.data.shards.writer as shards

original = shards.Encode.__call__
def killing(self, k):
    if len(self.split) == 18 and k == 13:
        os.killpg(0, signal.SIGKILL)
    return original(self, k)
shards.Encode.__call__ = killing
shards.write_shards(sys.argv[1], sys.argv[2], val_fraction=0.25, workers=1, chunk_bytes=600)
"""


@pytest.mark.slow  # a writer process, killed, and two writes: ~10 s
def test_a_write_killed_mid_split_is_finished_by_running_it_again(tmp_path):
    src = write_folder(tmp_path / "folder")
    killed = subprocess.run(
        [sys.executable, "-c", KILLED, str(src), str(tmp_path / "out")],
        cwd=ROOT,
        start_new_session=True,  # its own process group, which it kills with its workers
        capture_output=True,
        timeout=120,
    )
    assert killed.returncode == -signal.SIGKILL
    out = tmp_path / "out"
    assert not json.loads((out / "shards.json").read_text())["complete"] and not (out / "train" / "index.json").exists()
    before = {p.name: p.stat().st_mtime_ns for p in (out / "train").glob("chunk-*.bin")}
    assert before  # some shards were written before the kill
    info = write(src, out, val_fraction=0.25)
    assert {name: (out / "train" / name).stat().st_mtime_ns for name in before} == before  # kept, not rewritten
    assert info["complete"] and info["splits"] == {"train": 18, "val": 6, "test": 6}
    whole = write(src, tmp_path / "whole", val_fraction=0.25)
    for split in ("train", "val", "test"):  # the same items, in the same order, as a write never killed
        assert items(out, split) == items(tmp_path / "whole", split)
    assert whole["splits"] == info["splits"]


def test_the_command_prints_its_summary_and_not_litdatas_advert_or_worker_chatter(tmp_path, capfd, caplog):
    from vit.cli.shards import main

    caplog.set_level(logging.INFO)
    main([str(write_folder(tmp_path / "folder")), str(tmp_path / "out"), "--workers", "2"])
    out, err = capfd.readouterr()  # the forked writers' prints included
    assert out.splitlines() == [f"wrote {tmp_path / 'out'}: 3 classes; images: train 23, val 1, test 6"]
    logged = caplog.text + err
    assert "decoded the 24 images of split train" in logged  # our own progress lines stay
    assert "max_cache_size" not in logged  # litdata's reader cache, which writing never uses
    # litdata's progress bar redraws itself with cursor moves: in a log (stderr not a terminal) it is left out
    assert "\x1b[A" not in err and "Progress" not in err


def test_the_command_writes_a_folder_with_a_label_file_leaving_out_images_without_a_row_when_told(tmp_path, capfd):
    from vit.cli.shards import main

    src = write_folder(tmp_path / "folder")  # val/'s six images have no row
    command = [str(src), str(tmp_path / "out"), "--labels", str(write_label_file(src)), "--workers", "1"]
    with pytest.raises(SystemExit, match=r"^error: 6 image\(s\) under data\.root=.* have no row in .*labels\.csv"):
        main(command)
    main([*command, "--unlabeled", "skip"])
    assert capfd.readouterr().out.splitlines() == [
        f"wrote {tmp_path / 'out'}: 3 classes; images: train 20, val 1, test 3"
    ]
    assert json.loads((tmp_path / "out" / "shards.json").read_text())["multilabel"] is True
