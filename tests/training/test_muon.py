import pytest
import torch
import torch.optim._muon as torch_muon

from tests.helpers import tiny_config
from vit.model import VisionTransformer
from vit.model.config import ConfigError
from vit.training.muon import NEWTON_SCHULZ, Muon, orthogonalize
from vit.training.optim import OptimConfig, build_optimizer


def closed_form(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The iteration on the singular values alone: G = U S Vᵀ -> U p(p(...p(S / |G|_F))) Vᵀ, in float64."""
    u, s, vh = torch.linalg.svd(g.double(), full_matrices=False)
    a, b, c = NEWTON_SCHULZ
    s = s / g.double().norm(dim=(-2, -1), keepdim=True).squeeze(-1)
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return u @ torch.diag_embed(s) @ vh


@pytest.mark.parametrize("shape", [(3, 8, 5), (2, 6, 12), (1, 7, 7)])
def test_orthogonalize_is_the_polynomial_of_the_singular_values(shape):
    g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    out = orthogonalize(g)
    assert out.shape == g.shape and out.dtype == g.dtype
    torch.testing.assert_close(out.double(), closed_form(g), atol=1e-5, rtol=1e-5)
    singular = torch.linalg.svdvals(out)  # roughly orthogonal: what makes it Muon
    assert singular.min() > 0.6 and singular.max() < 1.25


def side_by_side(shapes, seed, ours, reference, steps=3):
    """Parameters of `shapes` stepped by ours(params) and reference(params) with the same random gradients:
    (ours' parameters, the reference's, the initial weights)."""
    make = torch.Generator().manual_seed(seed)
    weights = [torch.randn(shape, generator=make) for shape in shapes]
    mine, theirs = ([torch.nn.Parameter(w.clone()) for w in weights] for _ in range(2))
    optimizers = ours(mine), reference(theirs)
    for _ in range(steps):
        for a, b in zip(mine, theirs, strict=True):
            a.grad = torch.randn(a.shape, generator=make)
            b.grad = a.grad.clone()
        for optimizer in optimizers:
            optimizer.step()
    return mine, theirs, weights


def test_torchs_private_foreach_ops_are_their_public_ops_on_each_tensor():
    """Muon's step calls torch._foreach_lerp_, _foreach_lerp, _foreach_mul_ and _foreach_add_ (private to torch, what
    torch.optim's foreach paths run): each must equal the public op on every tensor of its lists, bit for bit, and
    leave its inputs alone where it returns new tensors."""
    shapes = [(6, 4), (6, 4), (3,)]  # two of one shape, as Muon stacks them for _foreach_add_
    a, b = [torch.randn(shape) for shape in shapes], [torch.randn(shape) for shape in shapes]
    before = [t.clone() for t in a]

    def exactly(got, expected):
        for x, y in zip(got, expected, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)

    exactly(torch._foreach_lerp(a, b, 0.9), [torch.lerp(x, y, 0.9) for x, y in zip(a, b, strict=True)])
    exactly(a, before)
    out = [t.clone() for t in a]
    torch._foreach_lerp_(out, b, 0.1)
    exactly(out, [torch.lerp(x, y, 0.1) for x, y in zip(a, b, strict=True)])
    out = [t.clone() for t in a]
    torch._foreach_mul_(out, 0.998)
    exactly(out, [x * 0.998 for x in a])
    out, update = [t.clone() for t in a[:2]], torch.stack(b[:2])  # the stacked matrices of one shape, unbound
    torch._foreach_add_(out, update.unbind(0), alpha=-0.012)
    exactly(out, [torch.add(x, y, alpha=-0.012) for x, y in zip(a[:2], b[:2], strict=True)])


def test_muon_steps_as_torchs_reference(monkeypatch):
    """torch.optim.Muon (Nesterov, 'match_rms_adamw' scaling) with its bf16 Newton-Schulz swapped for ours in
    fp32: the momentum, the decay and the scale must then agree to rounding."""
    monkeypatch.setattr(
        torch_muon, "_zeropower_via_newtonschulz", lambda g, coefficients, steps, eps: orthogonalize(g[None], steps)[0]
    )
    ours, theirs, weights = side_by_side(
        [(6, 4), (6, 4), (4, 9), (5, 5)],
        1,
        lambda ps: Muon([{"params": ps, "muon": True}], lr=0.02, weight_decay=0.1, momentum=0.9),
        lambda ps: torch.optim.Muon(ps, lr=0.02, weight_decay=0.1, momentum=0.9, adjust_lr_fn="match_rms_adamw"),
    )
    for a, b, w in zip(ours, theirs, weights, strict=True):
        assert not torch.equal(a, w)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_the_other_groups_step_as_fused_adamw():
    ours, theirs, weights = side_by_side(
        [(7,), (3, 4), (2, 3, 3)],
        2,
        lambda ps: Muon([{"params": ps, "weight_decay": 0.05}], lr=0.01, betas=(0.9, 0.99), eps=1e-6),
        lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05, betas=(0.9, 0.99), eps=1e-6, fused=True),
    )
    for a, b, w in zip(ours, theirs, weights, strict=True):
        assert not torch.equal(a, w)
        assert torch.equal(a, b)


def test_muon_takes_the_layers_weight_matrices_only():
    model = VisionTransformer(tiny_config(pool="token", pos_embed="learned", depth=2))
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon"))
    assert isinstance(optimizer, Muon)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)] for g in optimizer.param_groups if g["muon"] for p in g["params"]}
    expected = {f"layers.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out_proj", "mlp.fc1", "mlp.fc2")}
    assert muon == expected  # not the head, the patch embedding, the class token or the position table
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(names)


def test_resumed_from_its_state_dict_muon_continues_exactly():
    def run(steps: int, state: dict | None = None) -> tuple[VisionTransformer, Muon]:
        torch.manual_seed(0)
        model = VisionTransformer(tiny_config())
        if state is not None:
            model.load_state_dict(state["model"])
        optimizer = build_optimizer(model, OptimConfig(optimizer="muon", lr=0.01))
        if state is not None:
            optimizer.load_state_dict(state["optimizer"])
        for step in range((state or {}).get("at", 0), steps + (state or {}).get("at", 0)):
            images = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(step))
            model(images).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return model, optimizer

    straight, _ = run(4)
    half, optimizer = run(2)
    state = {"model": half.state_dict(), "optimizer": optimizer.state_dict(), "at": 2}
    resumed, _ = run(2, state)
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_a_loaded_state_keeps_every_count_on_its_parameters_device():
    """Saved on one device, loaded for parameters on another (a checkpoint resumed on a GPU): the fused CUDA kernel
    refuses step counts left on the CPU, as torch's loader leaves them. The meta device stands in for the GPU."""
    model = VisionTransformer(tiny_config())
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon", lr=0.01))
    model(torch.randn(2, 3, 16, 16)).square().mean().backward()
    optimizer.step()
    elsewhere = build_optimizer(model.to("meta"), OptimConfig(optimizer="muon", lr=0.01))
    elsewhere.load_state_dict(optimizer.state_dict())
    assert all(t.device == p.device for p, state in elsewhere.state.items() for t in state.values())


def test_muon_refuses_what_is_not_a_matrix():
    with pytest.raises(ValueError, match=r"2-D weight matrices only, got shapes \[\(3,\)\]"):
        Muon([{"params": [torch.nn.Parameter(torch.ones(3))], "muon": True}], lr=0.1)
    with pytest.raises(ConfigError, match=r"optim\.optimizer='sgd' must be one of"):
        OptimConfig(optimizer="sgd")
    with pytest.raises(ConfigError, match=r"optim\.momentum must be in"):
        OptimConfig(momentum=1.0)


def test_muon_keeps_layer_decays_rates_and_needs_to_know_the_layers():
    model = VisionTransformer(tiny_config(depth=3))
    optimizer = build_optimizer(model, OptimConfig(optimizer="muon", lr=1.0, layer_decay=0.5))
    names = {id(p): n for n, p in model.named_parameters()}
    rate = {names[id(p)]: (g["lr"], g["muon"]) for g in optimizer.param_groups for p in g["params"]}
    assert rate["layers.2.mlp.fc1.weight"] == (0.5, True) and rate["layers.0.attn.qkv.weight"] == (0.125, True)
    assert rate["layers.0.attn.qkv.bias"] == (0.125, False) and rate["head.weight"] == (1.0, False)
    with pytest.raises(ConfigError, match=r"optim\.optimizer=muon: Linear does not say which are its layers"):
        build_optimizer(torch.nn.Linear(4, 4), OptimConfig(optimizer="muon"))
