"""finetune=lora through peft: only the adapters and the head learn, the run says how many parameters that is,
the checkpoint resumes exactly, and vit.checkpoint.load and the export fold the adapters into a plain ViT with the
adapted model's logits. finetune=linear: the head alone. Their checkpoints hold what learns; the frozen rest is read
again from the pretrained file, its digest checked."""

import shutil

import pytest
import torch

from tests.helpers import classifier, compose, perturb_, tiny_config
from tests.reliability.faults import stopped_and_resumed_end_alike
from vit.checkpoint import CheckpointError, Loaded, load
from vit.cli.export import to_safetensors
from vit.interop.finetune import load_pretrained_
from vit.interop.frozen import FROZEN
from vit.interop.lora import ADAPTER, LoraSettings, add_lora, check_rank, merge
from vit.model import ConfigError, VisionTransformer, ViTConfig
from vit.training.module import ViTClassifier
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
    add_lora(model, LoraSettings(rank=4, alpha=8.0))
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


def _adapted_as_the_run(checkpoint: dict, pretrained) -> ViTClassifier:
    """The run's module rebuilt as train() builds it: the pretrained file's weights, then the adapters."""
    hparams = checkpoint["hyper_parameters"]
    config = ViTConfig.from_dict(hparams["model"])
    module = classifier(config, finetune=hparams["finetune"], pretrained_from=hparams["pretrained_from"])
    load_pretrained_(module.model, pretrained)
    module.adapt()
    return module


def test_a_lora_run_trains_the_adapters_and_head_only_and_loads_merged(pretrained, tmp_path):
    results = train(compose(*RUN, "finetune=lora", "finetune.rank=2", f"model.pretrained={pretrained}",
                            f"output_dir={tmp_path}"))  # fmt: skip
    # 2 layers x 4 targets x rank 2 x (in + out); D = 32, MLP 128; plus the new head for the 4 synthetic classes
    adapters = 2 * 2 * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))
    assert results["trainable_params"] == adapters + 32 * 4 + 4
    assert results["params"] > 10 * results["trainable_params"]
    checkpoint = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)
    saved = checkpoint["state_dict"]
    # the checkpoint holds the weights that learned (the adapters and the head) and a record of the frozen rest
    assert sum(v.numel() for k, v in saved.items() if k.startswith("model.")) == results["trainable_params"]
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in saved.items() if "lora_B" in k)  # they learned
    module = _adapted_as_the_run(checkpoint, pretrained)
    assert (
        checkpoint[FROZEN]["sha256"] == module.features[0].record.sha256
    )  # the base layers are the pretrained ones, untouched
    assert len(checkpoint[FROZEN]["keys"]) == sum(1 for p in module.model.parameters() if not p.requires_grad)
    # the checkpoint loads as a plain network with the adapted model's logits, its frozen weights read again
    loaded = load(tmp_path / "checkpoints" / LAST)
    assert not any(ADAPTER in name for name in loaded.model.state_dict())
    module.on_load_checkpoint(checkpoint)  # what a resumed run does: its own frozen weights in
    module.load_state_dict(checkpoint["state_dict"])
    images = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(images), module.eval().model(images), atol=1e-5, rtol=0)
    # and so does its export
    to_safetensors(loaded, tmp_path / "exported.safetensors")
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "exported.safetensors").model(images), loaded.model(images))
    # a checkpoint stating a rank of 10^8 in its settings: refused naming it, before adapters of 38 GB are made
    checkpoint["hyper_parameters"]["finetune"]["rank"] = 10**8
    torch.save(checkpoint, tmp_path / "hostile.ckpt")
    with pytest.raises(CheckpointError, match=rf"^{tmp_path / 'hostile.ckpt'}: .*\(finetune\.rank=100000000: B A has"):
        load(tmp_path / "hostile.ckpt")


@pytest.mark.parametrize("kind", ["lora", "linear"])
def test_the_frozen_weights_come_back_from_the_pretrained_file_or_are_refused(pretrained, tmp_path, kind):
    start = tmp_path / "start.safetensors"
    shutil.copy(pretrained, start)
    train(compose(*RUN, "trainer.max_epochs=1", f"finetune={kind}", f"model.pretrained={start}",
                  f"output_dir={tmp_path / 'run'}"))  # fmt: skip
    last = tmp_path / "run" / "checkpoints" / LAST
    checkpoint = torch.load(last, weights_only=True)
    learned = ("model.head.", "model.layers.") if kind == "lora" else ("model.head.",)
    assert all(
        k.startswith(learned) and (kind == "linear" or "head" in k or ADAPTER in k) for k in checkpoint["state_dict"]
    )
    before = load(last).model.state_dict()
    assert set(before) == set(VisionTransformer(tiny_config(num_classes=4)).state_dict())
    # the file changed since: refused, never a network with other frozen weights
    model = perturb_(load(start).model, std=0.01)
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, start), start)
    with pytest.raises(CheckpointError, match=rf"^{last}: the weights in {start} are not those the run started from"):
        load(last)
    with pytest.raises(CheckpointError, match="holds only the weights that learned from"):  # resuming, likewise
        train(compose(*RUN, "trainer.max_epochs=2", f"finetune={kind}", f"model.pretrained={start}",
                      f"output_dir={tmp_path / 'run'}", f"resume={last}"))  # fmt: skip
    start.unlink()
    with pytest.raises(CheckpointError, match=rf"^{last}: holds only the weights that learned; its frozen rest cannot"):
        load(last)


@pytest.mark.slow  # three runs: ~20 s
def test_a_lora_run_stopped_mid_epoch_resumes_bit_identical(pretrained, tmp_path):
    """From a checkpoint without the frozen weights, with an average of the weights (EMA) beside the live ones."""

    def run(folder, *more):
        return compose(*RUN, "finetune=lora", f"model.pretrained={pretrained}", "ema_decay=0.9",
                       f"output_dir={tmp_path / folder}", *more)  # fmt: skip

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


def test_a_rank_past_the_maps_widths_is_refused_before_any_adapter_is_made(pretrained, tmp_path):
    """finetune.rank=100000000 asked for 38 GB after 43 s: the size checks covered model.* only."""
    from vit.model import ConfigError

    said = (
        r"^finetune\.rank=100000000: B A has rank at most 32 on the maps it adapts \(attn\.qkv 32 -> 96, "
        r"attn\.out_proj 32 -> 32, mlp\.fc1 32 -> 128, mlp\.fc2 128 -> 32\): give a rank <= 32$"
    )
    run = compose(*RUN, "finetune=lora", "finetune.rank=100000000", f"model.pretrained={pretrained}",
                  f"output_dir={tmp_path}")  # fmt: skip
    with pytest.raises(ConfigError, match=said) as refused:
        train(run)
    assert refused.traceback[-1].name == "check_rank"  # raised by the check, before peft's layers are made


def test_adapters_that_would_not_fit_beside_the_network_are_refused(monkeypatch):
    from vit.model import ConfigError, size

    config = tiny_config()
    per_rank = 4 * config.depth * ((32 + 96) + (32 + 32) + (32 + 128) + (128 + 32))  # fp32 A and B, every map
    monkeypatch.setattr(size, "machine_memory", lambda: size.weight_bytes(config) + per_rank)
    check_rank(config, 1)
    with pytest.raises(ConfigError, match=r"^finetune\.rank=2: the network with its LoRA adapters needs .*, more than"):
        check_rank(config, 2)


@pytest.mark.parametrize("kind", ["lora", "linear"])
def test_a_partial_finetune_without_a_pretrained_network_is_refused(kind, tmp_path):
    """It trained adapters or a head on a random frozen network without a word."""
    from vit.model import ConfigError
    from vit.training.checks import check_config

    said = rf"^finetune\.kind={kind} without model\.pretrained: it would train .* on a frozen random network; give"
    with pytest.raises(ConfigError, match=said):
        check_config(compose(*RUN, "model.patch_size=4", f"finetune={kind}", f"output_dir={tmp_path}"))


def test_a_target_that_is_not_a_linear_map_of_every_layer_is_refused():
    with pytest.raises(ConfigError, match=r"^finetune\.targets=\['attn.qkv', 'attn.norm'\]: give a list of attn.qkv"):
        LoraSettings(rank=2, alpha=4.0, targets=["attn.qkv", "attn.norm"])
    model = VisionTransformer(tiny_config())
    model.layers[1].mlp.fc2 = torch.nn.Identity()  # a network one of whose layers lacks the map
    with pytest.raises(ValueError, match=r"^LoRA target 'mlp.fc2' is not a linear map of every layer"):
        add_lora(model, LoraSettings(rank=2, alpha=4.0, targets=["attn.qkv", "mlp.fc2"]))
