"""DeiT's distillation: the losses against DeiT's formulas on fixed logits, and a run in which a teacher that always
says one class teaches a student to say it, through its distillation head."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import compose, needs_fashion_mnist, perturb_, tiny_config
from vit.checkpoint import CheckpointError, Loaded, load
from vit.cli.export import to_safetensors
from vit.model import VisionTransformer
from vit.training.distill import distillation_loss, feature_loss, resample_grid
from vit.training.run import train


def test_the_soft_loss_is_deits_kl_at_the_temperature():
    torch.manual_seed(0)
    student, teacher, base = torch.randn(4, 5), torch.randn(4, 5) * 3, torch.tensor(1.3)
    tau, alpha = 2.0, 0.3
    p_t = (teacher / tau).softmax(-1)
    kl = (p_t * (p_t.log() - (student / tau).log_softmax(-1))).sum()  # summed over the batch and the classes
    expected = (1 - alpha) * base + alpha * kl * tau**2 / student.numel()
    torch.testing.assert_close(distillation_loss(base, student, teacher, "soft", alpha, tau), expected)


def test_the_hard_loss_is_cross_entropy_against_the_teachers_top_class():
    student = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    teacher = torch.tensor([[0.0, 0.0, 5.0], [0.0, 4.0, 1.0]])  # top classes 2 and 1
    expected = 0.5 * 0.7 + 0.5 * F.cross_entropy(student, torch.tensor([2, 1]))
    torch.testing.assert_close(distillation_loss(torch.tensor(0.7), student, teacher, "hard", 0.5, 1.0), expected)
    assert distillation_loss(torch.tensor(0.7), student, teacher, "hard", 0.0, 1.0).item() == pytest.approx(0.7)


RUN = ["data=synthetic", "data.img_size=16", "data.train_size=256", "data.batch_size=32", "trainer.max_epochs=2",
       "callbacks.pos_embed_figure=null", "model.patch_size=4", "model.embed_dim=32", "model.depth=1",
       "model.num_heads=4", "model.pool=token", "optim.lr=3e-3", "label_smoothing=0.0"]  # fmt: skip


@pytest.fixture(scope="module")
def stubborn_teacher(tmp_path_factory):
    """A 4-class teacher at 32 px (the student reads 16) whose every answer is class 2: its head's bias says so."""
    model = perturb_(VisionTransformer(tiny_config(img_size=32, patch_size=8, num_classes=4)))
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor([0.0, 0.0, 10.0, 0.0]))
    path = tmp_path_factory.mktemp("teacher") / "teacher.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    return path


@pytest.mark.parametrize(
    "token",
    [pytest.param(True, marks=pytest.mark.slow), False],  # the distillation token's run: ~10 s
    ids=["distillation token", "class token"],
)
def test_a_student_distilled_with_alpha_one_says_what_the_teacher_says(stubborn_teacher, tmp_path, token):
    teacher = [f"distill.teacher={stubborn_teacher}", "distill.kind=hard", "distill.alpha=1.0"]
    results = train(compose(*RUN, *teacher, f"model.distill_token={token}", f"output_dir={tmp_path}"))
    student = load(results["best_checkpoint"])
    images = torch.randn(64, 3, 16, 16)
    with torch.no_grad():
        heads = student.model.forward_heads(images)[1 if token else 0]
    assert (heads.argmax(-1) == 2).float().mean() > 0.9  # the labels' classes are spread; the teacher's are not


def test_a_teacher_of_other_classes_is_one_line(tmp_path):
    model = VisionTransformer(tiny_config(num_classes=7))
    path = tmp_path / "seven.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    from vit.checkpoint import CheckpointError

    with pytest.raises(
        CheckpointError, match=rf"^distill.teacher={path} predicts 7 classes, the student \(the data\) 4"
    ):
        train(compose(*RUN, f"distill.teacher={path}", f"output_dir={tmp_path / 'run'}"))


@pytest.mark.slow  # three Fashion-MNIST trainings: ~1-2 min
@needs_fashion_mnist
def test_a_small_student_distilled_from_our_teacher_beats_the_same_student_alone(tmp_path):
    """The default model trained 300 steps teaches a student a quarter its width for 100 steps (DeiT's hard
    distillation through its distillation token); the same student alone, the same 100 steps, learns less."""
    short = ["trainer.max_epochs=1", "trainer.limit_val_batches=1", "data.val_size=1000",
             "callbacks.pos_embed_figure=null", "label_smoothing=0"]  # fmt: skip
    teacher = train(compose(*short, "trainer.limit_train_batches=300", f"output_dir={tmp_path / 'teacher'}"))
    student = [*short, "trainer.limit_train_batches=100", "model.embed_dim=32", "model.num_heads=2",
               "model.pool=token", "model.distill_token=true"]  # fmt: skip
    alone = train(compose(*student, f"output_dir={tmp_path / 'alone'}"))
    taught = [f"distill.teacher={teacher['best_checkpoint']}", "distill.kind=hard"]
    distilled = train(compose(*student, *taught, f"output_dir={tmp_path / 'distilled'}"))
    print({name: (r["test_acc"], r["params"], r["train_seconds"]) for name, r in
           (("teacher", teacher), ("alone", alone), ("distilled", distilled))})  # fmt: skip
    assert distilled["test_acc"] > alone["test_acc"] + 0.01, (distilled["test_acc"], alone["test_acc"], teacher)


def test_the_feature_loss_is_cosine_distance_plus_smooth_l1():
    student, teacher = torch.tensor([[1.0, 0.0], [0.0, 3.0]]), torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    # cosines 1 and 1: no angle; smooth-L1 of the differences (1, 0, 0, 2): (0.5 + 0 + 0 + 1.5) / 4
    torch.testing.assert_close(feature_loss(student, teacher), torch.tensor(0.5))
    orthogonal = feature_loss(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]]))
    torch.testing.assert_close(orthogonal, torch.tensor(1.0 + 0.5))  # cosine 0; smooth-L1 (0.5 + 0.5) / 2


def test_a_teachers_grid_is_resampled_to_the_students():
    tokens = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(1, 4, 6).transpose(1, 2)  # (1, 2x3, D=4)
    assert resample_grid(tokens, (2, 3), (2, 3)) is tokens
    assert resample_grid(tokens, (2, 3), (4, 6)).shape == (1, 24, 4)
    # a constant map stays constant whatever the grid
    flat = torch.ones(1, 6, 4)
    torch.testing.assert_close(resample_grid(flat, (2, 3), (4, 6)), torch.ones(1, 24, 4))


def test_a_student_regressing_a_teachers_features_learns_them_without_labels(stubborn_teacher, tmp_path):
    """distill.target=features with alpha=1: the labels unread; the projectors learn beside the network and are
    saved with it; the student's projected features move towards the teacher's (a 32-px, patch-8 teacher: a 4x4
    grid, as the student's 16-px, patch-4 one)."""
    teacher = [f"distill.teacher={stubborn_teacher}", "distill.target=features", "distill.alpha=1.0"]
    results = train(compose(*RUN, *teacher, "trainer.max_epochs=3", f"output_dir={tmp_path}"))
    saved = torch.load(results["best_checkpoint"], weights_only=True)["state_dict"]
    assert {k for k in saved if not k.startswith("model.")} == {
        "feature_modules.distill.patches.weight", "feature_modules.distill.patches.bias",
        "feature_modules.distill.pooled.weight", "feature_modules.distill.pooled.bias",
    }  # fmt: skip
    metrics = (tmp_path / "metrics.csv").read_text().splitlines()
    header, rows = metrics[0].split(","), [line.split(",") for line in metrics[1:]]
    losses = [float(r[header.index("train/loss")]) for r in rows if r[header.index("train/loss")]]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0]


def test_feature_distillation_trains_a_student_of_several_labels_an_image(stubborn_teacher, tmp_path):
    """task=multilabel with distill.target=features: the multi-hot BCE and the feature term, half each."""
    teacher = [f"distill.teacher={stubborn_teacher}", "distill.target=features"]
    several = ["task=multilabel", "data.multilabel=true"]
    results = train(compose(*RUN, *several, *teacher, f"output_dir={tmp_path}"))
    saved = torch.load(results["best_checkpoint"], weights_only=True)["state_dict"]
    assert "feature_modules.distill.pooled.weight" in saved and results["test_map"] is not None


def test_a_teacher_of_another_aspect_ratio_is_one_line(tmp_path):
    model = VisionTransformer(tiny_config(img_size=(16, 32), patch_size=8, num_classes=4))
    path = tmp_path / "wide.safetensors"
    to_safetensors(Loaded(model, (0.5,) * 3, (0.5,) * 3, None, path), path)
    with pytest.raises(CheckpointError, match=r"its 2x4 patch grid cannot be resampled to the student's 4x4"):
        train(compose(*RUN, f"distill.teacher={path}", "distill.target=features", f"output_dir={tmp_path / 'o'}"))


@pytest.mark.parametrize("alpha", [1.0, 0.25])
def test_the_feature_term_is_the_projected_students_patches_and_pooled_against_the_teachers(stubborn_teacher, alpha):
    from types import SimpleNamespace

    from vit.training.distill import DistillConfig, FeatureDistillation

    student = perturb_(VisionTransformer(tiny_config(num_classes=4)))
    settings = DistillConfig(teacher=str(stubborn_teacher), target="features", alpha=alpha)
    feature = FeatureDistillation(settings, load(stubborn_teacher), student.config)
    data = SimpleNamespace(mean=[0.5] * 3, std=[0.25] * 3)
    module = SimpleNamespace(
        model=student, config=student.config, device="cpu", trainer=SimpleNamespace(datamodule=data)
    )
    images, base = torch.randn(3, 3, 16, 16), torch.tensor(2.0)
    logits, _, (patches, pooled) = feature.training_outputs(module, images)
    torch.testing.assert_close(logits, student(images))
    got = feature.loss(module, images, (patches, pooled), base)
    t_patches, t_pooled = feature.teacher.features(images, torch.tensor(data.mean), torch.tensor(data.std))
    projectors = feature.projectors
    expected = feature_loss(projectors["patches"](student.forward_features(images)[:, 1:]), t_patches)
    expected = expected + feature_loss(projectors["pooled"](pooled), t_pooled)
    torch.testing.assert_close(got, expected if alpha == 1 else (1 - alpha) * base + alpha * expected)
