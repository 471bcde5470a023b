"""trainer=fsdp: sharded data parallel with torch's FSDP2 (`fully_shard`), run by Lightning's ModelParallelStrategy.

Every process holds 1/N of each layer's weights, gradients and optimizer state; a layer's whole weights exist only
while it computes (all-gathered before, freed after). Each transformer layer is one FSDP unit, the embedding, final
norm and head the root's. Mixed precision is FSDP2's MixedPrecisionPolicy (the weights gathered and computed in
`param_dtype`, gradients reduced in `reduce_dtype`, the fp32 shards the optimizer's master weights), so the trainer
itself runs at 32-true; `cpu_offload` keeps the shards and the optimizer's step on the CPU.

Why ModelParallelStrategy and not Lightning's FSDPStrategy: FSDPStrategy wraps FSDP1 (FlatParameter, one flat
buffer per unit), whose state dicts and checkpoints differ from the module's own; ModelParallelStrategy leaves the
wrapping to the module's configure_model, where fully_shard keeps every parameter as a DTensor under its own name,
and saves checkpoints with torch.distributed.checkpoint (DCP): a folder with each rank's shard, never the whole model
gathered on one rank.

Checkpoints here are that folder written whole or not at all: every rank writes into a temporary folder, which then
takes the old one's place in one step (vit/atomic.py), and none is written whose weights are not finite. A sharded
checkpoint resumes on any number of processes (DCP reshards on loading); `python -m vit.cli.consolidate` turns it into
one file that the loader, predict and export read.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn

from vit.atomic import WriteError, write_folder_atomically
from vit.interop.files import CheckpointError, nonfinite, read
from vit.interop.sharded import DCP_METADATA, META, check, is_sharded_checkpoint, load_into, saved_shapes
from vit.training.resume import refuse_unfit

log = logging.getLogger(__name__)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# the network's entry points besides forward: MAE's encoder on the visible patches, feature distillation's tokens,
# DeiT's two heads
ROOT_METHODS = ("forward_features", "forward_heads")
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp|" + "|".join(map(re.escape, (DCP_METADATA, META))))  # its files


def is_sharded(trainer: Any) -> bool:
    """Whether a trainer config (cfg.trainer) runs this strategy: trainer=fsdp, or its _target_ named by hand."""
    strategy = trainer.get("strategy") if hasattr(trainer, "get") else None
    target = strategy.get("_target_", "") if hasattr(strategy, "get") else ""
    return target.rsplit(".", 1)[-1] == ShardedStrategy.__name__


def shard(
    model: nn.Module,
    layers: nn.ModuleList,
    mesh: Any,
    param_dtype: str | None = "bf16",
    reduce_dtype: str = "fp32",
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
    beside: Sequence[nn.Module] = (),
) -> tuple[int, int]:
    """FSDP2 on a network, in place: each of `layers` one unit, then the root (embeddings, final norm, head) over
    `mesh`; returns this rank's parameters and the network's. Our ViT's and timm's alike (benchmarks/fsdp.py).
    `beside`: what learns beside the network (an MAE decoder, a distillation projector), each one unit of its own:
    a module FSDP does not hold would keep each rank's own gradients, and its copies would drift apart."""
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        OffloadPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    settings = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(
            param_dtype=DTYPES[param_dtype] if param_dtype else None, reduce_dtype=DTYPES[reduce_dtype]
        ),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    total = sum(p.numel() for p in model.parameters())
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, **settings)
        if hasattr(layer, "forward_first_token"):  # our last layer computes its class token alone through it
            register_fsdp_forward_method(layer, "forward_first_token")
    # the root's gathers stay until backward: it computes first and last, resharding it saves nothing
    fully_shard(model, reshard_after_forward=False, **settings)
    for method in ROOT_METHODS:  # called by tasks and features without forward: they gather the root's weights too
        if hasattr(model, method):
            register_fsdp_forward_method(model, method)
    for module in beside:
        fully_shard(module, reshard_after_forward=False, **settings)
    return sum(p.to_local().numel() for p in model.parameters()), total


def learners(owner: nn.Module) -> list[nn.Module]:
    """The modules under `owner` whose weights train (a frozen teacher's do not), each called as a whole (a decoder,
    a projector): a dict or list of them is looked into, as FSDP takes modules that compute."""
    found = []
    for child in owner.children():
        if isinstance(child, (nn.ModuleDict, nn.ModuleList)):
            found += learners(child)
        elif any(p.requires_grad for p in child.parameters()):
            found.append(child)
    return found


class ShardedStrategy(ModelParallelStrategy):
    """FSDP2 over every process (data parallel only: no tensor parallel mesh dimension), atomic DCP checkpoints.

    param_dtype: 'bf16' | 'fp16' | None (fp32): the dtype weights are gathered and computed in;
    reduce_dtype: the dtype gradients are reduced (averaged across processes) in;
    reshard_after_forward: free a layer's gathered weights after its forward (gather again for backward: least
        memory) or keep them until backward (one all-gather fewer per layer);
    cpu_offload: keep the weight shards, gradients and optimizer state in CPU memory (CPUOffloadPolicy).
    """

    def __init__(
        self,
        param_dtype: str | None = "bf16",
        reduce_dtype: str = "fp32",
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        **kwargs: Any,
    ):
        for key, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
            if value is not None and value not in DTYPES:
                raise ValueError(f"trainer.strategy.{key}={value!r}: give one of {', '.join(DTYPES)}")
        super().__init__(save_distributed_checkpoint=True, **kwargs)
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype
        self.reshard_after_forward, self.cpu_offload = reshard_after_forward, cpu_offload
        self.held: tuple[int, int] | None = None  # this rank's parameters and the model's, once sharded

    def setup_environment(self) -> None:
        # every process one data-parallel rank: ModelParallelStrategy's "auto" would make the processes of a node
        # a tensor-parallel group
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    def shard_(self, model: nn.Module, layers: nn.ModuleList, beside: Sequence[nn.Module] = ()) -> None:
        """fully_shard each of `layers`, then `model` (the rest: embeddings, norm, head), then each of `beside`, in
        place; once."""
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):  # configure_model runs again for test after fit
            return
        settings = (self.param_dtype, self.reduce_dtype, self.reshard_after_forward, self.cpu_offload)
        local, total = shard(model, layers, self.device_mesh["data_parallel"], *settings, beside=beside)
        self.held = (local, total)
        log.info(
            "trainer=fsdp: rank %d holds %s of the %s parameters (%.1f%%)",
            self.global_rank,
            f"{local:,}",
            f"{total:,}",
            100 * local / total,
        )

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        """Every rank's shard into a temporary folder, which then replaces `filepath` in one step; refused on every
        rank, the previous checkpoint kept, where any rank's weights are not finite or the folder cannot be written."""
        path = Path(self.broadcast(str(filepath)))
        state = {k: v.to_local() if hasattr(v, "to_local") else v for k, v in checkpoint.get("state_dict", {}).items()}
        bad = self._gathered(nonfinite(state))
        if bad:
            raise CheckpointError(f"{path}: not written: non-finite values in {', '.join(bad[:5])}")
        # rank 0 leads: ("write", folder) while its atomic writer holds the temporary folder, then ("done", error)
        if self.global_rank == 0:
            names = {p.name for p in path.iterdir() if _SHARD_FILE.fullmatch(p.name)} if path.is_dir() else set()
            names |= {DCP_METADATA, META} | {f"__{r}_0.distcp" for r in range(self.world_size)}

            def write(partial: Path) -> None:
                self.broadcast(("write", str(partial)))
                self._write(checkpoint, partial)

            try:
                write_folder_atomically(path, write, names)
                error = None
            except WriteError as err:
                error = str(err)
            self.broadcast(("done", error))
        else:
            step, value = self.broadcast(None)
            failed = None
            if step == "write":
                try:
                    self._write(checkpoint, Path(value))
                except Exception as err:  # DCP raises on every rank; rank 0 says it in its message
                    failed = err
                step, value = self.broadcast(None)
            error = value or (failed and f"{path}: not written ({failed})")
        if error is not None:
            raise CheckpointError(error)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        """Lightning's load of a sharded checkpoint into the shards, but through the reader that runs nothing in
        the folder (vit/interop/dcp.py) and meta.pt read weights_only; the module's shapes compared with the
        folder's first, so that other LoRA adapters are one line rather than DCP's traceback from every rank.
        A single file Lightning reads itself (weights_only, as train() asks)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        path = Path(self.broadcast(str(checkpoint_path)))
        if not is_sharded_checkpoint(path):
            return super().load_checkpoint(path, weights_only=weights_only)
        shards, module = check(path), self.model
        weights = get_model_state_dict(module)
        refuse_unfit(path, saved_shapes(shards), {name: tensor.shape for name, tensor in weights.items()})
        load_into(shards, {"state_dict": weights})
        module.load_state_dict(weights, strict=self.lightning_module.strict_loading)
        for k, optimizer in enumerate(self.optimizers):  # Lightning's names: optimizer_0, ...
            state = {f"optimizer_{k}": get_optimizer_state_dict(module, optimizer)}
            load_into(shards, state)
            options = StateDictOptions(cpu_offload=True)
            set_optimizer_state_dict(module, optimizer, optim_state_dict=state[f"optimizer_{k}"], options=options)
        return read(path / META)

    def _write(self, checkpoint: dict[str, Any], folder: Path) -> None:
        """DCP's save of every rank's shard into the temporary folder, Lightning's meta.pt from rank 0."""
        try:
            super().save_checkpoint(checkpoint, folder)
        finally:
            self.barrier("sharded checkpoint written")

    def _gathered(self, local: list[str]) -> list[str]:
        if not (dist.is_available() and dist.is_initialized()):
            return local
        every: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(every, local)
        return sorted({name for names in every for name in names or []})
