import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from vit.data.class_balance import balanced_weights
from vit.data.errors import DataError
from vit.data.loading import (
    BalancedSampler,
    EpochSampler,
    ResumableLoader,
    ShardSampler,
    epoch_seed,
    make_loader,
    training_targets,
    worker_count,
)


def test_shards_hold_every_index_exactly_once():
    dataset = list(range(103))
    shards = [list(ShardSampler(dataset, rank, 4)) for rank in range(4)]
    assert sorted(i for shard in shards for i in shard) == list(range(103))
    assert [len(ShardSampler(dataset, r, 4)) for r in range(4)] == [len(s) for s in shards]


def test_epoch_order_depends_on_seed_and_epoch_only_and_shards_cover_it():
    data = list(range(50))
    a, b = EpochSampler(data, seed=3), EpochSampler(data, seed=3)
    torch.manual_seed(123)  # the global random state plays no part
    first = list(a)
    assert first == list(b) and sorted(first) == data
    a.set_epoch(1)
    assert list(a) != first
    shards = [list(EpochSampler(data, seed=3, rank=r, world_size=4)) for r in range(4)]
    assert all(len(s) == 12 for s in shards) and len({i for s in shards for i in s}) == 48


def test_a_loader_restored_mid_epoch_continues_with_the_next_batch():
    data = TensorDataset(torch.arange(40))
    loader = ResumableLoader(data, 4, sampler=EpochSampler(data, seed=0))
    loader.sampler.set_epoch(2)
    full = [b[0].tolist() for b in loader]
    it = iter(loader)
    seen = [next(it)[0].tolist() for _ in range(3)]
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches": 3, "samples": 12}
    resumed = ResumableLoader(data, 4, sampler=EpochSampler(data, seed=0))
    resumed.load_state_dict(state)
    resumed.sampler.set_epoch(2)  # as Lightning does before iterating
    assert seen + [b[0].tolist() for b in resumed] == full
    assert [b[0].tolist() for b in resumed] == full  # the skip applies to one pass only


def test_a_loader_resumed_with_another_batch_size_reads_the_rest_of_the_epoch_once():
    """It skipped batches x the new batch size: from 3 batches of 4, 24 samples, 12 of them never read."""
    data = TensorDataset(torch.arange(40))
    loader = ResumableLoader(data, 4, sampler=EpochSampler(data, seed=0))
    it = iter(loader)
    seen = [i for _ in range(3) for i in next(it)[0].tolist()]
    resumed = ResumableLoader(data, 8, sampler=EpochSampler(data, seed=0))
    resumed.load_state_dict(loader.state_dict())
    rest = [i for b in resumed for i in b[0].tolist()]
    assert seen + rest == list(EpochSampler(data, seed=0))[:36]  # the epoch's order, the last partial batch dropped
    assert resumed.state_dict() == {"epoch": 0, "batches": 6, "samples": 36}
    resumed.load_state_dict({"epoch": 0, "batches": 2})  # a checkpoint of before: batches of the loader's size
    assert len([i for b in resumed for i in b[0].tolist()]) == 24


def test_a_state_from_another_epoch_starts_that_epoch_from_its_beginning():
    data = TensorDataset(torch.arange(40))
    loader = ResumableLoader(data, 4, sampler=EpochSampler(data, seed=0))
    loader.load_state_dict({"epoch": 0, "batches": 10})  # saved at the end of epoch 0
    loader.sampler.set_epoch(1)
    assert len(list(loader)) == 10


def test_a_loader_given_another_sampler_keeps_its_order_and_is_not_resumed():
    """Lightning's overfit_batches rebuilds the loader with sampler=SequentialSampler(...): no epoch, no skip."""
    data = TensorDataset(torch.arange(40))
    loader = ResumableLoader(data, 4, sampler=SequentialSampler(data))
    loader.load_state_dict({"epoch": 0, "batches": 3})
    assert [b[0].tolist() for b in loader] == [list(range(i, i + 4)) for i in range(0, 40, 4)]
    assert loader.state_dict() == {"epoch": 0, "batches": 10, "samples": 40}


def test_a_training_split_too_small_for_one_batch_per_process_is_refused(monkeypatch):
    """drop_last leaves such a split with no batch at all: the run used to 'succeed' without a step."""
    data = TensorDataset(torch.arange(100))
    assert len(make_loader(data, 100, train=True)) == 1 and len(make_loader(data, 128, train=False)) == 1
    with pytest.raises(ValueError, match=r"data\.batch_size=128, but the training split holds 100 images for 1 "):
        make_loader(data, 128, train=True)
    monkeypatch.setattr("vit.data.loading.dist.is_initialized", lambda: True)
    monkeypatch.setattr("vit.data.loading.dist.get_rank", lambda: 0)
    monkeypatch.setattr("vit.data.loading.dist.get_world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"holds 100 images for 2 process\(es\), 50 each.*at most 50"):
        make_loader(data, 64, train=True)


def test_auto_workers_share_this_processes_cpus_among_the_ranks_of_the_machine(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert worker_count("auto") == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's: four ranks on this node
    assert worker_count("auto") == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert worker_count("auto") == 1
    assert worker_count(3) == 3
    with pytest.raises(DataError, match=r"data.num_workers='many': give a whole number >= 0, or auto"):
        worker_count("many")


class Draws(torch.utils.data.Dataset):
    """Each sample is a random draw, as an augmentation's: what a worker's random stream gives it."""

    def __len__(self):
        return 24

    def __getitem__(self, index):
        return torch.rand(1)


@pytest.mark.parametrize("subset", [False, True], ids=["dataset", "subset"])
def test_a_pass_resumed_mid_epoch_with_workers_draws_what_the_whole_pass_drew(subset):
    """A resumed pass hands its first batch to worker 0, whichever worker had it: each sample's draws must follow
    the pass and the sample alone, and a later epoch's workers that epoch's seed (they are not persistent). An
    image folder's training split is a Subset of its files, whose __getitems__ must not pass for a batched fetch."""

    def draws():
        return torch.utils.data.Subset(Draws(), list(range(24))[::-1]) if subset else Draws()

    torch.manual_seed(3)
    whole = make_loader(draws(), 4, train=True, num_workers=2)
    epochs = []
    for epoch in range(2):
        whole.sampler.set_epoch(epoch)
        epochs.append(torch.cat(list(whole)))
    assert not torch.equal(epochs[0], epochs[1])
    torch.manual_seed(3)
    resumed = make_loader(draws(), 4, train=True, num_workers=2)
    resumed.load_state_dict({"epoch": 1, "batches": 3})
    resumed.sampler.set_epoch(1)
    assert torch.equal(torch.cat(list(resumed)), epochs[1][3 * 4 :])


# --- data.sampler=balanced ----------------------------------------------------------------------------------------


class Labelled(torch.utils.data.Dataset):
    """Images that are their own index, of these labels (`targets`, as balanced sampling reads them)."""

    def __init__(self, targets):
        self.targets = targets

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return index


TEN_TO_ONE = torch.tensor([0] * 2000 + [1] * 200)  # 2,200 images: a common class and one ten times rarer


def _epoch(loader, epoch=0):
    loader.sampler.set_epoch(epoch)
    return torch.cat([torch.as_tensor(batch) for batch in loader])


def test_a_balanced_epoch_draws_each_class_equally_often_and_the_uniform_one_each_image_once():
    torch.manual_seed(0)
    drawn = _epoch(make_loader(Labelled(TEN_TO_ONE), 100, train=True, sampler="balanced"))
    assert len(drawn) == len(TEN_TO_ONE)  # an epoch keeps the split's length
    rare = (TEN_TO_ONE[drawn] == 1).float().mean()
    assert abs(rare - 0.5) < 0.05, rare  # 1/11 of the images; sd of the share ~0.011 in 2,200 draws
    assert len(drawn.unique()) < len(TEN_TO_ONE)  # with replacement: the rare images come back
    torch.manual_seed(0)
    uniform = _epoch(make_loader(Labelled(TEN_TO_ONE), 100, train=True))
    permutation = torch.randperm(2200, generator=torch.Generator().manual_seed(epoch_seed(torch.initial_seed(), 0)))
    assert torch.equal(uniform, permutation)  # today's order, unchanged: each image once
    assert abs((TEN_TO_ONE[uniform] == 1).float().mean() - 1 / 11) < 1e-6


def test_balanced_draws_follow_seed_and_epoch_and_ranks_share_them_out():
    weights = balanced_weights(TEN_TO_ONE)
    data = Labelled(TEN_TO_ONE)
    a, b = BalancedSampler(data, weights, seed=3), BalancedSampler(data, weights, seed=3)
    torch.manual_seed(123)  # the global random state plays no part
    first = list(a)
    assert first == list(b) and first != list(BalancedSampler(data, weights, seed=4))
    a.set_epoch(1)
    assert list(a) != first
    shares = [list(BalancedSampler(data, weights, seed=3, rank=r, world_size=3)) for r in range(3)]
    assert [len(s) for s in shares] == [733] * 3
    assert [i for draws in zip(*shares, strict=True) for i in draws] == first[: 3 * 733]  # one share of one draw


def test_a_balanced_loader_restored_mid_epoch_continues_with_the_next_batch():
    data = Labelled(TEN_TO_ONE[:400:5])  # 80 images, 8 of them rare

    def loader():
        return ResumableLoader(data, 8, sampler=BalancedSampler(data, balanced_weights(data.targets), seed=0))

    whole = _epoch(loader(), epoch=2)
    resumed = loader()
    resumed.load_state_dict({"epoch": 2, "batches": 3, "samples": 24})
    assert torch.equal(_epoch(resumed, epoch=2), whole[24:])


def test_several_labels_an_image_weigh_the_mean_of_their_classes_inverse_counts():
    """Class 0 is held by 4 images, class 1 by 2, class 2 by 1: image d {0, 1} weighs (1/4 + 1/2) / 2, image e
    {1, 2} (1/2 + 1) / 2; f holds none, a group of one; as multi-hot rows, label sets, and sets stored flat."""
    multi_hot = torch.tensor([[1, 0, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 1], [0, 0, 0]], dtype=torch.float32)
    sets = [(0,), (0,), (0,), (0, 1), (1, 2), ()]
    flat = SimpleNamespace(offsets=np.array([0, 1, 2, 3, 5, 7, 7]), indices=np.array([0, 0, 0, 0, 1, 1, 2]))
    expected = torch.tensor([1 / 4, 1 / 4, 1 / 4, 3 / 8, 3 / 4, 1], dtype=torch.float64)
    for targets in (multi_hot, sets, list(multi_hot), flat):
        torch.testing.assert_close(balanced_weights(targets), expected, rtol=0, atol=1e-12)
    torch.manual_seed(0)  # 1,000 copies of the six: one epoch of 6,000 draws, sd of each share < 0.006
    drawn = _epoch(make_loader(Labelled(multi_hot.repeat(1000, 1)), 100, train=True, sampler="balanced"))
    shares = torch.bincount(drawn % 6, minlength=6) / len(drawn)
    torch.testing.assert_close(shares, (expected / expected.sum()).float(), rtol=0, atol=0.025)


def test_a_subsets_labels_are_those_of_its_images():
    """A held-out split's training part is a Subset: its labels, by the Subset's order, whatever holds them."""
    flat = SimpleNamespace(take=lambda positions: [f"sets of {positions}"])
    for targets, expected in (
        (torch.tensor([5, 6, 7, 8]), [8, 6]),
        (np.array([[0, 1], [1, 0], [1, 1], [0, 0]]), [[0, 0], [1, 0]]),
        ([5, (6, 7), 7, 8], [8, (6, 7)]),
        (flat, ["sets of [3, 1]"]),
    ):
        subset = torch.utils.data.Subset(Labelled(targets), [3, 1])
        got = training_targets(subset)
        assert (got.tolist() if hasattr(got, "tolist") else got) == expected


class NoisyDraws(Labelled):
    """Each sample its index and a random draw, as an augmentation's."""

    def __getitem__(self, index):
        return torch.tensor([index, torch.rand(1).item()])


def test_an_image_drawn_twice_in_an_epoch_by_workers_is_augmented_afresh_and_resumes_alike():
    data = NoisyDraws(TEN_TO_ONE[:240:10])  # 24 images, 2 rare: each rare image comes ~3 times an epoch
    torch.manual_seed(3)
    whole = _epoch(make_loader(data, 4, train=True, num_workers=2, sampler="balanced"), epoch=1)
    index, draw = whole[:, 0].long(), whole[:, 1]
    again = [k for k in index.unique() if (index == k).sum() > 1]
    assert again and all(len(draw[index == k].unique()) == (index == k).sum() for k in again)
    torch.manual_seed(3)
    resumed = make_loader(data, 4, train=True, num_workers=2, sampler="balanced")
    resumed.load_state_dict({"epoch": 1, "batches": 2})
    assert torch.equal(_epoch(resumed, epoch=1), whole[2 * 4 :])


def test_a_sampler_of_another_name_or_a_split_without_labels_is_one_line():
    with pytest.raises(DataError, match=r"^data\.sampler='weighted': give one of uniform, balanced$"):
        make_loader(Labelled(TEN_TO_ONE), 4, train=True, sampler="weighted")
    with pytest.raises(DataError, match=r"^data\.sampler=balanced: the training split \(TensorDataset\) states no "):
        make_loader(TensorDataset(torch.arange(8)), 4, train=True, sampler="balanced")


def _one_balanced_epoch(dm):
    """A set-up data module's training loader with data.sampler=balanced: each training image's weight is 1/(the
    training images of its label), its label read from the image as a batch holds it; and the epoch's batches hold
    the labels of the images the sampler drew, in its order. -> the labels of that epoch."""
    loader = dm.train_dataloader()
    assert isinstance(loader.sampler, BalancedSampler)
    labels = torch.tensor([int(dm.train_set[k][1]) for k in range(len(dm.train_set))])
    weights = torch.diff(loader.sampler.cumulative, prepend=torch.zeros(1, dtype=torch.float64))
    torch.testing.assert_close(weights, 1 / torch.bincount(labels)[labels].double())
    loader.sampler.set_epoch(0)
    order = torch.tensor(list(loader.sampler)) % len(labels)  # numbered draws, where the dataset seeds its own
    drawn = torch.cat([batch_labels for _, batch_labels in loader])
    assert drawn.tolist() == labels[order[: len(drawn)]].tolist()
    return drawn


def test_in_memory_data_samples_balanced_when_asked(tmp_path):
    from vit.data.memory.synthetic import SyntheticDataModule

    settings = dict(root=str(tmp_path), num_classes=4, in_chans=3, img_size=8, batch_size=8, val_size=8)
    dm = SyntheticDataModule(**settings, train_size=72, sampler="balanced")
    dm.setup()
    _one_balanced_epoch(dm)
    uniform = SyntheticDataModule(**settings, train_size=72)
    uniform.setup()
    assert type(uniform.train_dataloader().sampler) is EpochSampler
    with pytest.raises(DataError, match=r"^data\.sampler='weighted': give one of uniform, balanced$"):
        SyntheticDataModule(**settings, sampler="weighted")


def test_an_image_folder_ten_to_one_samples_balanced(tmp_path):
    from tests.helpers import write_image_folder
    from vit.data.encoded.imagefolder import ImageFolderDataModule

    write_image_folder(tmp_path, {"common": 40, "rare": 4}, "train", size=(8, 8))
    write_image_folder(tmp_path, {"common": 1, "rare": 1}, "val", size=(8, 8))
    settings = dict(num_classes=2, img_size=8, batch_size=4, num_workers=0, val_fraction=0.1, auto_augment=None)
    dm = ImageFolderDataModule(root=str(tmp_path), **settings, sampler="balanced")
    dm.setup()  # its training split: a Subset of the folder's files
    drawn = _one_balanced_epoch(dm)
    assert 0.2 < drawn.float().mean() < 0.8  # 4 rare of 40 images; ~half of the draws (sd 0.08)


def test_a_hugging_face_dataset_samples_balanced(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image

    from tests.data.encoded.test_hf import encoded
    from vit.data.encoded.hf import HFDataModule

    def split(labels):
        rows = {"image": [{"bytes": encoded(k), "path": None} for k in range(len(labels))], "label": labels}
        return Dataset.from_dict(rows, features=Features({"image": Image(), "label": ClassLabel(names=["a", "b"])}))

    DatasetDict(train=split([1, 1] + [0] * 20), test=split([0, 1])).save_to_disk(tmp_path / "saved")
    dm = HFDataModule(root=str(tmp_path / "saved"), num_classes=2, img_size=16, batch_size=4, num_workers=0,
                      val_fraction=0.1, auto_augment=None, sampler="balanced")  # fmt: skip
    dm.setup()  # its training rows: those left after holding out validation
    _one_balanced_epoch(dm)


@pytest.mark.slow  # three runs: 8-20 s; the loaders' resumes above are the default suite's check
def test_a_balanced_run_stopped_mid_epoch_and_resumed_ends_bit_identical(tmp_path):
    from tests.helpers import tiny_run
    from tests.reliability.faults import stopped_and_resumed_end_alike

    def run(folder, *more):
        data = ("data.sampler=balanced", "data.train_size=96", "data.val_size=32", "data.batch_size=16")
        brief = ("model.depth=1", "trainer.max_epochs=1", "callbacks.pos_embed_figure=null")
        return tiny_run(tmp_path / folder, *data, "data.crop_padding=2", *brief, *more)

    stopped_and_resumed_end_alike(run, tmp_path, step=2, steps=4)  # the third of the epoch's four steps


def test_shards_sample_balanced_each_draw_augmented_afresh_and_a_pass_resumed_with_workers_reads_the_same(tmp_path):
    """Shards are read by index in the balanced order; a rare image drawn twice in an epoch is cropped and flipped
    anew (noise images, so that every draw shows), from (seed, epoch, draw) in workers as in the main process."""
    from PIL import Image

    from vit.data.encoded.stream import StreamDataModule
    from vit.data.shards.writer import write_shards

    rng = np.random.default_rng(0)
    for split, counts in (("train", {"common": 20, "rare": 2}), ("val", {"common": 1, "rare": 1})):
        for name, count in counts.items():
            (tmp_path / "folder" / split / name).mkdir(parents=True)
            for i in range(count):
                noise = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
                Image.fromarray(noise).save(tmp_path / "folder" / split / name / f"{i}.png")
    write_shards(str(tmp_path / "folder"), str(tmp_path / "out"), val_fraction=0.1, workers=1, chunk_bytes=2000)

    def module(workers):
        torch.manual_seed(3)
        dm = StreamDataModule(root=str(tmp_path / "out"), num_classes=2, img_size=8, batch_size=4,
                              num_workers=workers, auto_augment=None, sampler="balanced")  # fmt: skip
        dm.setup()
        return dm

    dm = module(0)
    drawn = _one_balanced_epoch(dm)
    assert 0.2 < drawn.float().mean() < 0.8  # 2 rare of 20 images; ~half of the draws
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(1)
    order, whole = torch.tensor(list(loader.sampler)) % 20, _images(loader, epoch=1)
    twice = next(k for k in order.unique() if (order == k).sum() > 1)
    first, second = torch.nonzero(order == twice).flatten()[:2]
    assert not torch.equal(whole[first], whole[second])  # the same image, augmented twice
    loader.sampler.set_epoch(0)
    draws = [list(loader.sampler), None]
    loader.sampler.set_epoch(1)
    draws[1] = list(loader.sampler)
    both = next(d for d in draws[0] if d in draws[1])  # the same draw of an image in two epochs, augmented anew
    assert not torch.equal(_images(loader, epoch=0)[draws[0].index(both)], whole[draws[1].index(both)])
    resumed = module(2).train_dataloader()
    resumed.load_state_dict({"epoch": 1, "batches": 2})
    assert torch.equal(_images(resumed, epoch=1), whole[2 * 4 :])


def _images(loader, epoch):
    loader.sampler.set_epoch(epoch)
    return torch.cat([images for images, _ in loader])
