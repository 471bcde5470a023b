"""The benchmark scripts of benchmarks/ run end to end in their --quick mode and write their JSON (the FLOP count
that MFU rests on: tests/model/test_flops.py). Timings are not checked: they measure the machine.
(The fast paths the benchmarks chose are checked against their references beside their code's other tests.)"""

import argparse
import json

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from benchmarks import data, decode, products, sources, step_pieces, throughput, time_to_accuracy
from benchmarks._common import KINETO_LOG_LEVEL, data_module, timm_twin
from benchmarks.products import largest_cache_bytes, products_alone, record, time_alone
from tests.helpers import tiny_config, tiny_run
from vit.data.memory.fashion_mnist import DEBIAN_DIR
from vit.model import VisionTransformer
from vit.model.flops import forward_flops
from vit.training.run import train
from vit.training.run_folder import LAST

needs_fashion_mnist = pytest.mark.skipif(not DEBIAN_DIR.is_dir(), reason="Debian's dataset-fashion-mnist is absent")


@pytest.fixture(scope="module")
def fashion_root(tmp_path_factory):
    """One unpacked copy of Fashion-MNIST for the scripts that read it (they unpack into data.root)."""
    return str(tmp_path_factory.mktemp("fashion_mnist"))


def test_products_alone_replays_every_matrix_product_of_a_step_and_counts_its_flops():
    """Inference: the analytic count less QKᵀ and AV (inside SDPA's kernel, not replayed). Training: three times
    that, less the patch embedding's product for the images' gradient, which no one asks for."""
    config = tiny_config(pool="avg")
    model, batch, cpu = VisionTransformer(config), 4, torch.device("cpu")
    images, labels = torch.randn(batch, 3, 16, 16), torch.randint(0, config.num_classes, (batch,))
    attention = 4 * config.num_patches**2 * config.embed_dim * config.depth
    patches = 2 * config.num_patches * config.in_chans * config.patch_size[0] * config.patch_size[1] * config.embed_dim
    expected = {"infer": forward_flops(config) - attention}
    expected["train"] = 3 * expected["infer"] - patches
    for mode, flops in expected.items():
        alone = products_alone(throughput.make_step(model, mode, images, labels, cpu, "fp32"), cpu)
        assert alone["flops"] == batch * flops, mode
        assert alone["attention_calls"] == config.depth * (2 if mode == "train" else 1)
        assert alone["seconds"] > 0 and alone["seconds_cold"] > 0


def test_cold_products_are_each_timed_once_after_the_caches_are_flushed(monkeypatch):
    """Every cold sample is one call right after a write of twice the largest cache: nothing of the operands left."""
    a, b = torch.randn(8, 4), torch.randn(4, 3)
    recorded, _ = record(lambda: (a @ b, a @ b, a.t() @ a))
    events, fill = [], torch.Tensor.fill_
    monkeypatch.setattr(products, "largest_cache_bytes", lambda device: 1000)

    def flush(tensor, value):
        events.append(("flush", tensor.numel()))
        return fill(tensor, value)

    def replay(product, device):
        return lambda: events.append(("call", product.args[0][0]))

    monkeypatch.setattr(torch.Tensor, "fill_", flush)
    monkeypatch.setattr(products.Product, "replay", replay)
    assert time_alone(recorded, torch.device("cpu"), samples=3, cold=True) > 0
    for shape in [(8, 4), (4, 8)]:  # the first call picks the kernel, then flush and call three times
        assert events[:7] == [("call", shape)] + [("flush", 2000), ("call", shape)] * 3
        del events[:7]
    assert events == []


def test_largest_cache_is_read_from_linux_cache_sizes(tmp_path):
    for index, size in [("index0", "48K"), ("index2", "1024K"), ("index3", "32M")]:
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert largest_cache_bytes(torch.device("cpu"), tmp_path) == 32 * 2**20
    assert largest_cache_bytes(torch.device("cpu"), tmp_path / "absent") == 64 * 2**20


@pytest.mark.parametrize("pos_embed", ["learned", "sincos2d", "none"])
def test_timm_twin_trains_the_parameters_ours_trains(pos_embed):
    """A fixed table is a buffer of ours and a parameter of timm's: left trainable, timm's loop learned positions."""
    ours = VisionTransformer(tiny_config(pos_embed=pos_embed))

    def trained(model):
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    assert trained(timm_twin(ours)) == trained(ours)


def test_throughput_quick_times_both_models_in_every_mode(tmp_path, capfd, monkeypatch):
    """Both models in both modes, their MFU on a CPU against the best of the fp32 peaks measured before and after
    each case (tested alone below): a host whose speed drifts measured a low peak at the start once, and a case then
    showed an MFU of 104%."""
    monkeypatch.delenv(KINETO_LOG_LEVEL, raising=False)
    measured = iter([0.001, 0.004, 0.002])  # TFLOP/s: before the cases, after the first, after the second
    monkeypatch.setattr(throughput, "cpu_peak_tflops", lambda precision, seconds: next(measured))
    results = throughput.main(["--quick", "--device", "cpu", "--json", str(tmp_path / "t.json")])
    if not torch.cuda.is_available():  # the profiler (peak memory) says nothing of the GPU there is none of
        noise = [line for line in capfd.readouterr().err.splitlines() if "USDT" in line or "gpuGetDeviceCount" in line]
        assert noise == []
    assert [(r["mode"], r["path"]) for r in results] == [("train", "eager"), ("infer", "eager")]
    for r in results:
        assert set(r["images_per_second"]) == {"ours", "timm"} and min(r["images_per_second"].values()) > 0
        assert r["ours_over_timm"] > 0 and min(r["peak_memory_mib"].values()) > 0
    facts = json.loads((tmp_path / "t.json").read_text())["machine"]
    assert facts["torch"] == torch.__version__ and set(facts["cpu_flags"]) <= {
        "avx2",
        "avx512f",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
    }
    assert facts["cpu_peak_tflops"] == 0.004 and facts["cpu_peak_tflops_each"] == [0.001, 0.004, 0.002]
    for r in results:  # the model's FLOP/s over the best peak
        assert r["mfu_ours"] == pytest.approx(r["achieved_tflops_ours"] / 0.004)


def test_the_cpu_peak_is_a_measured_matrix_product_rate_and_stops_growing_sizes_when_slow(monkeypatch):
    sizes = []
    real_randn = torch.randn
    monkeypatch.setattr(torch, "randn", lambda n, m: sizes.append(n) or real_randn(n, m))
    assert 0 < throughput.cpu_peak_tflops("fp32", seconds=0.2) < 100  # no 2-core CPU does 100 TFLOP/s
    assert sizes[:4] == [256, 256, 512, 512]  # two operands a size, growing
    sizes.clear()
    assert 0 < throughput.cpu_peak_tflops("bf16", seconds=0.0) < 100 and sizes == [256, 256]  # one slow call, no more


@pytest.mark.slow  # a benchmark's smoke run: 10 s
@needs_fashion_mnist
def test_time_to_accuracy_quick_trains_both_loops_and_measures_overhead(tmp_path, fashion_root):
    argv = ["--quick", "--data-root", fashion_root, "--targets", "0", "1.01", "--json", str(tmp_path / "a.json")]
    payload = time_to_accuracy.main(argv)
    for run in ("ours", "timm"):
        curve = payload[run]["curve"]
        assert len(curve) == 1 and 0 <= curve[0]["test_acc"] <= 1
        assert payload[run]["seconds_to"] == {"0.0": curve[0]["train_seconds"], "1.01": None}  # as the table
    assert payload["overhead"]["train_py"]["mean"] > -1 and payload["overhead"]["floor"]["median"] > -1
    assert (tmp_path / "a.json").is_file()


def test_bare_loop_trains_on_a_new_order_each_epoch_as_train_py_does(tmp_path):
    """Lightning sets the sampler's epoch before each of train.py's epochs; the bare loop repeated epoch 0's order."""
    tiny = ["data=synthetic", "model.patch_size=4", "model.embed_dim=32", "model.depth=1", "model.num_heads=4"]
    args = argparse.Namespace(
        experiment="fashion_mnist", device=torch.device("cpu"), precision="fp32", data_root=None, overrides=tiny
    )
    cfg = time_to_accuracy.experiment_config(args, tmp_path)
    synthetic = data_module(cfg)  # no random crop or flip: a batch's images are known
    model = time_to_accuracy.initial_model(cfg, args.device)
    seen = []
    model.register_forward_pre_hook(lambda module, inputs: seen.append(inputs[0].clone()))
    time_to_accuracy.bare_loop(model, synthetic, cfg, args, epochs=2, limit_batches=1)
    loader = synthetic.train_dataloader()  # the run's seed, as train.py's loader and the bare loop's
    assert len(seen) == 2
    for epoch, images in enumerate(seen):
        loader.sampler.set_epoch(epoch)
        torch.testing.assert_close(images, synthetic.augment(next(iter(loader))[0], train=True))


class EvaluatedWeights(L.Callback):
    """Records, where AccuracyCurve measures, the weights it measures and the live ones (class-level: Hydra builds
    the instance)."""

    seen: list[tuple[dict, dict]] = []  # noqa: RUF012

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        evaluated = time_to_accuracy.evaluated_model(trainer, pl_module)
        copy = {k: v.clone() for k, v in evaluated.state_dict().items()}
        EvaluatedWeights.seen.append((copy, {k: v.clone() for k, v in pl_module.model.state_dict().items()}))


@pytest.mark.parametrize("ema", [True, False])
def test_time_to_accuracy_measures_the_ema_weights_when_the_run_keeps_them(tmp_path, ema):
    """As bare_loop does: the weights train.py tests and checkpoints, not the live ones (a GPU run compared ours'
    live weights with timm's EMA before this)."""
    EvaluatedWeights.seen.clear()
    record = f"+callbacks.evaluated._target_={__name__}.EvaluatedWeights"
    few = ("trainer.limit_train_batches=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1")
    train(tiny_run(tmp_path, record, f"ema_decay={0.9 if ema else 'null'}", "callbacks.pos_embed_figure=null", *few))
    evaluated, live = EvaluatedWeights.seen[-1]
    saved = torch.load(tmp_path / "checkpoints" / LAST, weights_only=True)["state_dict"]
    for k, v in evaluated.items():
        torch.testing.assert_close(v, saved[f"model.{k}"])
    assert torch.equal(evaluated["head.weight"], live["head.weight"]) != ema


@needs_fashion_mnist
def test_data_quick_compares_each_path_with_its_model(tmp_path, fashion_root):
    results = data.main(["--quick", "--data-root", fashion_root, "--json", str(tmp_path / "d.json")])
    assert [r["path"].split(",")[0].split(" (")[0] for r in results] == ["in memory", "in memory", "image folder"]
    assert all(r["data_images_per_second"] > 0 and r["model_images_per_second"] > 0 for r in results)


@pytest.mark.slow  # ~17 s, the default suite's heaviest: worker pools started per case
def test_decode_quick_times_decoding_in_workers_and_on_the_device(tmp_path):
    results = decode.main(["--quick", "--device", "cpu", "--json", str(tmp_path / "d.json")])
    split = results.pop("device/one batch")
    assert list(results) == ["workers/0", "workers/1", "device/0", "device/1"]
    assert all(r["images_per_second"] > 0 and r["ms_in_training_process"] > 0 for r in results.values())
    assert 0 < split["decode_ms"] < split["device_half_ms"]
    results["device/one batch"] = split
    assert json.loads((tmp_path / "d.json").read_text())["results"] == results


@pytest.mark.slow  # a benchmark's smoke run: 15 s
@needs_fashion_mnist
def test_step_pieces_quick_times_each_piece_of_an_experiment_with_mixup_and_ema(tmp_path, fashion_root):
    argv = ["--quick", "--device", "cpu", "--experiment", "fashion_mnist_best", "--data-root", fashion_root]
    payload = step_pieces.main([*argv, "--json", str(tmp_path / "p.json")])
    names = list(payload["milliseconds"])
    assert len(names) == 6 and any("Mixup" in n for n in names) and sum("EMA" in n for n in names) == 2
    assert all(ms > 0 for ms in payload["milliseconds"].values())
    assert payload["profile"] is None  # the device-against-host profile is for CUDA
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["batch"] == 8 and written["args"]["precision"] == "fp32"  # the title's figures


@pytest.mark.slow  # a benchmark's smoke run: 30 s (five sources, a local S3 server)
def test_sources_quick_times_each_source_with_one_worker_and_more_and_a_cold_then_warm_epoch(tmp_path, capsys):
    sources.main(["--quick", "--workers", "2", "--json", str(tmp_path / "s.json")])
    results = json.loads((tmp_path / "s.json").read_text())
    assert set(results["results"]) == set(sources.SOURCES) and len(sources.SOURCES) == 5
    assert 80 < results["machine"]["mean_jpeg_kb"] < 140  # ImageNet-like files, not flat tiles
    for rates in results["results"].values():
        assert rates["per_worker"] > 0 and rates["total"] > 0 and rates["workers_for_h100_vit_b16"] >= 1
        assert rates["first_epoch_s"] > 0 and rates["next_epoch_s"] > 0
    resized = next(v for k, v in results["results"].items() if "resized" in k)
    original = results["results"]["stream (shards of the original JPEG bytes, local disk)"]
    assert resized["disk_mb"] < original["disk_mb"] / 2  # 256-px JPEGs in place of 400x350 ones
    out = capsys.readouterr().out
    assert "| image folder |" in out and "| stream from S3 (local moto server, empty cache) |" in out
    assert "GET /" not in out  # the S3 server's request log stays out of the tables


def test_other_jobs_counts_the_cpu_of_our_own_worker_processes_as_ours(monkeypatch):
    """A DataLoader worker's CPU is ours: counted as another job's it marked a quiet run busy."""
    import subprocess
    import sys

    from benchmarks._common import OtherJobs

    before = OtherJobs._own_seconds()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\ninput()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        import time

        deadline = time.monotonic() + 10
        while OtherJobs._own_seconds() - before < 0.5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert OtherJobs._own_seconds() - before >= 0.5  # counted while it still runs (from /proc)
    finally:
        child.communicate(b"\n")
    assert OtherJobs._own_seconds() - before >= 0.5  # and once it has ended and been waited for


def test_lora_quick_measures_what_each_kind_holds_and_lora_holds_less(tmp_path):
    from benchmarks import lora

    lora.main(["--quick", "--device", "cpu", "--json", str(tmp_path / "l.json")])
    full, adapted = json.loads((tmp_path / "l.json").read_text())["results"]
    assert (full["kind"], adapted["kind"]) == ("full", "lora")
    assert adapted["trainable"] < full["trainable"] / 20 and adapted["params"] > full["params"]
    # AdamW's two moments and the gradient: three fp32 copies of what learns
    assert full["grads_and_moments_mib"] == pytest.approx(3 * full["trainable"] * 4 / 2**20)
    assert adapted["grads_and_moments_mib"] < full["grads_and_moments_mib"] / 20
    assert adapted["checkpoint_mib"] < full["checkpoint_mib"] / 20  # what learns and its AdamW state, as saved


@pytest.mark.slow  # two processes, four wrappings: ~20 s
def test_fsdp_quick_holds_half_on_each_of_two_processes(tmp_path):
    from benchmarks import fsdp

    fsdp.main(["--quick", "--device", "cpu", "--json", str(tmp_path / "f.json")])
    ddp, sharded, checkpointed, timm = json.loads((tmp_path / "f.json").read_text())["results"]
    assert (ddp["wrapping"], sharded["wrapping"], timm["network"]) == ("ddp", "fsdp", "timm")
    assert ddp["params_here"] == ddp["params"] == sharded["params"] == timm["params"]
    assert abs(sharded["params_here"] - ddp["params"] / 2) < 0.01 * ddp["params"]
    assert sharded["grads_and_moments_mib"] == pytest.approx(ddp["grads_and_moments_mib"] / 2, rel=0.01)
    # activation checkpointing holds the same shards; what it saves of a step's peak is measured, not asserted: at the
    # quick run's two tiny layers it is a megabyte against the swing of gloo's buffers
    assert checkpointed["checkpointing"] and checkpointed["weights_mib"] == sharded["weights_mib"]


@pytest.mark.slow  # two short train.py runs and three models: ~10 s
def test_naflex_quick_compares_the_three_paths_and_the_two_pipelines(tmp_path):
    from benchmarks import naflex

    naflex.main(["--quick", "--device", "cpu", "--json", str(tmp_path / "n.json")])
    out = json.loads((tmp_path / "n.json").read_text())
    packed, padded, square = out["speed"]
    assert (packed["path"], padded["path"], square["path"]) == (
        "ours, packed",
        "timm NaFlexVit, padded",
        "ours, square",
    )
    assert packed["tokens"] <= padded["tokens"] == square["tokens"]  # padding computes tokens that are not images'
    assert packed["max_logit_difference_from_timm"] < 1e-4  # one model: ours read from timm's NaFlexVit
    assert [r["pipeline"] for r in out["accuracy"]] == ["square", "naflex"]
    assert all(0 <= r["test_acc"] <= 1 and len(r["runs"]) == 1 for r in out["accuracy"])
    assert out["accuracy"][0]["throughput_vs_square"] == 1.0


@pytest.mark.slow  # ~3 s: a 24-layer model on the meta device, two real ones
def test_the_timm_sweep_builds_per_layer_settings_for_two_layers_and_reads_a_large_table_smaller(tmp_path):
    """Sapiens 2 takes its key/value heads one a layer (timm fails at depth=2 without them); RADIO's 128x128 table
    is compared at 32x32 patches. Each judged as the sweep judges it."""
    from benchmarks.timm_sweep import check

    for name in ("vit_large_patch16_sapiens2", "naflexvit_base_patch16_radio_v3"):
        (tmp_path / name).mkdir()
        assert check(name, tmp_path / name)[1] == "parity"


@pytest.mark.slow  # a benchmark's smoke run: two short train() runs, ~6 s
@needs_fashion_mnist
def test_multilabel_quick_scores_the_mosaics_and_the_tiles_one_by_one(tmp_path, fashion_root):
    from benchmarks import multilabel

    payload = multilabel.main(["--quick", "--data-root", fashion_root, "--json", str(tmp_path / "m.json")])
    mosaics, tiles = payload["mosaics"], payload["tiles"]
    assert 0 < mosaics["test_map"] <= 1 and mosaics["best_val_map"] is not None and mosaics["epochs"] == 1
    assert 0 < tiles["test_map"] <= 1 and tiles["tile_test_acc"] == tiles["test_acc"] is not None
    assert tiles["test_map"] != mosaics["test_map"]  # the tiles' own score, not the run's results copied
    assert json.loads((tmp_path / "m.json").read_text())["tiles"]["test_map"] == tiles["test_map"]


def test_a_mosaic_scores_a_class_by_its_likeliest_tile_and_black_cells_hold_nothing():
    """The reference of benchmarks.multilabel: one softmax per item, the highest probability of each class over a
    mosaic's items; a black cell is not an item (a classifier would still name a class for it)."""
    from types import SimpleNamespace

    from benchmarks.multilabel import tile_scores

    def views(images):  # grey level g -> class g - 1, sure of it; black -> class 2, surer still
        grey = images.flatten(1)[:, 0].long()
        return torch.where(grey[:, None] > 0, 5.0 * F.one_hot((grey - 1).clamp(min=0), 3), torch.tensor([0, 0, 9.0]))

    data = SimpleNamespace(augment=lambda images, train: images.float())
    cells = torch.tensor([[1, 0, 1, 2], [0, 0, 3, 0]], dtype=torch.uint8)  # two mosaics, cells 2r + c
    mosaics = cells.view(2, 1, 2, 1, 2, 1).expand(2, 1, 2, 2, 2, 2).reshape(2, 1, 4, 4)  # 2x2 pixels a cell
    sure, other = (5.0 * F.one_hot(torch.tensor(0), 3)).softmax(-1)[:2].tolist()
    expected = torch.tensor([[sure, sure, other], [other, other, sure]])
    torch.testing.assert_close(tile_scores(SimpleNamespace(views=views), data, mosaics), expected)


@pytest.mark.slow  # a benchmark's smoke run: four short train() runs and two probes of 55,000 images, ~40 s
@needs_fashion_mnist
def test_mae_quick_pretrains_fine_tunes_from_it_and_from_scratch_and_probes_both(tmp_path, fashion_root):
    from benchmarks import mae

    payload = mae.main(["--quick", "--data-root", fashion_root, "--labels", "40", "--json", str(tmp_path / "m.json")])
    assert payload["mae"]["test_loss"] is not None and payload["mae"].get("test_acc") is None
    assert payload["from_mae"]["pretrained_from"]["path"] == payload["mae"]["best_checkpoint"]
    assert payload["from_scratch"]["pretrained_from"] is None
    for probed in ("probe_mae", "probe_random"):
        assert 0 < payload[probed]["linear"] <= 1 and 0 < payload[probed]["knn"] <= 1
    assert payload["probe_mae"] != payload["probe_random"]  # two networks' features, not one read twice


@pytest.mark.slow  # a benchmark's smoke run: three short train() runs, ~20 s
@needs_fashion_mnist
def test_distill_quick_trains_a_larger_teacher_then_the_same_student_with_its_features_and_alone(
    tmp_path, fashion_root
):
    from benchmarks import distill

    payload = distill.main(["--quick", "--data-root", fashion_root, "--json", str(tmp_path / "d.json")])
    teacher, alone, distilled = payload["teacher"], payload["alone"], payload["distilled"]
    assert teacher["params"] > alone["params"] == distilled["params"]  # the same student, with a teacher or not
    assert distilled["distill"]["teacher"] == teacher["best_checkpoint"]
    assert distilled["distill"]["target"] == "features"
    assert alone["global_steps"] == distilled["global_steps"] and 0 < alone["test_acc"] <= 1
    assert alone["pretrained_from"] is None and distilled["pretrained_from"] is None


@pytest.mark.slow  # a one-epoch tiny run, its four exports, six runtimes timed twice, a server: ~45 s
def test_deploy_quick_scores_and_times_every_runtime_on_the_same_images(tmp_path):
    pytest.importorskip("onnxruntime")
    from benchmarks import deploy

    payload = deploy.main(["--quick", "--service", "--json", str(tmp_path / "d.json")])
    assert payload["service"]["img_s"] > 0 and payload["service"]["p99_ms"] >= payload["service"]["p50_ms"] > 0
    assert payload["predict_img_s"] > 0
    runtimes = ["torch eager", "torch compiled", "torch.export (pt2)", "onnx fp32", "onnx int8", "onnx int8-static"]
    assert [k for k in payload if k in runtimes] == runtimes
    eager = payload["torch eager"]["test_acc"]
    for name in runtimes:
        assert abs(payload[name]["test_acc"] - eager) <= 0.01  # one in 128 test images may flip under int8
        assert all(payload[name][b]["p99_ms"] >= payload[name][b]["p50_ms"] > 0 for b in deploy.BATCHES)
