from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from tests.helpers import classifier, compose, tiny_config
from vit.model import ConfigError
from vit.training import nonfinite
from vit.training.module import ViTClassifier
from vit.training.nonfinite import FiniteMean, any_nonfinite
from vit.training.settings import Settings


def make(**kw) -> ViTClassifier:
    return classifier(tiny_config(num_classes=4), **kw)


def test_hyperparameters_are_plain_containers():
    settings = Settings.of(compose("optim.lr=3e-4", "+mixup={mixup_alpha: 0.2}", "finetune=lora"))
    module = make(optim={"lr": 3e-4}, record=settings.record(tiny_config(), {"path": "/x.ckpt"}))
    assert module.optim.lr == 3e-4 and module.hparams["mixup"]["mixup_alpha"] == 0.2
    plain = (dict, list, str, int, float, bool, type(None))

    def check(value):
        assert isinstance(value, plain), type(value)
        if isinstance(value, dict):
            [check(v) for v in value.values()]
        if isinstance(value, list):
            [check(v) for v in value]

    check(dict(module.hparams))


def _training_step_inputs(module: ViTClassifier, images: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """The images the network sees in a training step, and the loss the step returns."""
    module._trainer = SimpleNamespace(global_step=0, log_every_n_steps=10**6, num_training_batches=10**6)
    seen = []
    hook = module.model.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    loss = module.training_step((images.clone(), labels), 0)
    hook.remove()
    return seen[0], loss


def test_the_training_step_mixes_its_batch_when_mixup_is_on_and_only_then():
    images, labels = torch.randn(8, 3, 16, 16), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    plain = make(label_smoothing=0.0)
    seen, loss = _training_step_inputs(plain, images, labels)
    assert torch.equal(seen, images)
    torch.testing.assert_close(loss, F.cross_entropy(plain.model(images), labels))
    mixing = make(mixup={"mixup_alpha": 1.0, "prob": 1.0}, label_smoothing=0.0)
    seen, loss = _training_step_inputs(mixing, images, labels)
    # timm's Mixup blends each image with the batch flipped: x * lam + x.flip(0) * (1 - lam)
    lam = ((seen - images.flip(0)) / (images - images.flip(0))).median()
    assert 0 < lam < 1 and not torch.equal(seen, images)
    torch.testing.assert_close(seen, images * lam + images.flip(0) * (1 - lam), atol=1e-4, rtol=1e-4)
    soft = F.one_hot(labels, 4) * lam + F.one_hot(labels.flip(0), 4) * (1 - lam)
    expected = torch.sum(-soft * F.log_softmax(mixing.model(seen), -1), -1).mean()
    torch.testing.assert_close(loss, expected, atol=1e-4, rtol=1e-4)  # the loss is on the soft targets


def test_mixup_trains_on_soft_targets():
    module = make(mixup={"mixup_alpha": 1.0, "cutmix_alpha": 1.0, "prob": 1.0}, label_smoothing=0.0)
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    original = images.clone()  # timm mixes in place
    mixed, targets = module.task.mix(images, labels)
    assert targets.shape == (8, 4) and torch.allclose(targets.sum(1), torch.ones(8))
    assert not torch.equal(mixed, original)


def test_checkpoints_hold_each_weight_once_compiled_or_not():
    for compiled in (False, True):
        module = make(compile=compiled)
        keys = list(module.state_dict())
        assert keys == ["model." + k for k in module.model.state_dict()]
        assert not [k for k in keys if "_orig_mod" in k]


def test_finite_mean_weights_the_finite_values_and_leaves_out_the_rest():
    mean = FiniteMean()
    for value, weight in [(1.0, 64), (float("nan"), 64), (4.0, 32), (float("inf"), 16), (float("-inf"), 8)]:
        mean.update(torch.tensor(value), weight)
    assert mean.compute().item() == (1.0 * 64 + 4.0 * 32) / 96
    mean.reset()
    mean.update(torch.tensor(float("nan")), 64)
    assert mean.compute().isnan()  # nothing finite seen: no mean, not a zero


def test_accuracy_is_the_fraction_of_images_right_not_the_mean_over_classes():
    """Three images of class 0, all right; one of class 5, ranked last of six: 75% of the images for top-1 and
    top-5 alike, where a mean over classes would give 50%."""
    task = classifier(tiny_config(num_classes=6)).task
    logits = torch.tensor([6.0, 5, 4, 3, 2, 1]).expand(4, 6)  # every image: class 0 first, class 5 last
    labels = torch.tensor([0, 0, 0, 5])
    (_, val_acc, val_acc5), (_, test_acc, test_acc5) = task.stages["val"], task.stages["test"]
    metrics = (task.train_acc, val_acc, test_acc, val_acc5, test_acc5)
    assert val_acc5.top_k == test_acc5.top_k == 5
    assert [m(logits, labels).item() for m in metrics] == [0.75] * 5


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize(
    "dtypes", [(torch.float32,), (torch.float16,), (torch.bfloat16,), (torch.float32, torch.bfloat16)]
)
def test_the_fused_non_finite_check_agrees_with_the_public_inf_norm(bad, dtypes, monkeypatch):
    # torch's private GradScaler kernel against the public fallback and a plain isfinite, on every dtype a run
    # trains in; the bad value sits in one tensor of several, so a check of the first tensor only would pass
    tensors = [torch.randn(n, 3).to(dtypes[n % len(dtypes)]) for n in range(1, 6)]
    if bad is not None:
        tensors[3][2, 1] = bad
    before = [t.clone() for t in tensors]
    expected = not all(t.isfinite().all() for t in tensors)
    assert expected == (bad is not None)
    assert any_nonfinite(tensors) == expected
    monkeypatch.setattr(nonfinite, "_FUSED_NONFINITE_CHECK", None)
    assert any_nonfinite(tensors) == expected
    for t, b in zip(tensors, before, strict=True):  # the kernel unscales by 1: no value changes
        torch.testing.assert_close(t, b, rtol=0, atol=0, equal_nan=True)


def test_torchs_private_non_finite_check_is_still_there():
    """The test above pins what torch._amp_foreach_non_finite_check_and_unscale_ (GradScaler's, private to torch) does;
    this, that torch still has it: without it any_nonfinite falls back to the public inf-norm, right but slower
    (benchmarks/NOTES.md change 9)."""
    assert nonfinite._FUSED_NONFINITE_CHECK is not None


@pytest.mark.parametrize(("flip", "moves"), [(False, 0), (True, 0), (False, 1), (True, 2)])
def test_test_time_views_score_the_mean_logits_of_the_image_its_mirror_and_its_moved_copies(flip, moves, monkeypatch):
    torch.manual_seed(0)
    module = classifier(tiny_config(), test_time_flip=flip, test_time_shift=moves).eval()
    module.set_black([0.5, 0.4, 0.3], [0.25, 0.2, 0.1])
    monkeypatch.setattr(module, "log", lambda *args, **kwargs: None)  # no trainer to log to
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 5, (8,))
    black = torch.tensor([-2.0, -2.0, -3.0]).view(1, 3, 1, 1)  # -mean / std
    with torch.no_grad():
        module._evaluate("val", (images, labels), 0)

        def mirrored(x):
            plain, mirror = module(x), module(x.flip(-1))
            assert not torch.allclose(plain, mirror)  # the model is not mirror-symmetric, so the flip shows
            return (plain + mirror) / 2 if flip else plain

        logits = mirrored(images)
        if moves:  # the windows `moves` pixels down-right and up-left of the image framed in black
            framed = F.pad(images, (moves,) * 4) + F.pad(torch.zeros_like(images), (moves,) * 4, value=1) * black
            down_right, up_left = framed[..., 2 * moves :, 2 * moves :], framed[..., : -2 * moves, : -2 * moves]
            logits = logits / 2 + (mirrored(down_right) + mirrored(up_left)) / 4
    val_loss, val_acc, _ = module.task.stages["val"]
    torch.testing.assert_close(val_loss.compute(), F.cross_entropy(logits, labels))
    assert val_acc.compute() == (logits.argmax(-1) == labels).float().mean()


def test_test_time_shifts_fill_with_the_datas_black_and_refuse_data_that_does_not_state_it():
    module = classifier(tiny_config(), test_time_shift=1)
    facts = {"mean": [0.5, 0.4, 0.2], "std": [0.25, 0.2, 0.1], "classes": None}
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(facts=lambda: facts))
    module.setup("fit")
    torch.testing.assert_close(module._black, torch.tensor([-2.0, -2.0, -2.0]))
    module = classifier(tiny_config(), test_time_shift=1)
    module._trainer = SimpleNamespace(datamodule=None)  # plain data loaders given to the trainer
    with pytest.raises(ConfigError, match=r"^test_time_shift needs a data module that states its mean and std"):
        module.setup("validate")
    module = classifier(tiny_config())
    module._trainer = SimpleNamespace(datamodule=None)
    module.setup("validate")  # without shifts, any data will do
