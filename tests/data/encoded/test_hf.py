"""data=hf: Hugging Face datasets written by the tests (save_to_disk folders, parquet files), read with their splits,
columns and classes; every bad input one error naming the row, column or path; trained one epoch, under DDP with
each image once per epoch, and resumed mid-epoch to the same weights."""

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, List, Value
from PIL import Image as PILImage

from tests.helpers import compose, one_epoch, run_train_py
from tests.reliability.faults import recorded_labels, stopped_and_resumed_end_alike
from vit.checkpoint import load
from vit.data.encoded.hf import HFDataModule
from vit.data.encoded.hf_source import count_classes
from vit.data.encoded.transforms import normalization
from vit.data.errors import DataError
from vit.training.run import train

SIZE = 16
ROWS = 24  # each image its own colour and label, so that a label names the image it came with


def colour(k: int) -> tuple[int, int, int]:
    return (10 * k, 255 - 10 * k, (70 * k) % 256)


def encoded(k: int, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    PILImage.new("RGB", (SIZE, SIZE), colour(k)).save(buffer, kind)
    return buffer.getvalue()


def images(
    first: int, count: int, image: str = "image", label: str = "label", names: bool = True, cut: int | None = None
) -> Dataset:
    """Rows first..first+count-1: row k's image is colour(k) (PNG, every third a JPEG) and its label k; row `cut`'s
    image is cut to half its bytes."""
    rows = range(first, first + count)
    stored = [encoded(k, "JPEG" if k % 3 == 0 else "PNG") for k in rows]
    if cut is not None:
        stored[cut] = stored[cut][: len(stored[cut]) // 2]
    label_feature = ClassLabel(names=[f"c{k}" for k in range(ROWS)]) if names else Value("int64")
    return Dataset.from_dict(
        {image: [{"bytes": b, "path": None} for b in stored], label: list(rows)},
        features=Features({image: Image(), label: label_feature}),
    )


def three_splits() -> DatasetDict:
    return DatasetDict(train=images(0, 16), validation=images(16, 4), test=images(20, 4))


def module(root, **settings) -> HFDataModule:
    values = dict(num_classes=ROWS, img_size=SIZE, batch_size=4, eval_batch_size=4, num_workers=0, crop_pct=1.0)
    return HFDataModule(root=str(root), **{**values, **settings})


def labels_of(dataset) -> list[int]:
    return [int(dataset.labels[row]) for row in dataset.rows]


def pixels(dm, batch):
    """Normalised (B, C, H, W) back to 0..255, rounded."""
    mean, std = torch.tensor(dm.mean).view(-1, 1, 1), torch.tensor(dm.std).view(-1, 1, 1)
    return ((batch * std + mean) * 255).round()


def test_a_saved_dataset_dict_gives_its_splits_its_class_names_and_each_rows_image(tmp_path):
    three_splits().save_to_disk(tmp_path / "saved")
    dm = module(tmp_path / "saved")
    dm.setup()
    assert dm.classes == [f"c{k}" for k in range(ROWS)]
    assert [labels_of(s) for s in (dm.train_set, dm.val_set, dm.test_set)] == [
        list(range(16)),
        list(range(16, 20)),
        list(range(20, 24)),
    ]
    batch, targets = dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)  # as the model reads it
    assert batch.shape == (4, 3, SIZE, SIZE) and targets.tolist() == [20, 21, 22, 23]
    png = [k for k in range(4) if (20 + k) % 3]  # JPEG's loss aside, each image is its row's colour
    expected = torch.tensor([colour(20 + k) for k in png], dtype=torch.float32)
    assert torch.equal(pixels(dm, batch)[png, :, 0, 0], expected)
    train_batch, _ = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert train_batch.shape == (4, 3, SIZE, SIZE)
    probe = dm.evaluation_loader("train")  # the probe's: in order, without augmentation
    batch, targets = dm.on_after_batch_transfer(next(iter(probe)), 0)
    png = [k for k in range(4) if k % 3]
    expected = torch.tensor([colour(k) for k in png], dtype=torch.float32)
    assert targets.tolist() == [0, 1, 2, 3] and torch.equal(
        pixels(dm, batch)[png], expected[..., None, None].expand(-1, -1, SIZE, SIZE)
    )


def test_a_parquet_folder_has_the_splits_its_file_names_say_and_a_held_out_validation_split(tmp_path):
    (tmp_path / "files").mkdir()
    images(0, 20).to_parquet(tmp_path / "files" / "train.parquet")
    images(20, 4).to_parquet(tmp_path / "files" / "test.parquet")
    dm = module(tmp_path / "files", val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    assert dm.classes == [f"c{k}" for k in range(ROWS)]  # the ClassLabel travels in the parquet schema
    train, val = labels_of(dm.train_set), labels_of(dm.val_set)
    assert len(val) == 5 and sorted(train + val) == list(range(20))
    assert labels_of(dm.test_set) == [20, 21, 22, 23]
    evaluation = [type(stage) for stage in dm._transform(train=False).transform.transforms]
    assert [type(stage) for stage in dm.val_set.transform.transform.transforms] == evaluation  # held out unaugmented
    again = module(tmp_path / "files", val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    again.setup()
    assert labels_of(again.val_set) == val  # the held-out rows follow split_seed alone


@pytest.mark.parametrize(
    ("splits", "test"),
    [
        ({"train": (0, 24)}, "held-out"),
        ({"train": (0, 20), "validation": (20, 4)}, "validation"),
        ({"train": (0, 20), "validation": (20, 4), "test": None}, "validation"),  # test: ImageNet-1k's, unlabelled
    ],
    ids=["train-only", "train-and-validation", "unlabelled-test"],
)
def test_without_a_test_split_validation_is_held_out_and_the_test_set_is_what_is_left(tmp_path, splits, test):
    unlabelled = images(0, 2).map(lambda row: {"label": -1})
    saved = {name: images(*rows) if rows else unlabelled for name, rows in splits.items()}
    (saved["train"] if len(saved) == 1 else DatasetDict(saved)).save_to_disk(tmp_path / "saved")
    dm = module(tmp_path / "saved", val_fraction=0.25)
    dm.setup()
    train, val = labels_of(dm.train_set), labels_of(dm.val_set)
    assert sorted(train + val) == list(range(splits["train"][1])) and not set(train) & set(val)
    assert labels_of(dm.test_set) == (val if test == "held-out" else [20, 21, 22, 23])


@pytest.mark.parametrize(
    ("names", "val", "test"),
    [
        (("train", "valid", "test"), "valid", "test"),
        (("train", "val"), None, "val"),
        (("training", "dev"), None, "dev"),
    ],
)
def test_splits_named_as_datasets_names_them_in_files_are_the_datasets_own(tmp_path, names, val, test):
    """save_to_disk keeps a split's name as given: 'valid', 'val', 'dev' are the dataset's validation split."""
    rows = dict(zip(names, [(0, 16), (16, 4), (20, 4)], strict=False))
    DatasetDict({name: images(*span) for name, span in rows.items()}).save_to_disk(tmp_path / "saved")
    dm = module(tmp_path / "saved", val_fraction=0.25)
    dm.setup()
    assert labels_of(dm.test_set) == list(range(*_span(rows[test])))  # not rows held out of training
    if val is not None:
        assert dm.val_set.split == val and labels_of(dm.val_set) == list(range(*_span(rows[val])))
    assert sorted(labels_of(dm.train_set) + ([] if val else labels_of(dm.val_set))) == list(range(16))


def test_a_split_without_the_label_column_is_unlabelled_and_counts_as_absent(tmp_path):
    """A test split of images alone (a competition's) was refused: every split had to hold the label column."""
    DatasetDict(train=images(0, 20), test=images(20, 4).remove_columns("label")).save_to_disk(tmp_path / "saved")
    assert compose("data=hf", f"data.root={tmp_path / 'saved'}").data.num_classes == ROWS
    dm = module(tmp_path / "saved", val_fraction=0.25)
    dm.setup()
    assert labels_of(dm.test_set) == labels_of(dm.val_set) and len(dm.val_set) == 5  # the held-out rows
    DatasetDict(train=images(0, 4).remove_columns("label"), test=images(4, 4)).save_to_disk(tmp_path / "unlabelled")
    with pytest.raises(DataError, match=r"split 'train' of the dataset has no label column 'label' or 'labels'"):
        module(tmp_path / "unlabelled").setup()


def _span(first_count: tuple[int, int]) -> tuple[int, int]:
    return first_count[0], sum(first_count)


def test_labels_of_any_integer_type_and_images_stored_as_bytes_and_path_records_are_read(tmp_path):
    """A parquet file written without datasets holds an image as a {bytes, path} record, labels often as uint8."""
    table = pa.table(
        {
            "image": pa.array([{"bytes": encoded(k), "path": None} for k in range(8)]),
            "label": pa.array([k % 4 for k in range(8)], pa.uint8()),
        }
    )
    (tmp_path / "files").mkdir()
    pq.write_table(table, tmp_path / "files" / "train.parquet")
    assert count_classes(str(tmp_path / "files"), None, str(tmp_path / "cache")) == 4
    dm = module(tmp_path / "files", num_classes=4, val_fraction=0.25, cache_dir=str(tmp_path / "cache"))
    dm.setup()
    image, label = dm.val_set[0]
    row = int(dm.val_set.rows[0])
    assert label == row % 4 and image[:, 0, 0].tolist() == list(colour(row))  # (C, H, W) uint8 from the worker


def test_columns_are_found_by_their_usual_names_or_named_and_plain_integer_labels_are_counted(tmp_path):
    images(0, 24, image="img", label="labels").save_to_disk(tmp_path / "usual")
    dm = module(tmp_path / "usual", val_fraction=0.25)
    dm.setup()
    assert len(dm.train_set) == 18 and dm.classes == [f"c{k}" for k in range(ROWS)]
    images(0, 24, image="picture", label="category", names=False).save_to_disk(tmp_path / "named")
    dm = module(tmp_path / "named", image_column="picture", label_column="category", num_classes=24)
    dm.setup()
    assert dm.classes is None and sorted(labels_of(dm.train_set) + labels_of(dm.val_set)) == list(range(24))
    cfg = compose("data=hf", f"data.root={tmp_path / 'named'}", "data.label_column=category")
    assert cfg.data.num_classes == cfg.model.num_classes == 24  # the largest label, plus one


def test_the_class_count_is_read_from_the_class_label_as_the_config_resolves(tmp_path):
    DatasetDict(train=images(0, 4), test=images(4, 2)).save_to_disk(tmp_path / "saved")  # 24 names, 6 used
    cfg = compose("data=hf", f"data.root={tmp_path / 'saved'}")
    assert cfg.data.num_classes == cfg.model.num_classes == ROWS


def several(first: int, count: int, names: bool = True) -> Dataset:
    """images(first, count) with a label column of sets: row k is of classes k % 4 and (k + 1) % 4, every fifth of
    none; a Sequence(ClassLabel) of 4 names, or lists of integers."""
    sets = [[] if k % 5 == 4 else [k % 4, (k + 1) % 4] for k in range(first, first + count)]
    inner = ClassLabel(names=["ant", "bee", "cat", "dog"]) if names else Value("int64")
    rows = images(first, count).remove_columns("label").add_column("label", sets)
    return rows.cast_column("label", List(inner))


@pytest.mark.parametrize("names", [True, False], ids=["Sequence(ClassLabel)", "lists of integers"])
def test_a_label_column_of_sequences_gives_each_row_its_multi_hot_labels(tmp_path, names):
    DatasetDict(train=several(0, 16, names), test=several(16, 4, names)).save_to_disk(tmp_path / "saved")
    assert compose("data=hf", f"data.root={tmp_path / 'saved'}").data.num_classes == 4
    dm = module(tmp_path / "saved", num_classes=4, val_fraction=0.25)
    dm.setup()
    assert dm.multilabel and dm.facts()["multilabel"] is True
    assert dm.classes == (["ant", "bee", "cat", "dog"] if names else None)
    batch, targets = dm.on_after_batch_transfer(next(iter(dm.test_dataloader())), 0)
    assert targets.dtype == torch.float32 and targets.tolist() == [
        [1.0, 1.0, 0.0, 0.0],  # row 16: classes 0 and 1
        [0.0, 1.0, 1.0, 0.0],
        [0.0, 0.0, 1.0, 1.0],
        [0.0, 0.0, 0.0, 0.0],  # row 19: none
    ]
    png = [k for k in range(4) if (16 + k) % 3]  # the labels came with their rows' images
    assert torch.equal(
        pixels(dm, batch)[png, :, 0, 0], torch.tensor([colour(16 + k) for k in png], dtype=torch.float32)
    )
    _, targets = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    assert targets.shape == (4, 4) and targets.dtype == torch.float32


def test_a_label_of_a_sequence_outside_the_classes_names_its_split_and_row(tmp_path):
    rows = several(0, 8, names=False)
    DatasetDict(
        train=rows, test=rows.map(lambda row, k: {"label": [0, -1] if k == 2 else row["label"]}, with_indices=True)
    ).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match=r"split 'test' row 2 has label \[0, -1\], outside the 4 classes 0\.\.3"):
        module(tmp_path / "saved", num_classes=4).setup()


def test_a_corrupt_image_row_is_an_error_naming_its_split_and_row_or_is_left_out_and_listed(tmp_path):
    DatasetDict(train=images(0, 20, cut=5), test=images(20, 4)).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match=r"1 bad image row\(s\) in split 'train' of data\.root=.*\n  train row 5: "):
        module(tmp_path / "saved").setup()
    with pytest.raises(DataError, match=r"1 of the 20 image rows in split 'train' .* more than data\.max_bad_frac"):
        module(tmp_path / "saved", skip_bad_images=True).setup()
    dm = module(tmp_path / "saved", skip_bad_images=True, max_bad_fraction=0.1, val_fraction=0.25)
    with pytest.warns(UserWarning, match=r"leaving out 1 bad image row\(s\) of 20 .*\n  train row 5: "):
        dm.setup()
    assert dm.bad_images == ["train row 5"]
    assert sorted(labels_of(dm.train_set) + labels_of(dm.val_set)) == [k for k in range(20) if k != 5]
    unverified = module(tmp_path / "saved", verify_images=False)  # found when read, named as well
    unverified.setup()
    with pytest.raises(OSError, match=r"cannot read row 5 of split 'train' \(OSError: image file is truncated"):
        for dataset in (unverified.train_set, unverified.val_set):
            [dataset[i] for i in range(len(dataset))]


@pytest.mark.parametrize(
    ("write", "settings", "message"),
    [
        (
            lambda root: Dataset.from_dict({"image": [encoded(0)], "target": [0]}).save_to_disk(root),
            {},
            r"split 'train' of the dataset has no label column 'label' or 'labels'; its columns: \['image', 'target'\]",
        ),
        (
            lambda root: images(0, 4).save_to_disk(root),
            {"label_column": "category"},
            r"split 'train' of the dataset has no label column 'category'; its columns: \['image', 'label'\]",
        ),
        (
            lambda root: Dataset.from_dict({"pixels": [[0.5]], "label": [0]}).save_to_disk(root),
            {},
            r"split 'train' of the dataset has no image column 'image' or 'img'; its columns: \['pixels', 'label'\]",
        ),
        (
            lambda root: Dataset.from_dict({"image": [3], "label": [0]}).save_to_disk(root),
            {},
            r"column 'image' of split 'train' holds Value\('int64'\), not images",
        ),
        (lambda root: images(0, 0).save_to_disk(root), {}, r"^split 'train' of data\.root=.* has no rows$"),
        (
            lambda root: images(0, 4).save_to_disk(root),
            {"num_classes": 5},
            r"has 24 classes in its label column 'label' but data\.num_classes=5: leave data\.num_classes out",
        ),
        (
            lambda root: DatasetDict(
                train=images(0, 4),
                test=images(4, 4).cast_column("label", ClassLabel(names=[f"k{k}" for k in range(24)])),  # renamed
            ).save_to_disk(root),
            {},
            r"splits 'train' and 'test' name the classes of label column 'label' differently .*'k0'.*: one label",
        ),
        (lambda root: None, {}, r"^Hugging Face dataset not found: data\.root=.*nowhere does not exist$"),
        (lambda root: root.mkdir(), {}, r"data\.root=.*: datasets cannot read it \("),
    ],
    ids=[
        "no-label-column",
        "named-label-column",
        "no-image-column",
        "not-images",
        "no-rows",
        "class-count",
        "classes-differ-by-split",
        "no-path",
        "no-data-files",
    ],
)
def test_bad_input_is_one_error_naming_the_column_split_or_path(tmp_path, write, settings, message):
    root = tmp_path / "nowhere"
    write(root)
    with pytest.raises((DataError, FileNotFoundError), match=message):
        module(root, **settings).setup()


RUN = one_epoch("hf", SIZE)  # TINY's model on a dataset of SIZE-pixel images, in batches of 4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """three_splits() saved to disk: 16 training rows (4 steps of 4 an epoch), 4 validation and 4 test rows."""
    root = tmp_path_factory.mktemp("hf") / "saved"
    three_splits().save_to_disk(root)
    return root


# Everything random switched on: shuffling, RandAugment, crops and flips, dropout, drop path, Mixup/CutMix, and EMA
RANDOM = [
    "trainer.max_epochs=2",
    "model.dropout=0.1",
    "model.drop_path=0.1",
    "+mixup={mixup_alpha: 0.8, cutmix_alpha: 1.0, switch_prob: 0.5}",
    "ema_decay=0.9",
]


@pytest.fixture(scope="module")
def whole(saved, tmp_path_factory):
    """One uninterrupted run of two epochs, everything random on: the run stopped and resumed below must end alike.
    Returns its folder and its results."""
    folder = tmp_path_factory.mktemp("whole")
    return folder, train(compose(*RUN, *RANDOM, f"data.root={saved}", f"output_dir={folder}"))


def test_a_run_trains_and_its_checkpoint_keeps_the_datas_classes_and_statistics(whole):
    _, results = whole
    assert results["global_steps"] == 8 and results["bad_images"] == 0
    loaded = load(results["best_checkpoint"])
    assert loaded.config.num_classes == loaded.model.head.out_features == ROWS
    assert list(loaded.classes) == [f"c{k}" for k in range(ROWS)]
    assert (tuple(loaded.mean), tuple(loaded.std), loaded.crop_pct) == (*normalization(3), 0.875)


def test_a_run_stopped_mid_epoch_and_resumed_ends_bit_identical(saved, whole, tmp_path):
    def run(folder, *more):
        return compose(*RUN, *RANDOM, f"data.root={saved}", f"output_dir={tmp_path / folder}", *more)

    stopped_and_resumed_end_alike(run, tmp_path, step=5, steps=8, whole=whole[0])  # epoch 2's second step


@pytest.mark.slow  # two DDP processes of train.py: ~19 s
def test_under_ddp_every_training_image_is_seen_once_an_epoch_across_two_ranks(saved, tmp_path):
    ddp = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.precision=32-true"]
    witness = f"+callbacks.witness={{_target_: tests.reliability.faults.RecordLabels, folder: {tmp_path / 'seen'}}}"
    run = run_train_py(*RUN, *ddp, "trainer.max_epochs=2", witness, f"data.root={saved}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    seen = recorded_labels(str(tmp_path / "seen"))
    assert sorted(seen) == [0, 1]
    orders = []
    for epoch in (0, 1):
        by_rank = [[label for e, batch in seen[rank] if e == epoch for label in batch] for rank in (0, 1)]
        assert [len(labels) for labels in by_rank] == [8, 8]  # 2 batches of 4 each: 16 rows, none dropped
        assert sorted(by_rank[0] + by_rank[1]) == list(range(16))  # each training row once, on one rank
        orders.append(by_rank)
    assert orders[0] != orders[1]  # reshuffled by epoch


@pytest.mark.slow  # a train.py process: ~10 s
def test_train_py_names_a_missing_label_column_in_one_line(tmp_path):
    Dataset.from_dict({"image": [encoded(0)], "target": [0]}).save_to_disk(tmp_path / "saved")
    run = run_train_py(*RUN, f"data.root={tmp_path / 'saved'}", f"output_dir={tmp_path / 'out'}", cwd=tmp_path)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines()[-1] == (
        "error: split 'train' of the dataset has no label column 'label' or 'labels'; "
        "its columns: ['image', 'target']. Name it with data.label_column=..."
    )
    assert "Traceback" not in run.stderr
