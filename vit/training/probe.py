"""Frozen-feature evaluation by the protocol DINOv2 and DINOv3 report: the features of every image computed once
(the class token of each of the last n layers, through the final norm, optionally beside the last layer's mean patch
token; or the pooled features the head reads), then a linear classifier (multinomial logistic regression) whose
regularisation is chosen on a held-out part of the training split and refit on all of it, and a k-nearest-neighbour
vote at several k at once, in seconds.

Several labels per image (multi-hot labels (n, K)): a logistic regression per class (one-vs-rest), and a vote that
gives each class the weight of the neighbours holding it; both scored by the mean over classes of their average
precision (macro mAP) instead of accuracy (`metric`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.functional.classification import multilabel_average_precision

from vit.model import VisionTransformer


@torch.no_grad()
def features(model: VisionTransformer, batches: Iterable[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The pooled features (what the head reads) and labels of every batch: (n, D') float32, (n,) int64 (or the
    data's multi-hot (n, K))."""
    model.eval()
    xs, ys = [], []
    for images, labels in batches:
        xs.append(model.forward_head(model.forward_features(images), pre_logits=True).float())
        ys.append(labels)
    return torch.cat(xs), torch.cat(ys)


def check_blocks(blocks: int, depth: int) -> None:
    """Refuse, before any image is read, a number of last layers the network does not have: the index set of a
    billion layers alone fills the memory."""
    if not 0 <= blocks <= depth:
        raise ValueError(
            f"blocks={blocks}: the network has {depth} layer(s): give 1 to {depth}, or 0 for the pooled features"
        )


@torch.no_grad()
def block_features(
    model: VisionTransformer, batches: Iterable[tuple[Tensor, Tensor]], blocks: int, avgpool: bool = False
) -> tuple[Tensor, Tensor]:
    """DINOv2's linear-evaluation input: the class token after each of the last `blocks` layers, through the final
    norm, side by side, and with `avgpool` the last layer's patch tokens' mean beside them: (n, (blocks + avgpool) D)
    float32, and (n,) labels. A model without a class token gives each layer's patch mean instead."""
    check_blocks(blocks, model.config.depth)
    model.eval()
    has_class_token = model.config.class_token
    xs, ys = [], []
    for images, labels in batches:
        layers = model.forward_intermediates(
            images, indices=blocks, norm=True, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True
        )  # blocks x ((B, N, D) patches, (B, P, D) prefix)
        parts = [prefix[:, 0] if has_class_token else patches.mean(1) for patches, prefix in layers]
        if avgpool:
            parts.append(layers[-1][0].mean(1))
        xs.append(torch.cat(parts, dim=-1).float())
        ys.append(labels)
    return torch.cat(xs), torch.cat(ys)


WEIGHT_DECAYS = tuple(10.0**e for e in range(-6, 1))  # the regularisation swept, 1e-6 to 1


def metric(labels: Tensor) -> str:
    """The name the probes' scores go by: 'acc' for one label an image, 'map' (macro mAP) for multi-hot labels."""
    return "map" if labels.dim() == 2 else "acc"


def score(scores: Tensor, labels: Tensor) -> float:
    """Accuracy of the top scores (n, K) against class indices (n,), or the macro mAP of the scores against multi-hot
    labels (n, K) (a class no image holds left out of the mean)."""
    if labels.dim() == 1:
        return (scores.argmax(1) == labels).float().mean().item()
    classes = labels.shape[1]
    return multilabel_average_precision(scores.float(), labels.int(), classes, average="macro").item()


def sweep_linear(
    train: tuple[Tensor, Tensor],
    test: tuple[Tensor, Tensor],
    classes: int,
    weight_decays: Iterable[float] = WEIGHT_DECAYS,
    held_out: float = 0.1,
    seed: int = 0,
) -> dict[str, Any]:
    """The linear probe at each weight decay, fitted on the training split less `held_out` of it (drawn by seed) and
    scored on that part; the best refit on the whole training split and scored on test. Returns
    {'settings': [{'weight_decay', 'held_out_acc'}, ...], 'best': {'weight_decay', 'held_out_acc', 'test_acc'}},
    or the same with _map for multi-hot labels."""
    x, y = train
    held, tested = f"held_out_{metric(y)}", f"test_{metric(y)}"
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = max(1, round(held_out * len(y)))
    fit, scored = order[cut:], order[:cut]
    settings = [
        {"weight_decay": wd, held: linear_probe((x[fit], y[fit]), (x[scored], y[scored]), classes, wd)}
        for wd in weight_decays
    ]
    best = max(settings, key=lambda s: s[held])  # the first of equals: WEIGHT_DECAYS rises
    return {"settings": settings, "best": {**best, tested: linear_probe(train, test, classes, best["weight_decay"])}}


def linear_probe(
    train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], classes: int, weight_decay: float = 1e-4
) -> float:
    """Test accuracy of a logistic regression trained to convergence (L-BFGS, full batch) on standardised
    features: the features, not the optimiser's schedule, decide the figure. Multi-hot labels: the test's macro mAP
    of a logistic regression per class."""
    (x, y), (tx, ty) = train, test
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    head = logistic_regression((x - mean) / std, y, classes, weight_decay)
    with torch.no_grad():
        return score(head((tx - mean) / std), ty)


def logistic_regression(x: Tensor, y: Tensor, classes: int, weight_decay: float) -> torch.nn.Linear:
    """The multinomial logistic regression of features x (n, D) on class indices y (n,), with an L2 decay of its
    weights, fitted to convergence; of multi-hot labels y (n, K), one binary logistic regression per class (one
    against the rest), each with its own decay: the losses and decays of the classes are sums apart, so one L-BFGS
    fits them all at once."""
    head = torch.nn.Linear(x.shape[1], classes)
    optimizer = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=500, line_search_fn="strong_wolfe")

    def loss() -> Tensor:
        optimizer.zero_grad()
        if y.dim() == 2:  # summed over classes: a mean would weaken each class's fit K times against its decay
            fit = F.binary_cross_entropy_with_logits(head(x), y.float(), reduction="none").sum(1).mean()
        else:
            fit = F.cross_entropy(head(x), y)
        value = fit + weight_decay * head.weight.square().sum()
        value.backward()
        return value

    optimizer.step(loss)
    return head


KS = (10, 20, 100, 200)  # the neighbours DINOv2 reports


@torch.no_grad()
def knn(train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], classes: int, k: int = 20, T: float = 0.07) -> float:
    """Test accuracy of the k nearest training features by cosine similarity, each voting exp(s / T) for its class
    (the weighted k-NN of Wu et al. 2018 that DINO reports); with multi-hot labels each votes for every class it
    holds, and the votes are scored by macro mAP."""
    return knn_at(train, test, classes, (k,), T)[k]


@torch.no_grad()
def knn_at(
    train: tuple[Tensor, Tensor], test: tuple[Tensor, Tensor], classes: int, ks: Iterable[int] = KS, T: float = 0.07
) -> dict[int, float]:
    """knn's score at each k of `ks`, from one search for the largest (k beyond the training split: all of it)."""
    (x, y), (tx, ty) = train, test
    x, tx = F.normalize(x, dim=1), F.normalize(tx, dim=1)
    ks = sorted(set(ks))
    correct = dict.fromkeys(ks, 0)
    scores: dict[int, list[Tensor]] = {k: [] for k in ks}  # multi-hot labels: every vote, for the mAP
    for start in range(0, len(ty), 1024):  # (1024, n) similarities at a time
        sims, idx = (tx[start : start + 1024] @ x.T).topk(min(ks[-1], len(y)), dim=1)  # (b, k), most similar first
        # weights relative to the nearest's, as DINOv2's softmax: exp(s / T) itself overflows fp32 once T < 1/89
        weights = ((sims - sims[:, :1]) / T).exp()
        for k in ks:
            if y.dim() == 2:  # each neighbour votes for every class it holds
                scores[k].append(torch.einsum("bk,bkc->bc", weights[:, :k], y[idx[:, :k]].float()))
                continue
            votes = torch.zeros(len(sims), classes).scatter_add_(1, y[idx[:, :k]], weights[:, :k])
            correct[k] += (votes.argmax(1) == ty[start : start + 1024]).sum().item()
    if y.dim() == 2:
        return {k: score(torch.cat(scores[k]), ty) for k in ks}
    return {k: correct[k] / len(ty) for k in ks}
