"""finetune=lora through peft: only the adapters and the head learn, the run says how many parameters that is,
the checkpoint resumes exactly, and vit.checkpoint.load and the export fold the adapters into a plain ViT with the
adapted model's logits. finetune=linear: the head alone."""

import pytest
import torch

from tests.helpers import compose, perturb_, tiny_config
from tests.reliability.faults import stopped_and_resumed_end_alike
from vit.checkpoint import Loaded, load
from vit.cli.export import to_safetensors
from vit.interop.lora import ADAPTER, add_lora, merge
from vit.model import VisionTransformer
from vit.training.run import train
from vit.training.run_folder import LAST

RUN = ["data=synthetic", "data.img_size=16", "data.train_size=192", "data.batch_size=32", "trainer.max_epochs=2",
       "trainer.log_every_n_steps=1", "callbacks.pos_embed_figure=null", "optim.lr=1e-2"]  # fmt: skip


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A small network's exported weights, 5 classes: the run fine-tunes it to the synthetic data's."""
    path = tmp_path_factory.mktemp("lora") / "pretrained.safetensors"
    model = perturb_(VisionTransformer(tiny_config(num_classes=5)), std=0.05)
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    return path


def test_merged_adapters_compute_what_the_adapted_model_does():
    model = perturb_(VisionTransformer(tiny_config())).eval()
    add_lora(model, rank=4, alpha=8.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # zero at the start: moved so that the adapters change the logits
                p.normal_(0, 0.2)
        images = torch.randn(3, 3, 16, 16)
        adapted = model(images)
        merged = merge(model)(images)
    assert not any(ADAPTER in name for name in model.state_dict())
    assert set(model.state_dict()) == set(VisionTransformer(tiny_config()).state_dict())
    torch.testing.assert_close(merged, adapted, atol=1e-5, rtol=0)


def test_a_lora_run_trains_the_adapters_and_head_only_and_loads_merged(pretrained, tmp_path):
    results = train(compose(*RUN, "finetune=lora", "finetune.rank=2", f"model.pretrained={pretrained}",
                            f"output_dir={tmp_path}"))  # fmt: skip
    # 2 layers x 4 targets x rank 2 x (in + out); D = 32, MLP 128; plus the new head for the 4 synthetic classes
    adapters = 2 * 2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert results["trainable_params"] == adapters + 32 * 4 + 4
    assert results["params"] > 10 * results["trainable_params"]
    saved = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["state_dict"]
    start = load(pretrained).model.state_dict()
    for key, value in saved.items():  # the base layers are the pretrained ones, untouched
        base = key.removeprefix("model.").replace(".base_layer.", ".")
        if ADAPTER not in key and not key.startswith("model.head") and base in start:
            assert torch.equal(value, start[base]), key
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in saved.items() if "lora_B" in k)  # they learned
    # the checkpoint loads as a plain network with the adapted model's logits
    loaded = load(tmp_path / "checkpoints" / LAST)
    assert not any(ADAPTER in name for name in loaded.model.state_dict())
    from vit.training.module import ViTClassifier

    module = ViTClassifier(**torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["hyper_parameters"])
    module.adapt()
    module.load_state_dict(saved)
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), module.eval().model(images), atol=1e-5, rtol=0)
    # and so does its export
    to_safetensors(loaded, tmp_path / "exported.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "exported.safetensors").model(images), loaded.model(images))


@pytest.mark.slow  # three runs: ~20 s
def test_a_lora_run_stopped_mid_epoch_resumes_bit_identical(pretrained, tmp_path):
    def run(folder, *more):
        return compose(
            *RUN, "finetune=lora", f"model.pretrained={pretrained}", f"output_dir={tmp_path / folder}", *more
        )

    stopped_and_resumed_end_alike(run, tmp_path, step=6, steps=8)  # epoch 2's third step


@pytest.mark.parametrize(
    "override, said",
    [
        ("finetune.rank=0", r"^finetune\.rank=0: must be a whole number >= 1$"),
        ("finetune.targets=[attn.qkv,head]", r"^finetune\.targets=\['attn\.qkv', 'head'\]: give a list of attn\.qkv"),
        ("finetune.kind=qlora", r"^finetune\.kind='qlora': give one of full, linear, lora$"),
    ],
)
def test_lora_settings_out_of_range_are_one_config_error(pretrained, tmp_path, override, said):
    from vit.model import ConfigError

    with pytest.raises(ConfigError, match=said):
        train(compose(*RUN, "finetune=lora", override, f"model.pretrained={pretrained}", f"output_dir={tmp_path}"))


def test_a_target_that_is_not_a_linear_map_of_every_layer_is_refused():
    with pytest.raises(ValueError, match=r"^LoRA target 'attn.norm' is not a linear map of every layer"):
        add_lora(VisionTransformer(tiny_config()), rank=2, alpha=4.0, targets=["attn.qkv", "attn.norm"])
