"""On a CUDA device: the model agrees with timm, with its own reference paths and with itself on the CPU, its
attention runs on the flash kernel, and train.py trains, compiles, checkpoints and resumes bit for bit there.

Skipped where no GPU is present (CI has none); benchmarks/RESULTS.md says on which GPU they last ran.
Tolerances by dtype: fp32 comparisons run with TF32 off (full fp32 products), so paths that only sum in
another order agree to 1e-4 relative; under bf16 autocast (8 bits of mantissa) each path is compared with the
fp32 result, and ours must be about as close to it as timm's own bf16 path is.
"""

from __future__ import annotations

import os

# cuBLAS is deterministic only with a fixed workspace; it reads this when its first handle is made (the resume test)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torchvision.transforms import InterpolationMode

from benchmarks._common import timm_twin
from tests.data.encoded.test_decoding import folder_module, images_and_labels, train_an_epoch, write_folder
from tests.data.encoded.test_resampling import SIZE, boxes, photos
from tests.helpers import perturb_, relative_error, tiny_config, tiny_run
from tests.reliability.test_resume import RANDOM, STEPS_PER_EPOCH
from vit import create_model
from vit.checkpoint import read
from vit.data.encoded import decoding
from vit.data.encoded.resampling import resample
from vit.model import VisionTransformer
from vit.model.attention import MultiHeadAttention
from vit.model.pos_embed import rope_2d
from vit.training.muon import orthogonalize
from vit.training.optim import OptimConfig, build_optimizer
from vit.training.run import train
from vit.training.run_folder import LAST

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")
AMPERE = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
needs_ampere = pytest.mark.skipif(not AMPERE, reason="bf16 and flash attention need an Ampere or later GPU")


@pytest.fixture(autouse=True)
def _full_fp32():
    """TF32 off for matrix products and convolutions, so that fp32 means fp32; restored afterwards."""
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = conv


def twins(name: str) -> tuple[VisionTransformer, torch.nn.Module, torch.Tensor]:
    """Our model (weights moved off their initial values), timm's with the same weights, and images for them."""
    ours = perturb_(create_model(name, num_classes=10), std=0.05).to(CUDA).eval()
    return ours, timm_twin(ours).eval(), torch.randn(8, 3, *ours.config.img_size, device=CUDA)


@pytest.mark.parametrize("name", ["vit_small_16", "vit_cifar"])
def test_same_weights_give_timms_logits_on_cuda_in_fp32(name):
    ours, theirs, images = twins(name)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.abs().mean() > 0.1  # not two near-zero tensors
        assert relative_error(ours(images), expected) < 1e-4


@needs_ampere
@pytest.mark.parametrize("name", ["vit_small_16", "vit_cifar"])
def test_under_bf16_autocast_ours_is_as_close_to_fp32_as_timms_own(name):
    ours, theirs, images = twins(name)
    with torch.no_grad():
        expected = theirs(images)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours_bf16, theirs_bf16 = ours(images), theirs(images)
    assert ours_bf16.dtype == theirs_bf16.dtype == torch.bfloat16
    ours_error, theirs_error = relative_error(ours_bf16, expected), relative_error(theirs_bf16, expected)
    assert ours_error < 2e-2
    assert ours_error < 2 * theirs_error + 1e-3, (ours_error, theirs_error)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_ampere)])
@pytest.mark.parametrize("with_rope", [False, True])
@pytest.mark.parametrize("queries", [None, 1])
def test_fused_attention_agrees_with_the_reference_on_cuda_outputs_and_gradients(dtype, with_rope, queries):
    """The SDPA path (flash for bf16, memory-efficient for fp32) against softmax(QKᵀ/√D_k)V written out in fp32."""
    attn = perturb_(MultiHeadAttention(64, 4, qkv_bias=True, attn_dropout=0.0, dropout=0.0, fused=True)).to(CUDA)
    x = torch.randn(4, 49, 64, device=CUDA)  # a 7 x 7 grid of tokens, 4 heads of 16 dims
    rope = tuple(t.to(CUDA) for t in rope_2d((7, 7), 16)) if with_rope else None

    def run(fused: bool, autocast: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        attn.fused = fused
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            q, k, v = attn.project(x, rope)
            out, _ = attn.attend(q[:, :, :queries], k, v)
        grads = torch.autograd.grad(out.float().square().sum(), list(attn.parameters()))
        return out, list(grads)

    reference, reference_grads = run(fused=False, autocast=False)
    fast, fast_grads = run(fused=True, autocast=dtype == torch.bfloat16)
    assert fast.dtype == dtype
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    assert relative_error(fast, reference) < tolerance
    for (name, _), a, b in zip(attn.named_parameters(), fast_grads, reference_grads, strict=True):
        assert relative_error(a, b) < tolerance, name


@needs_ampere
def test_our_attention_layout_runs_on_the_flash_kernel_in_bf16():
    """Only the flash backend allowed: SDPA raises if our q, k, v (views of the fused QKV) do not suit it."""
    model = perturb_(create_model("vit_small_16", num_classes=10)).to(CUDA)
    images = torch.randn(4, 3, 224, 224, device=CUDA)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(images).float().square().mean()
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


FAMILIES = {  # preset: timm's model of the family, where it is not timm's VisionTransformer
    "dinov2_small_14": None,  # layer scale, a class token's position row, 224 px (the preset's 518 resampled)
    "siglip_base_16": None,  # the attention-pooling (MAP) head
    "eva02_small_14": "eva02_small_patch14_224",  # rotary phases (eager: the complex product), SwiGLU, sub-norms
}


@pytest.mark.parametrize("name", FAMILIES)
def test_the_families_give_timms_logits_on_cuda_in_fp32(name):
    ours = perturb_(create_model(name, num_classes=10, img_size=224), std=0.02).to(CUDA).eval()
    theirs = timm_twin(ours, FAMILIES[name]).eval()
    images = torch.randn(4, 3, 224, 224, device=CUDA)
    with torch.no_grad():
        expected = theirs(images)
        assert expected.std() > 1e-4  # not two zero tensors (timm starts EVA's head at 1e-3 scale: logits ~3e-4)
        assert relative_error(ours(images), expected) < 1e-4


def test_a_compiled_rope_model_on_cuda_computes_what_it_computes_eager():
    """Compiled, apply_rope is the multiply-add that inductor fuses; eager, a complex product. Same logits and
    gradients (fp32, TF32 off)."""
    config = tiny_config(pos_embed="rope2d", img_size=32, depth=2, pool="avg")
    eager = perturb_(VisionTransformer(config)).to(CUDA)
    compiled_model = VisionTransformer(config).to(CUDA)
    compiled_model.load_state_dict(eager.state_dict())
    compiled = torch.compile(compiled_model)
    images = torch.randn(6, 3, 32, 32, device=CUDA)
    expected, got = eager(images), compiled(images)
    assert relative_error(got, expected) < 1e-5
    expected.square().sum().backward()
    got.square().sum().backward()
    for (name, a), b in zip(eager.named_parameters(), compiled_model.parameters(), strict=True):
        assert relative_error(b.grad, a.grad) < 1e-4, name


@pytest.mark.parametrize("pool", ["token", "avg"])
def test_the_model_on_cuda_computes_what_it_computes_on_the_cpu(pool):
    """Different code on each: the patch embedding is a convolution on CUDA and a matrix product on the CPU;
    SDPA picks other kernels. Same logits and gradients (fp32, TF32 off)."""
    config = tiny_config(pool=pool, img_size=32, depth=3, layer_scale_init=0.5)
    cpu_model = perturb_(VisionTransformer(config))
    cuda_model = VisionTransformer(config).to(CUDA)
    cuda_model.load_state_dict(cpu_model.state_dict())
    images = torch.randn(6, 3, 32, 32)
    on_cpu, on_cuda = cpu_model(images), cuda_model(images.to(CUDA))
    assert relative_error(on_cuda.cpu(), on_cpu) < 1e-5
    on_cpu.square().sum().backward()
    on_cuda.square().sum().backward()
    for (name, a), b in zip(cpu_model.named_parameters(), cuda_model.parameters(), strict=True):
        assert relative_error(b.grad.cpu(), a.grad) < 1e-4, name


@needs_ampere
@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 128)])
def test_muons_bf16_iteration_on_cuda_orthogonalises_as_the_cpus_fp32_one(shape):
    """Newton-Schulz in bf16 is chaotic in its rounding (its steep slope at zero amplifies it), so elements differ
    by ~10% from fp32's; what both must give is the polar factor UVᵀ's direction, singular values near 1."""
    g = torch.randn(8, *shape, generator=torch.Generator().manual_seed(0))
    u, _, vh = torch.linalg.svd(g.double(), full_matrices=False)
    polar = u @ vh

    def cosines(x):  # (8,) each matrix against its polar factor
        x = x.double().cpu()
        return (x * polar).sum((-2, -1)) / (x.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))

    on_cuda, on_cpu = orthogonalize(g.to(CUDA), dtype=torch.bfloat16), orthogonalize(g)
    assert on_cuda.dtype == torch.float32 and on_cuda.is_cuda
    assert (cosines(on_cuda) > cosines(on_cpu) - 0.005).all()
    # five steps lift a singular value only so far: one at 4e-4 of the norm (a square Gaussian matrix here) ends at
    # 0.19 in fp32 and 0.16 in bf16, on the CPU and the H200 alike; the rest reach ~[0.68, 1.19]
    singular, expected = (torch.linalg.svdvals(x.double().cpu()) for x in (on_cuda, on_cpu))
    assert (singular.min(-1).values > 0.5 * expected.min(-1).values).all() and singular.max() < 1.25


@needs_ampere
def test_muon_on_cuda_steps_as_on_the_cpu_within_bf16s_rounding():
    """On CUDA the Newton-Schulz iteration runs in bf16 (on the CPU in fp32): AdamW's parameters step alike, and
    Muon's matrices in the same direction by the same length (bf16 vs fp32 on a CPU: cosines >= 0.98, lengths 1%)."""
    config = tiny_config(depth=2)
    cpu_model = perturb_(VisionTransformer(config))
    cuda_model = VisionTransformer(config).to(CUDA)
    cuda_model.load_state_dict(cpu_model.state_dict())
    start = {k: v.clone() for k, v in cpu_model.state_dict().items()}
    optimizers = [build_optimizer(m, OptimConfig(optimizer="muon", lr=0.01)) for m in (cpu_model, cuda_model)]
    for step in range(3):
        images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(step))
        for model, optimizer in zip((cpu_model, cuda_model), optimizers, strict=True):
            model(images.to(next(model.parameters()).device)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
    muon = {id(p) for group in optimizers[0].param_groups if group["muon"] for p in group["params"]}
    far = []
    for (name, p), b in zip(cpu_model.named_parameters(), cuda_model.parameters(), strict=True):
        a, b, begin = p.detach(), b.detach().cpu(), start[name]
        if name.endswith("attn.qkv.bias"):  # the key's bias has no gradient but round-off (softmax ignores what
            # adds to all of a query's scores alike), which AdamW scales up to steps of lr with a random sign
            a, b, begin = (w.view(3, -1)[[0, 2]] for w in (a, b, begin))
        moved, moved_on_cuda = a - begin, b - begin
        if id(p) in muon:
            cosine = (moved * moved_on_cuda).sum() / (moved.norm() * moved_on_cuda.norm())
            close = cosine > 0.95 and abs(moved_on_cuda.norm() / moved.norm() - 1) < 0.05
        else:
            close = (moved_on_cuda - moved).norm() < 0.05 * moved.norm() + 1e-6
        if not close:
            far.append(name)
    assert not far


@needs_ampere
def test_class_token_only_last_layer_on_cuda_under_bf16_is_as_close_to_fp32_as_the_full_model():
    model = perturb_(create_model("vit_cifar", num_classes=10), std=0.05).to(CUDA).eval()
    images = torch.randn(16, 3, 32, 32, device=CUDA)
    with torch.no_grad():
        expected = model.forward_head(model.forward_features(images))
        assert relative_error(model(images), expected) < 1e-5
        with torch.autocast("cuda", dtype=torch.bfloat16):
            fast, full = model(images), model.forward_head(model.forward_features(images))
    assert relative_error(fast, expected) < 2 * relative_error(full, expected) + 1e-3


GPU_RUN = ["trainer=gpu", "trainer.max_epochs=2", "callbacks.pos_embed_figure=null"]


@needs_ampere
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_train_py_trains_on_the_gpu_in_bf16_mixed(tmp_path, compile):
    results = train(tiny_run(tmp_path, *GPU_RUN, f"compile={str(compile).lower()}"))
    assert results["global_steps"] == 2 * STEPS_PER_EPOCH
    assert results["skipped_steps"] == 0
    assert 0.0 <= results["test_acc"] <= 1.0
    saved = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)
    assert all(torch.isfinite(w).all() for w in saved["state_dict"].values() if w.is_floating_point())
    assert all(w.device.type == "cpu" for w in read(tmp_path / "checkpoints" / LAST)["state_dict"].values())


@needs_ampere
def test_a_gpu_run_stopped_by_sigterm_and_resumed_ends_bit_identical(tmp_path):
    """As tests/reliability/test_resume.py on the CPU, with every random source on the GPU (dropout, drop path,
    on-device crops and flips: the CUDA generator's state must be saved and restored) and deterministic kernels."""
    gpu = ["trainer=gpu", "trainer.deterministic=true", *RANDOM]
    train(tiny_run(tmp_path / "whole", *gpu))
    step = STEPS_PER_EPOCH + 3
    stop = [f"+callbacks.fault={{_target_: tests.reliability.faults.SignalAt, step: {step}}}"]
    with pytest.raises(SystemExit):
        train(tiny_run(tmp_path / "runs" / "1", *gpu, *stop))
    results = train(tiny_run(tmp_path / "runs" / "2", *gpu, *stop, "resume=auto"))
    assert results["resumed_from"] == str(tmp_path / "runs" / "1" / "checkpoints" / LAST)

    def weights(run):
        return torch.load(tmp_path / run / "checkpoints" / LAST, weights_only=True)["state_dict"]

    expected, got = weights("whole"), weights("runs/2")
    different = [k for k in expected if not torch.equal(expected[k], got[k])]
    assert not different, f"differ after resuming: {different}"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_folder(tmp_path_factory.mktemp("decoding"))


@pytest.mark.parametrize("split", ["train", "test"])
def test_jpegs_decoded_on_cuda_give_the_workers_pixels_to_a_few_grey_levels(folder, split):
    """nvjpeg's inverse DCT and chroma upsampling are not libjpeg-turbo's: the same crops, a level or two apart."""
    expected, expected_labels = images_and_labels(folder_module(folder, decode="workers"), split)
    got, labels = images_and_labels(folder_module(folder, decode="device"), split, device="cuda")
    assert torch.equal(labels, expected_labels)
    difference = (got - expected).abs()
    print(f"{split}: mean {difference.mean():.3f}, max {difference.max():.1f} grey levels")  # for RESULTS.md
    assert difference.mean() < 3.0  # H200: 1.2 (test), 1.7 (train); another crop or flip: tens of levels


def test_train_py_decodes_jpegs_on_the_gpu_where_no_augmentation_needs_pil(folder, tmp_path, monkeypatch):
    devices = []
    decode_jpeg = decoding.decode_jpeg
    monkeypatch.setattr(
        decoding, "decode_jpeg", lambda data, **kw: devices.append(kw["device"]) or decode_jpeg(data, **kw)
    )
    train_an_epoch(folder, tmp_path, "trainer=gpu")  # data.decode=auto
    assert devices and all(torch.device(d).type == "cuda" for d in devices)


def test_framing_on_cuda_gives_the_cpus_pixels_with_tf32_switched_on_around_it():
    """The crop-resize-flip products run in full fp32 whatever a run set: TF32's 10-bit products moved 2% of
    pixels by a level on an H200."""
    images = photos(32)
    frames = boxes(images)
    expected = resample(images, frames, SIZE, InterpolationMode.BILINEAR)
    kept = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        got = resample([image.to(CUDA) for image in images], frames, SIZE, InterpolationMode.BILINEAR)
    finally:
        torch.set_float32_matmul_precision(kept)
    differ = (got.cpu() - expected).abs()
    assert differ.max() <= 1 and (differ > 0).float().mean() < 1e-3
