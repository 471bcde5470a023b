import pytest
from omegaconf import OmegaConf

from tests.helpers import compose
from vit import ViTConfig, list_presets, preset_config
from vit.training.checks import model_fields
from vit.training.model_defaults import model_defaults

FROM_DATA = ("img_size", "in_chans", "num_classes")  # conf/train.yaml takes them from the data group


def test_the_node_is_vit_config_defaults_and_builds_them():
    node = model_defaults()
    assert ViTConfig.from_dict(node) == ViTConfig()
    assert OmegaConf.create(node)._target_ == "vit.model.config.ViTConfig"


@pytest.mark.parametrize("name", list_presets())
def test_hydra_composes_each_preset_over_the_defaults_into_its_config(name):
    fields, _ = model_fields(compose(f"model={name}"))
    assert fields.keys() == {"_target_"} | {k for k in ViTConfig().to_dict()}
    preset = preset_config(name)
    composed = ViTConfig.from_dict({**fields, **{k: getattr(preset, k) for k in FROM_DATA}})
    assert composed == preset


def test_a_field_no_preset_states_is_overridden_without_plus():
    fields, _ = model_fields(compose("model=vit_cifar", "model.dropout=0.1", "model.layer_scale_init=1e-4"))
    assert (fields["dropout"], fields["layer_scale_init"], fields["depth"]) == (0.1, 1e-4, 7)
