"""Gradient checkpointing trades memory for compute and changes nothing else: the same loss and gradients."""

import pytest
import torch

from tests.helpers import perturb_, tiny_config
from vit.model import VisionTransformer


@pytest.mark.parametrize("pool", ["token", "avg"])  # the class-token path asks the last layer for one row
def test_checkpointed_layers_give_the_same_gradients(pool):
    torch.manual_seed(0)
    plain = perturb_(VisionTransformer(tiny_config(pool=pool, depth=3)))
    checkpointed = VisionTransformer(tiny_config(pool=pool, depth=3))
    checkpointed.set_grad_checkpointing()
    checkpointed.load_state_dict(plain.state_dict())
    images, labels = torch.randn(4, 3, 16, 16), torch.tensor([0, 1, 2, 3])
    for model in (plain, checkpointed):
        torch.nn.functional.cross_entropy(model.train()(images), labels).backward()
    for (name, a), b in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


def test_checkpointing_keeps_fewer_activations():
    """The autograd graph of a checkpointed layer holds its input only: count the tensors saved for backward."""

    def saved(model: VisionTransformer) -> int:
        count = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal count
            count += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model.train()(torch.randn(8, 3, 16, 16)).sum()
        return count

    plain, checkpointed = (VisionTransformer(tiny_config(depth=4, pool="avg")) for _ in range(2))
    checkpointed.set_grad_checkpointing()
    assert saved(checkpointed) < saved(plain) / 3
