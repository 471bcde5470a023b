# The README's two commands are `make train` and `make test`; both build .venv first when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch wheels that lie on the project's machines (installed offline); override for another platform.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist

.PHONY: train test test-slow test-all lint format data figures clean

$(VENV)/.installed: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

$(VENV): $(VENV)/.installed

# Fashion-MNIST comes from Debian's package where apt is available and the files are absent.
data:
	@if [ ! -d $(FASHION_MNIST_DIR) ] && command -v apt-get >/dev/null 2>&1; then \
		echo "Installing Debian's dataset-fashion-mnist into $(FASHION_MNIST_DIR)"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null \
			|| echo "warning: could not install dataset-fashion-mnist; tests that need it will skip"; \
	fi

train: $(VENV) data
	$(BIN)/python train.py $(ARGS)

# one test process per core (four at most), tests handed out as workers free up; PYTEST_ARGS='-n0' runs them in one
test: $(VENV) data
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist worksteal $(PYTEST_ARGS)

# the long end-to-end runs (pytest.mark.slow); CI runs them after `make test`
test-slow: $(VENV) data
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: $(VENV) data
	$(BIN)/python -m pytest -m "slow or not slow" $(PYTEST_ARGS)

# docs/figures/ from a model trained by the default recipe (python train.py, ~90% test accuracy): one command
FIGURES_RUN := outputs/figures
FIGURES_CKPT := $(FIGURES_RUN)/checkpoints/best.ckpt
figures: $(VENV) data
	$(BIN)/python train.py hydra.run.dir=$(FIGURES_RUN) $(ARGS)
	$(BIN)/python -c "from PIL import Image; from vit.data.memory.fashion_mnist import FashionMNISTDataModule as F; \
		images, _ = F(root='data', num_classes=10, in_chans=1, img_size=28).load(train=False); \
		Image.fromarray(images[0, 0].numpy()).save('$(FIGURES_RUN)/test_image_0.png')"
	$(BIN)/python -m vit.cli.visualize pos-embed --checkpoint $(FIGURES_CKPT) --out docs/figures/pos_embed.png
	$(BIN)/python -m vit.cli.visualize attention --checkpoint $(FIGURES_CKPT) --image $(FIGURES_RUN)/test_image_0.png \
		--out docs/figures/attention.png
	$(BIN)/python -m vit.cli.visualize attention-distance --checkpoint $(FIGURES_CKPT) --data fashion_mnist \
		--out docs/figures/attention_distance.png
	$(BIN)/python -m vit.cli.visualize resample --checkpoint $(FIGURES_CKPT) --img-size 56 --out docs/figures/resample.png

lint: $(VENV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
