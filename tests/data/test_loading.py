from vit.data.loading import ShardSampler


def test_shards_hold_every_index_exactly_once():
    dataset = list(range(103))
    shards = [list(ShardSampler(dataset, rank, 4)) for rank in range(4)]
    assert sorted(i for shard in shards for i in shard) == list(range(103))
    assert [len(ShardSampler(dataset, r, 4)) for r in range(4)] == [len(s) for s in shards]
