"""Frozen-feature evaluation as DINOv2 and CLIP users run it: the pooled features of every image computed once,
then a linear classifier (multinomial logistic regression) and a k-nearest-neighbour vote on them, in seconds."""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from vit.model import VisionTransformer


@torch.no_grad()
def features(model: VisionTransformer, batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The pooled features (what the head reads) and labels of every batch: (n, D') float32, (n,) int64."""
    model.eval()
    xs, ys = [], []
    for images, labels in batches:
        xs.append(model.forward_head(model.forward_features(images), pre_logits=True).float())
        ys.append(labels)
    return torch.cat(xs), torch.cat(ys)


def linear_probe(
    train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], classes: int, weight_decay: float = 1e-4
) -> float:
    """Test accuracy of a logistic regression trained to convergence (L-BFGS, full batch) on standardised
    features: the features, not the optimiser's schedule, decide the figure."""
    (x, y), (tx, ty) = train, test
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    x, tx = (x - mean) / std, (tx - mean) / std
    head = torch.nn.Linear(x.shape[1], classes)
    optimizer = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=500, line_search_fn="strong_wolfe")

    def loss() -> Tensor:
        optimizer.zero_grad()
        value = F.cross_entropy(head(x), y) + weight_decay * head.weight.square().sum()
        value.backward()
        return value

    optimizer.step(loss)
    with torch.no_grad():
        return (head(tx).argmax(1) == ty).float().mean().item()


@torch.no_grad()
def knn(train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], classes: int, k: int = 20, T: float = 0.07) -> float:
    """Test accuracy of the k nearest training features by cosine similarity, each voting exp(s / T) for its class
    (the weighted k-NN of Wu et al. 2018 that DINO reports)."""
    (x, y), (tx, ty) = train, test
    x, tx = F.normalize(x, dim=1), F.normalize(tx, dim=1)
    k = min(k, len(y))
    correct = 0
    for start in range(0, len(ty), 1024):  # (1024, n) similarities at a time
        sims, idx = (tx[start : start + 1024] @ x.T).topk(k, dim=1)  # (b, k), most similar first
        # weights relative to the nearest's, as DINOv2's softmax: exp(s / T) itself overflows fp32 once T < 1/89
        votes = torch.zeros(len(sims), classes).scatter_add_(1, y[idx], ((sims - sims[:, :1]) / T).exp())
        correct += (votes.argmax(1) == ty[start : start + 1024]).sum().item()
    return correct / len(ty)
