"""DeiT's distillation: the losses against DeiT's formulas on fixed logits, and a run in which a teacher that always
says one class teaches a student to say it, through its distillation head."""

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import compose, needs_fashion_mnist, perturb_, tiny_config
from vit.checkpoint import Loaded, load
from vit.cli.export import to_safetensors
from vit.model import VisionTransformer
from vit.training.distill import distillation_loss
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
