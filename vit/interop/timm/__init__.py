"""timm's ViTs: their hub folders and state dicts read as ours, and ours written as theirs. One file per job:

build.py         timm's model of a ViTConfig: the constructor arguments that build the same network
layout.py        state dicts between ours and timm's VisionTransformer, the layout every foreign source meets in
modules.py       a built timm VisionTransformer read as a ViTConfig; the part readers eva.py and relpos.py share
eva.py           timm's Eva class (EVA-01, EVA-02, their CLIP towers) read, its weights in VisionTransformer's layout
relpos.py        timm's VisionTransformerRelPos, likewise
architecture.py  an architecture by name, built on the meta device and read by its class's reader
state.py         a bare state dict's architecture, from its shapes and the architecture it is named after
folder.py        timm's hub folders (config.json and weights) read, and config.json written for ours
"""

from vit.interop.timm.architecture import read_timm_module, timm_architecture
from vit.interop.timm.build import build_timm, mlp_ratio_for, timm_kwargs
from vit.interop.timm.folder import TIMM_CONFIG, TIMM_WEIGHTS, from_timm_folder, hub_config, is_timm_folder
from vit.interop.timm.layout import from_timm, to_timm
from vit.interop.timm.modules import config_of_timm_model
from vit.interop.timm.state import from_timm_state, table_grid, timm_config

__all__ = [
    "TIMM_CONFIG",
    "TIMM_WEIGHTS",
    "build_timm",
    "config_of_timm_model",
    "from_timm",
    "from_timm_folder",
    "from_timm_state",
    "hub_config",
    "is_timm_folder",
    "mlp_ratio_for",
    "read_timm_module",
    "table_grid",
    "timm_architecture",
    "timm_config",
    "timm_kwargs",
    "to_timm",
]
