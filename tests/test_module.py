import torch

from tests.helpers import tiny_config
from vit.module import ViTClassifier


def make(**kw) -> ViTClassifier:
    return ViTClassifier(model=tiny_config(num_classes=4).to_dict(), **kw)


def test_hyperparameters_are_plain_containers():
    module = make(optim={"lr": 3e-4}, mixup={"mixup_alpha": 0.2})
    assert module.optim.lr == 3e-4
    plain = (dict, list, str, int, float, bool, type(None))

    def check(value):
        assert isinstance(value, plain), type(value)
        if isinstance(value, dict):
            [check(v) for v in value.values()]
        if isinstance(value, list):
            [check(v) for v in value]

    check(dict(module.hparams))


def test_mixup_trains_on_soft_targets():
    module = make(mixup={"mixup_alpha": 1.0, "cutmix_alpha": 1.0, "prob": 1.0}, label_smoothing=0.0)
    images, labels = torch.randn(8, 3, 16, 16), torch.randint(0, 4, (8,))
    original = images.clone()  # timm mixes in place
    mixed, targets = module.mixup(images, labels)
    assert targets.shape == (8, 4) and torch.allclose(targets.sum(1), torch.ones(8))
    assert not torch.equal(mixed, original)


def test_checkpoints_hold_each_weight_once_compiled_or_not():
    for compiled in (False, True):
        module = make(compile=compiled)
        keys = list(module.state_dict())
        assert keys == ["model." + k for k in module.model.state_dict()]
        assert not [k for k in keys if "_orig_mod" in k]
