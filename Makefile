# The README's two commands are `make train` and `make test`; both build .venv first when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch wheels that lie on the project's machines (installed offline); override for another platform.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
FASHION_MNIST_DIR := /usr/share/datasets/fashion-mnist

.PHONY: train test test-slow test-all lint format data clean

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

test: $(VENV) data
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the long end-to-end runs (pytest.mark.slow); CI runs them after `make test`
test-slow: $(VENV) data
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

test-all: $(VENV) data
	$(BIN)/python -m pytest -m "slow or not slow" $(PYTEST_ARGS)

lint: $(VENV)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
