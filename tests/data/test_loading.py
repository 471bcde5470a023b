import os

import pytest
import torch
from torch.utils.data import SequentialSampler, TensorDataset

from vit.data.errors import DataError
from vit.data.loading import EpochSampler, ResumableLoader, ShardSampler, make_loader, worker_count


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
