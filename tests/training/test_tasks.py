"""The tasks (vit/training/tasks.py): ASL against its closed form, the thresholds of best F1, Mixup of multi-hot
targets, DeiT III's BCE for one label, their refusals; and a multi-label run end to end: it learns, its results name
each class, its checkpoint keeps the thresholds validation tuned and test used, and the loader reads them."""

import json
import math
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torchmetrics.functional.classification import multilabel_average_precision, multilabel_f1_score

from tests.helpers import TINY, compose, tiny_config, tiny_run
from vit.checkpoint import CheckpointError, load
from vit.data.memory.synthetic import SyntheticDataModule
from vit.interop.loaded import MULTILABEL, THRESHOLDS
from vit.model.config import ConfigError
from vit.training.checks import check_config
from vit.training.mixup import MixupConfig
from vit.training.module import ViTClassifier
from vit.training.multilabel import asymmetric_loss, best_f1_thresholds
from vit.training.run import train
from vit.training.tasks import TaskConfig

MULTILABEL_RUN = ("task=multilabel", "data.multilabel=true")  # synthetic images of several classes each


def test_asl_is_the_papers_formula_on_a_few_numbers():
    """Ridnik et al. 2021: L+ = (1 - p)^γ+ log p, L- = p_m^γ- log(1 - p_m), p_m = max(p - m, 0), here by hand."""
    logits, targets = [2.0, -1.0, 0.5, 0.01], [1.0, 0.0, 0.0, 0.0]
    gamma_neg, gamma_pos, clip = 4.0, 1.0, 0.05
    expected = 0.0
    for z, y in zip(logits, targets, strict=True):
        p = 1 / (1 + math.exp(-z))
        p_m = max(p - clip, 0.0)
        expected += -y * (1 - p) ** gamma_pos * math.log(p) - (1 - y) * p_m**gamma_neg * math.log(1 - p_m)
    loss = asymmetric_loss(torch.tensor([logits]), torch.tensor([targets]), gamma_neg, gamma_pos, clip)
    assert loss.item() == pytest.approx(expected / 4, rel=1e-6)  # the mean over labels


def test_asl_without_focusing_or_margin_is_bce_and_stays_finite_where_the_sigmoid_rounds_to_one():
    logits, targets = torch.randn(3, 5) * 3, torch.rand(3, 5)  # soft targets, as smoothing and Mixup give
    bce = F.binary_cross_entropy_with_logits(logits, targets)
    torch.testing.assert_close(asymmetric_loss(logits, targets, 0.0, 0.0, 0.0), bce)
    confident = torch.tensor([[30.0]])  # σ(30) is 1.0 in fp32: log(1 - p) would be -inf
    assert asymmetric_loss(confident, torch.zeros(1, 1), 0.0, 0.0, 0.0).item() == pytest.approx(30.0)


def test_each_class_gets_the_threshold_of_its_best_f1():
    scores = torch.tensor([[0.9, 0.1, 0.4], [0.8, 0.7, 0.6], [0.3, 0.2, 0.2], [0.2, 0.6, 0.1]])
    targets = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 0], [0, 0, 0]])
    # class 0: >= 0.9 F1 2/3, >= 0.8 1/2, >= 0.3 4/5, >= 0.2 2/3; class 1: >= 0.7 catches its one image alone;
    # class 2 is never present: no best F1, even odds
    torch.testing.assert_close(best_f1_thresholds(scores, targets), torch.tensor([0.3, 0.7, 0.5]))


def test_mixup_mixes_multi_hot_targets_and_smoothing_moves_them_toward_one_half():
    task = TaskConfig(kind=MULTILABEL, loss="bce").build(
        tiny_config(num_classes=4), 0.0, MixupConfig.of({"mixup_alpha": 1.0})
    )
    images = torch.rand(6, 3, 8, 8)
    labels = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 1, 0], [1, 0, 0, 1]])
    mixed, targets = task.mix(images.clone(), labels.float())
    lam = ((mixed - images.flip(0)) / (images - images.flip(0)))[0, 0, 0, 0]  # the batch's one weight
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images.flip(0))
    torch.testing.assert_close(targets, lam * labels + (1 - lam) * labels.flip(0))  # both classes of each pair kept
    smoothing = TaskConfig(kind=MULTILABEL, loss="bce").build(tiny_config(num_classes=4), 0.2)
    _, targets = smoothing.mix(images, torch.tensor([0, 3, 1, 1, 2, 0]))  # one label an image: one-hot
    assert targets[0].tolist() == pytest.approx([0.9, 0.1, 0.1, 0.1])


def test_single_label_bce_is_deit_iiis_loss_on_smoothed_one_hot_targets():
    task = TaskConfig(loss="bce").build(tiny_config(num_classes=5), label_smoothing=0.1)
    logits, labels = torch.randn(4, 5), torch.tensor([0, 3, 4, 1])
    one_hot = F.one_hot(labels, 5).float() * 0.9 + 0.1 / 5  # timm's smoothing of one-hot targets
    torch.testing.assert_close(task.loss(logits, labels), F.binary_cross_entropy_with_logits(logits, one_hot))
    assert task.loss(logits, labels) != TaskConfig().build(tiny_config(num_classes=5), label_smoothing=0.1).loss(
        logits, labels
    )


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["task=multilabel", "task.loss=ce"], r"task\.loss='ce': task=multilabel takes bce or asl; .* task=classify's"),
        (["task.loss=asl"], r"task\.loss='asl': task=classify takes ce or bce; .*task=multilabel's \(several labels"),
        (["task=multilabel", "task.loss=focal"], r"task\.loss='focal': task=multilabel takes bce or asl$"),
        (["task.gamma_neg=-1"], r"task\.gamma_neg=-1: ASL's gamma_neg must be a finite number >= 0"),
        (["task.gamma_pos=inf"], r"task\.gamma_pos=inf: ASL's gamma_pos must be a finite number >= 0"),
        (["task.clip=1"], r"task\.clip=1: ASL's clip must be a number in \[0, 1\)"),
        (["task.clip=abc"], r"task\.clip='abc': ASL's clip must be a number in \[0, 1\)"),
        (["task.kind=detect"], r"task\.kind='detect': give one of classify, multilabel"),
    ],
)
def test_task_settings_out_of_range_are_one_line_naming_the_key(tmp_path, overrides, says):
    with pytest.raises(ConfigError, match=says):
        check_config(compose(*TINY, f"output_dir={tmp_path}", *overrides))


def test_deits_distillation_with_several_labels_is_refused_naming_feature_distillation(tmp_path):
    teacher = tmp_path / "teacher.ckpt"
    teacher.touch()  # named, not read: the refusal comes first
    said = r"distill\.teacher=.* with task=multilabel: DeiT's distillation \(distill\.target=logits\).*target=features"
    with pytest.raises(ConfigError, match=said):
        check_config(compose(*TINY, f"output_dir={tmp_path}", *MULTILABEL_RUN, f"distill.teacher={teacher}"))


def test_one_label_classification_of_data_with_several_labels_is_refused_naming_task_multilabel(tmp_path):
    with pytest.raises(ConfigError, match=r"task=classify learns one label per image, but the data .* add task=multi"):
        train(tiny_run(tmp_path, "data.multilabel=true"))
    assert not (tmp_path / "checkpoints").exists()  # before the first step


@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory):
    """Two epochs of several labels per image: the results and the composed config."""
    folder = tmp_path_factory.mktemp("multilabel")
    exact = "trainer.precision=32-true"  # the scores a test recomputes in fp32, compared exactly
    cfg = tiny_run(folder, *MULTILABEL_RUN, "model.depth=1", exact, "callbacks.pos_embed_figure=null")
    data = instantiate(cfg.data)  # before train() resolves and consumes the config
    return train(cfg), data


def test_a_multilabel_run_learns_and_reports_each_class(multilabel_run):
    results, _ = multilabel_run
    # chance (a score unrelated to the labels) is each class's share of images: ~0.3; shuffled targets stay near it
    assert results["test_map"] > 0.75 and results["test_map_micro"] > 0.7 and results["test_f1"] > 0.5
    per_class = results["test_ap_per_class"]
    assert list(per_class) == ["class_0", "class_1", "class_2", "class_3"]  # the data's class names
    assert results["test_map"] == pytest.approx(sum(per_class.values()) / 4, abs=1e-6)
    assert json.loads((Path(results["output_dir"]) / "results.json").read_text())["test_ap_per_class"] == per_class


def _scores(loaded, data, split):
    """The model's probabilities (N, K) on a split, as evaluation saw its images, and its multi-hot targets."""
    scores, targets = [], []
    with torch.no_grad():
        for batch in getattr(data, f"{split}_dataloader")():
            images, labels = data.on_after_batch_transfer(batch, 0)
            scores.append(loaded.logits(images).sigmoid())
            targets.append(labels)
    return torch.cat(scores), torch.cat(targets).int()


def test_the_best_checkpoint_keeps_the_thresholds_its_validation_tuned_and_test_scored_with(multilabel_run):
    results, data = multilabel_run
    data.setup("fit")
    best = load(results["best_checkpoint"])
    assert best.task == MULTILABEL and len(best.thresholds) == 4
    assert torch.load(results["best_checkpoint"], weights_only=True)[THRESHOLDS] == list(best.thresholds)
    scores, targets = _scores(best, data, "val")
    tuned = best_f1_thresholds(scores, targets)
    torch.testing.assert_close(torch.tensor(best.thresholds), tuned)  # validation's best F1, of the best weights
    assert not torch.allclose(tuned, torch.full((4,), 0.5), atol=0.01)
    scores, targets = _scores(best, data, "test")
    f1 = multilabel_f1_score((scores >= tuned).int(), targets, 4, average="macro")
    assert results["test_f1"] == pytest.approx(f1.item(), abs=1e-6)
    assert results["test_map_micro"] == pytest.approx(
        multilabel_average_precision(scores, targets, 4, average="micro").item(), abs=1e-5
    )
    module = ViTClassifier.load_from_checkpoint(results["best_checkpoint"], weights_only=True)
    torch.testing.assert_close(module.task.thresholds, tuned)
    fresh = ViTClassifier(
        best.config, TaskConfig(kind=MULTILABEL, loss="bce").build(tiny_config(num_classes=4))
    )  # at even odds
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False)
    (tested,) = trainer.test(
        fresh, datamodule=data, ckpt_path=results["best_checkpoint"], weights_only=True, verbose=False
    )
    assert tested["test/f1"] == pytest.approx(results["test_f1"], abs=1e-6)  # the file's thresholds, put back


@pytest.mark.parametrize(
    "thresholds",
    [[0.5, 0.5], [0.2, 0.5, 1.5, 0.3], ["high"] * 4, [math.nan] * 4],
    ids=["count", "range", "kind", "nan"],
)
def test_thresholds_a_checkpoint_cannot_mean_are_one_line_naming_it(multilabel_run, tmp_path, thresholds):
    contents = torch.load(multilabel_run[0]["best_checkpoint"], weights_only=True)
    contents[THRESHOLDS] = thresholds
    torch.save(contents, tmp_path / "bad.ckpt")
    with pytest.raises(
        CheckpointError, match=r"bad\.ckpt: thresholds must be 4 probabilities in \[0, 1\], one a class"
    ):
        load(tmp_path / "bad.ckpt")


def test_synthetic_multilabel_data_is_multi_hot_and_a_class_subset_reorders_its_columns():
    settings = dict(root="", num_classes=4, in_chans=3, img_size=8, val_size=8, train_size=64, test_size=16)
    data = SyntheticDataModule(**settings, multilabel=True)
    reordered = SyntheticDataModule(**settings, multilabel=True, class_subset=[3, 2, 1, 0])
    data.setup(), reordered.setup()
    labels = data.train_set.labels
    assert labels.shape == (56, 4) and set(labels.unique().tolist()) == {0.0, 1.0} and (labels.sum(1) > 1).any()
    assert torch.equal(reordered.train_set.labels, labels.flip(1))
