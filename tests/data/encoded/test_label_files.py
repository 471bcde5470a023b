"""data=imagefolder data.labels=FILE: images anywhere under data.root with a label file naming each image's class or
classes, in CSV, TSV, JSON Lines and Parquet; several labels an image as multi-hot targets (B, K); every bad input
one error naming the file and the line or row, and nothing left out unsaid."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from PIL import Image

from tests.helpers import compose
from vit.data.encoded.held_out import hold_out
from vit.data.encoded.imagefolder import ImageFolderDataModule
from vit.data.encoded.label_files import read_label_file
from vit.data.errors import DataError

SIZE = 8
# (image, its labels, split): four images of one or two of the classes cat, dog, owl
ROWS = [
    ("a/0.png", ["cat"], "train"),
    ("a/1.png", ["dog", "cat"], "train"),
    ("b/2.png", ["owl"], "train"),
    ("b/3.png", ["dog"], "train"),
    ("c/4.png", ["cat", "owl"], "val"),
    ("c/5.png", ["dog"], "test"),
]
CLASSES = ["cat", "dog", "owl"]


def colour(k: int) -> tuple[int, int, int]:
    return (10 * k, 200 - 10 * k, 90)


def write_images(root, paths=tuple(row[0] for row in ROWS)):
    """Image k, a solid colour(k), at path k (ROWS' paths): a pixel names the image it came from."""
    for k, path in enumerate(paths):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (SIZE, SIZE), colour(k)).save(root / path)
    return root


def write_labels(path, rows, multilabel=True, split=True, separator=";"):
    """rows as the label file `path`'s format writes them (by its extension)."""
    kind = "labels" if multilabel else "label"
    records = [
        {"image": image, kind: names if multilabel else names[0], **({"split": where} if split else {})}
        for image, names, where in rows
    ]
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        delimiter = "\t" if path.suffix == ".tsv" else ","
        lines = [delimiter.join(records[0])]
        for record in records:
            cells = [separator.join(v) if isinstance(v, list) else v for v in record.values()]
            lines.append(delimiter.join(f'"{cell}"' if delimiter in cell else cell for cell in cells))
        path.write_text("\n".join(lines) + "\n")
    return path


def make(root, labels, **kw):
    values = dict(num_classes=3, img_size=SIZE, crop_pct=1.0, num_workers=0, batch_size=2, eval_batch_size=32)
    return ImageFolderDataModule(root=str(root), labels=str(labels), **{**values, **kw})


def read_all(dm, split):
    """A split's (colour index, target) pairs as evaluation reads them, in order."""
    images, targets = dm.on_after_batch_transfer(next(iter(dm.evaluation_loader(split))), 0)
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    red = ((images * std + mean) * 255).round()[:, 0, 0, 0]
    return [(int(r) // 10, t.tolist()) for r, t in zip(red, targets, strict=True)]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_each_format_gives_each_image_its_multi_hot_labels_and_its_split(tmp_path, suffix):
    root = write_images(tmp_path / "photos")
    dm = make(root, write_labels(tmp_path / f"labels{suffix}", ROWS))
    dm.setup()
    assert dm.classes == CLASSES and dm.multilabel and dm.facts()["multilabel"] is True
    hot = {k: [float(name in names) for name in CLASSES] for k, (_, names, _) in enumerate(ROWS)}
    assert read_all(dm, "train") == [(k, hot[k]) for k in range(4)]  # the pixels and labels of the same image
    assert read_all(dm, "val") == [(4, hot[4])] and read_all(dm, "test") == [(5, hot[5])]
    images, targets = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert images.shape == (2, 3, SIZE, SIZE) and targets.shape == (2, 3) and targets.dtype == torch.float32


def test_one_label_an_image_stays_an_int_label(tmp_path):
    root = write_images(tmp_path / "photos")
    dm = make(root, write_labels(tmp_path / "labels.csv", ROWS, multilabel=False))
    dm.setup()
    assert not dm.multilabel and dm.facts()["multilabel"] is False
    assert read_all(dm, "train") == [(0, 0), (1, 1), (2, 2), (3, 1)]  # each row's one (first) class
    assert next(iter(dm.train_dataloader()))[1].dtype == torch.int64


@pytest.mark.parametrize(
    "cells, expected",
    [
        (["cat;dog", "owl | cat", "dog"], [["cat", "dog"], ["owl | cat"], ["dog"]]),  # ';' anywhere: ';' splits
        (["cat|dog", "owl cat", "dog"], [["cat", "dog"], ["owl cat"], ["dog"]]),  # else '|'
        (["cat dog", "owl  cat", ""], [["cat", "dog"], ["owl", "cat"], []]),  # else whitespace; empty: none
    ],
    ids=["semicolon", "bar", "whitespace"],
)
def test_a_csv_labels_cell_is_split_by_the_separator_the_column_holds(tmp_path, cells, expected):
    path = tmp_path / "labels.csv"
    path.write_text("image,labels\n" + "".join(f"{k}.png,{cell}\n" for k, cell in enumerate(cells)))
    table = read_label_file(path)
    assert [[table.classes[k] for k in labels] for labels in table.labels] == [sorted(names) for names in expected]


def test_class_names_are_sorted_numerically_where_all_are_whole_numbers(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("image,label\n" + "".join(f"{k}.png,{name}\n" for k, name in enumerate([10, 2, 1, 2])))
    assert read_label_file(path).classes == ["1", "2", "10"]
    path.write_text("image,label\n0.png,b10\n1.png,b2\n")
    assert read_label_file(path).classes == ["b10", "b2"]


def test_without_a_split_column_the_test_and_validation_sets_are_held_out_by_the_seed(tmp_path):
    paths = [f"{k}.png" for k in range(20)]
    root = write_images(tmp_path / "photos", paths)
    rows = [(path, [CLASSES[k % 3]], None) for k, path in enumerate(paths)]
    dm = make(root, write_labels(tmp_path / "labels.jsonl", rows, split=False), val_fraction=0.2)
    dm.setup()
    test = [k for k, _ in read_all(dm, "test")]
    _, held = hold_out(20, 0.2, 0)  # the test set: drawn from the file's rows by the seed alone
    assert test == sorted(held) and len(dm.val_set) == 3 and len(dm.train_set) == 13
    seen = [k for k, _ in read_all(dm, "train") + read_all(dm, "val")]
    assert sorted(seen + test) == list(range(20))
    other = make(root, tmp_path / "labels.jsonl", val_fraction=0.2, split_seed=1)
    other.setup()
    assert [k for k, _ in read_all(other, "test")] != test


def test_val_rows_without_test_rows_are_the_test_set(tmp_path):
    """As for Hugging Face datasets: a file's val rows test, and validation is held out of its training rows."""
    root = write_images(tmp_path / "photos")
    rows = [(image, names, "val" if split == "test" else split) for image, names, split in ROWS]
    dm = make(root, write_labels(tmp_path / "labels.csv", rows), val_fraction=0.25)
    dm.setup()
    assert [k for k, _ in read_all(dm, "test")] == [4, 5] and len(dm.val_set) == 1 and len(dm.train_set) == 3


def test_the_config_counts_the_files_classes(tmp_path):
    root = write_images(tmp_path / "photos")
    labels = write_labels(tmp_path / "labels.tsv", ROWS)
    cfg = compose("data=imagefolder", f"data.root={root}", f"data.labels={labels}")
    assert cfg.data.num_classes == cfg.model.num_classes == 3


def test_a_device_decoded_and_a_native_size_batch_carry_multi_hot_targets(tmp_path):
    root = write_images(tmp_path / "photos")
    labels = write_labels(tmp_path / "labels.csv", ROWS)
    for settings in ({"decode": "device", "auto_augment": None}, {"max_tokens": 4}):
        dm = make(root, labels, **settings)
        dm.patch_size = (4, 4)
        dm.setup()
        images, targets = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
        assert len(images) == 2 and targets.shape == (2, 3) and targets.dtype == torch.float32


def test_a_training_pass_resumed_mid_epoch_reads_the_images_and_targets_of_the_whole_pass(tmp_path):
    """In two workers, whose augmentation follows the epoch and the image (vit/data/loading.py)."""
    paths = [f"{k}.png" for k in range(12)]
    root = write_images(tmp_path / "photos", paths)
    rows = [(path, CLASSES[: 1 + k % 3], "train" if k < 10 else "test") for k, path in enumerate(paths)]
    labels = write_labels(tmp_path / "labels.csv", rows)

    def loader(state=None):
        torch.manual_seed(3)
        dm = make(root, labels, val_fraction=0.2, num_workers=2)
        dm.setup()
        loader = dm.train_dataloader()
        if state:
            loader.load_state_dict(state)
        loader.sampler.set_epoch(1)
        return [torch.cat(parts) for parts in zip(*loader, strict=True)]

    (images, targets), (resumed_images, resumed_targets) = loader(), loader({"epoch": 1, "batches": 1})
    assert torch.equal(resumed_images, images[2:]) and torch.equal(resumed_targets, targets[2:])
    assert targets.shape == (8, 3) and set(targets.sum(1).tolist()) == {1.0, 2.0, 3.0}


# --- bad input: one line each, naming the file and the line or row -------------------------------------------------


def test_a_row_naming_a_missing_image_is_named_with_its_line(tmp_path):
    root = write_images(tmp_path / "photos", [row[0] for row in ROWS[:2]])
    labels = write_labels(tmp_path / "labels.csv", [*ROWS[:2], ("a/gone.png", ["cat"], "test")])
    with pytest.raises(DataError, match=rf"{labels} line 4: image 'a/gone\.png' is not a file under data\.root"):
        make(root, labels, num_classes=2).setup()
    parquet = write_labels(tmp_path / "labels.parquet", [*ROWS[:2], ("a/gone.png", ["cat"], "test")])
    with pytest.raises(DataError, match=rf"{parquet} row 3: image 'a/gone\.png' .*\(1 missing image\(s\) in all\)"):
        make(root, parquet, num_classes=2).setup()


def test_images_without_a_row_are_refused_by_count_and_name_or_skipped_and_counted(tmp_path, caplog):
    root = write_images(tmp_path / "photos")
    write_images(root, ["extra/x.png", "extra/y.png"])
    labels = write_labels(tmp_path / "labels.csv", ROWS)
    with pytest.raises(DataError, match=r"2 image\(s\) under data\.root=.* have no row in .*labels\.csv \(extra/x\."):
        make(root, labels).setup()
    caplog.set_level(logging.INFO)
    dm = make(root, labels, unlabeled="skip")
    dm.setup()
    assert "leaving out 2 image(s)" in caplog.text and len(dm.train_set) + len(dm.val_set) + len(dm.test_set) == 6
    with pytest.raises(DataError, match=r"data\.unlabeled='drop': give one of error, skip"):
        make(root, labels, unlabeled="drop")


def test_two_rows_naming_one_image_with_other_labels_are_refused_and_the_same_read_once(tmp_path, caplog):
    labels = write_labels(tmp_path / "labels.csv", [*ROWS, ("./a/1.png", ["dog"], "train")])
    with pytest.raises(DataError, match=r"line 3 and line 8 both name image 'a/1\.png', with labels \['dog', 'cat'\]"):
        read_label_file(labels)
    caplog.set_level(logging.INFO)
    table = read_label_file(write_labels(tmp_path / "same.csv", [*ROWS, ("a/1.png", ["cat", "dog"], "train")]))
    assert len(table.images) == 6 and "1 repeated row(s)" in caplog.text
    moved = write_labels(tmp_path / "moved.csv", [*ROWS, ("a/1.png", ["cat", "dog"], "test")])
    with pytest.raises(DataError, match=r"with splits train and test"):
        read_label_file(moved)


def test_a_split_that_is_not_train_val_or_test_is_named(tmp_path):
    labels = write_labels(tmp_path / "labels.jsonl", [*ROWS[:2], ("b/2.png", ["owl"], "validation")])
    with pytest.raises(DataError, match=rf"{labels} line 3: split 'validation' is not one of train, val, test"):
        read_label_file(labels)


def test_an_empty_label_cell_of_a_one_label_file_is_named(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_text("image,label\n0.png,cat\n1.png,\n2.png, \n")
    with pytest.raises(DataError, match=rf"{path} line 3: an empty label cell \(2 such row\(s\)\)"):
        read_label_file(path)


def test_text_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "labels.csv"
    path.write_bytes("image,label\n0.png,cat\n1.png,caf\xe9\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"{path} line 3: not UTF-8 text \(byte 0xe9\)"):
        read_label_file(path)
    names = pa.array([b"cat", b"caf\xe9"], pa.binary()).view(pa.string())
    pq.write_table(pa.table({"image": ["0.png", "1.png"], "label": names}), tmp_path / "labels.parquet")
    with pytest.raises(DataError, match=r"labels\.parquet row 2: column 'label' is not UTF-8 text"):
        read_label_file(tmp_path / "labels.parquet")


def test_a_class_without_training_images_is_a_warning_naming_it_and_the_counts_are_logged(tmp_path, caplog):
    root = write_images(tmp_path / "photos")
    rows = [(image, ["ant"] if split == "test" else names, split) for image, names, split in ROWS]
    caplog.set_level(logging.INFO)
    dm = make(root, write_labels(tmp_path / "labels.csv", rows), num_classes=4)
    dm.setup()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "no training image of class(es) ['ant']" in warned[0]
    assert "6 images of 4 classes; train 4, val 1, test 1" in caplog.text


@pytest.mark.parametrize(
    "image, said",
    [("/etc/passwd", "is an absolute path"), ("../outside.png", "is not a file within data.root"), ("", "no image")],
)
def test_an_image_path_outside_the_root_or_empty_is_named_with_its_row(tmp_path, image, said):
    labels = write_labels(tmp_path / "labels.parquet", [ROWS[0], (image, ["cat"], "train")])
    with pytest.raises(DataError, match=rf"labels\.parquet row 2: .*{said}"):
        read_label_file(labels)


@pytest.mark.parametrize(
    "name, text, said",
    [
        ("labels.txt", "image,label\n", r"a label file is \.csv, \.tsv, \.jsonl, \.parquet .*not '\.txt'"),
        ("labels.csv", "path,label\n0.png,cat\n", r"has no column 'image'"),
        ("labels.csv", "image,class\n0.png,cat\n", r"has no column 'label' \(one class\) or 'labels' \(several\)"),
        ("labels.csv", "image,label,labels\n0.png,cat,cat\n", r"has both 'label' and 'labels'"),
        ("labels.csv", "image,label\n0.png,cat,dog\n", r"line 2: 3 cells, but the header names 2 columns"),
        ("labels.jsonl", '{"image": "0.png", "labels": "cat"}\n', r"line 1: labels holds 'cat', not a list"),
        ("labels.jsonl", '{"image": "0.png"\n', r"line 1: not JSON"),
        ("labels.csv", "image,label\n", r"has no rows of images"),
    ],
)
def test_a_file_of_another_shape_is_one_error_naming_it(tmp_path, name, text, said):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=said):
        read_label_file(path)


def test_a_class_count_other_than_the_files_names_the_key(tmp_path):
    root = write_images(tmp_path / "photos")
    with pytest.raises(DataError, match=r"names 3 classes but data\.num_classes=5"):
        make(root, write_labels(tmp_path / "labels.csv", ROWS), num_classes=5).setup()
