"""Batches of images of their own sizes (vit/data/native_size.py): how they cross from a loader's worker."""

from typing import ClassVar

import torch
from torch.utils.data import DataLoader

from vit.data.native_size import ImageList, collate_native


class _Sized(torch.utils.data.Dataset):
    """Images of five sizes, each filled with its own index."""

    shapes: ClassVar = [(1, 7, 21), (1, 14, 14), (1, 21, 7), (1, 7, 7), (1, 14, 28)]

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full(self.shapes[i % 5], float(i)), i % 3


def test_a_worker_hands_over_the_batchs_images_in_one_shared_tensor():
    """Each image passed on its own costs a shared-memory handle and a socket connection; the batch's images arrive
    as views of one storage, each the image the worker made."""
    expected = [_Sized()[i][0] for i in range(5)]
    assert isinstance(collate_native([_Sized()[i] for i in range(5)])[0], ImageList)
    (images, labels), *_ = DataLoader(_Sized(), batch_size=5, num_workers=1, collate_fn=collate_native)
    assert type(images) is list and labels.tolist() == [0, 1, 2, 0, 1]
    assert all(torch.equal(got, want) for got, want in zip(images, expected, strict=True))
    assert len({image.untyped_storage().data_ptr() for image in images}) == 1


def test_images_of_several_dtypes_cross_one_by_one():
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # its reductions of tensors, registered on import

    mixed = ImageList([torch.zeros(1, 2, 2), torch.ones(1, 2, 3, dtype=torch.float64)])
    received = pickle.loads(ForkingPickler.dumps(mixed))
    assert [image.dtype for image in received] == [torch.float32, torch.float64]
    assert torch.equal(received[1], mixed[1]) and pickle.loads(ForkingPickler.dumps(ImageList())) == []
