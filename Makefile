# FlashDesk: `make run` starts the app on the bundled models, `make test` runs the tests.
# Both set everything up first: a virtualenv, the patched llama.cpp (built once, cached
# under ~/.cache/flashdesk/native), the Python packages and the bundled Gemma 3 270M target.
# FLASHDESK_CUDA=1 builds and uses the CUDA variant (RTX 30/40/50).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ifeq ($(FLASHDESK_CUDA),1)
export FLASHDESK_VARIANT := cuda
endif

.PHONY: setup run test test-slow lint native clean

setup: $(STAMP) native
	@$(PY) -c "from app.bundled import default_target; print('bundled target:', default_target())"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml native/build.py native/config.py | $(PY)
	$(PY) -m native.build --python-package
	$(PY) -m pip install --quiet -e ".[test,distill]"
	touch $(STAMP)

native: $(STAMP)
	$(PY) -m native.build

run: setup
	$(VENV)/bin/flashdesk

test: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m "not slow"

test-slow: setup
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -q -m slow

lint: setup
	$(VENV)/bin/ruff check app gguf_tools native tests

clean:
	rm -rf $(VENV)
