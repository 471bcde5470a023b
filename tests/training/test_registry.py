"""One register() makes conf/train.yaml composable: the resolvers, and each typed group's defaults as the node the
group's YAML is composed over, so that every field of a group can be overridden without Hydra's '+'."""

import pytest
from omegaconf import OmegaConf

from tests.helpers import compose
from vit import ViTConfig, list_presets, preset_config
from vit.training.registry import NODES, defaults
from vit.training.settings import Settings

FROM_DATA = ("img_size", "in_chans", "num_classes")  # conf/train.yaml takes them from the data group


@pytest.mark.parametrize("name", NODES)
def test_each_node_is_its_groups_defaults_and_builds_them(name):
    kind = NODES[name]
    node = {k: v for k, v in defaults(kind).items() if k != "_target_"}
    OmegaConf.create(node)  # plain YAML values
    built = ViTConfig.from_dict(node) if kind is ViTConfig else kind(**node)
    assert built == kind()


@pytest.mark.parametrize("name", list_presets())
def test_hydra_composes_each_preset_over_the_defaults_into_its_config(name):
    settings = Settings.of(compose(f"model={name}"))
    assert settings.model_fields.keys() == {"_target_"} | set(ViTConfig().to_dict())
    preset = preset_config(name)
    composed = ViTConfig.from_dict({**settings.model_fields, **{k: getattr(preset, k) for k in FROM_DATA}})
    assert composed == preset


def test_a_field_no_group_file_states_is_overridden_without_plus():
    cfg = compose(
        "model=vit_cifar", "model.dropout=0.1", "model.layer_scale_init=1e-4", "model.rope.axes=yx",
        "optim.layer_decay=0.7", "distill.tau=2.0", "task.kind=classify", "finetune.rank=4",
    )  # fmt: skip
    settings = Settings.of(cfg)
    fields = settings.model_fields
    assert (fields["dropout"], fields["layer_scale_init"], fields["depth"], fields["rope"]["axes"]) == (
        0.1, 1e-4, 7, "yx")  # fmt: skip
    assert (settings.optim.layer_decay, settings.distill.tau, settings.finetune.rank) == (0.7, 2.0, 4)
