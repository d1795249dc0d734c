# make demo: install chute and TensorFlow into .venv (when missing) and run the demo on a
#   built-in sample.
# make test: install chute with its [dev] extra into .venv (when missing), lint, and run the
#   whole test suite.
# make package-check: build the sdist and wheel, check them, install the wheel into a fresh
#   virtualenv and try it there (CI runs it; .ci/package-check says what it checks).
PYTHON ?= python3
VENV ?= .venv
BIN = $(VENV)/bin
# pytest-xdist workers: one per core (CI machines have 2).
WORKERS ?= auto

.PHONY: demo test test-fast lint format docs docs-screenshot package-check bench bench-remote bench-peers bench-scale bench-mix bench-epochs bench-accuracy clean

# Everything the tests, the linters and package-check need; [dev] holds the demo's TensorFlow
# too, so the demo's stamp is made with it.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@ $(BIN)/.installed-demo

# The demo converts, inspects, verifies, trains a small CNN on the CPU and predicts: chute and
# TensorFlow, the README's own install (about 2.4 GB installed; [dev] adds JAX, Beam, the
# object-store clients and emulators, the linters and the build tools: 3.7 GB).
$(BIN)/.installed-demo: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[tensorflow]"
	touch $@

demo: $(BIN)/.installed-demo
	$(BIN)/chute demo

# The suite starts some 150 Python processes that import chute (and pytest rewrites the tests
# in each worker): with bytecode caches (__pycache__, gitignored; Python's default, which some
# machines' environments turn off with PYTHONDONTWRITEBYTECODE) they compile it once.
TEST_ENV = PYTHONDONTWRITEBYTECODE=

# The whole suite (what CI runs) on parallel workers, slow multi-process tests included; the
# documentation site is built first (tests/test_docs.py runs its examples).
test: $(BIN)/.installed lint docs
	$(TEST_ENV) $(BIN)/python -m pytest -n $(WORKERS)

# The inner loop: everything but the tests marked slow (multi-process runs, training).
test-fast: $(BIN)/.installed
	$(TEST_ENV) $(BIN)/python -m pytest -n $(WORKERS) -m "not slow"

# ruff, then the import contracts in pyproject.toml (layers, no import circle).
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: $(BIN)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# The documentation site (docs/, mkdocs.yml) into site/, warnings as errors: a broken link,
# anchor or API reference fails the build.
docs: $(BIN)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The built site's front page in headless Chromium (Debian's chromium package), offline:
# site/front-page.png. tests/test_docs.py takes and checks the same screenshot where
# Chromium is installed.
docs-screenshot: docs
	chromium --headless --no-sandbox --disable-gpu --disable-background-networking \
		--disable-component-update --disable-sync --no-first-run \
		--user-data-dir=$$(mktemp -d) --window-size=1280,900 \
		--screenshot=$(CURDIR)/site/front-page.png file://$(CURDIR)/site/index.html

# What a user installs, built and tried as a user would (about 25 s; the fresh virtualenv
# downloads chute's dependencies and Grain, no TensorFlow).
package-check: $(BIN)/.installed
	PYTHON=$(PYTHON) .ci/package-check $(BIN)

bench: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_convert.py --memory --json benchmarks/results/convert.json
	$(BIN)/python benchmarks/bench_reader.py --json benchmarks/results/reader.json
	$(BIN)/python benchmarks/bench_photos.py --json benchmarks/results/photos.json
	$(BIN)/python benchmarks/bench_service.py --json benchmarks/results/service.json

# chute's Grain engine on an S3 bucket 20 ms away (moto + a latency proxy) against local
# disk and MosaicML Streaming (installed into a virtualenv of its own, never into .venv).
bench-remote: $(BIN)/.installed
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_remote.py --rounds 2 --json benchmarks/results/remote.json

# Photos per CPU-second: chute's two engines against the codelab's reader, Grain +
# ArrayRecord, MosaicML Streaming, WebDataset, DALI (CPU), FFCV and a bare decode loop, each
# from its own format; then 75x75 glyphs (raw and PNG). The peers go into a virtualenv of
# their own (WORK_DIR/venv-peers, made by the script), never into .venv.
bench-peers: $(BIN)/.installed
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_peers.py --rounds 3 --json benchmarks/results/peers.json
	$(BIN)/python benchmarks/bench_peers.py --workload glyphs --rounds 3 \
		--json benchmarks/results/peers-glyphs.json

# chute at ImageNet's shape (1.28M records, 1,024 shards), 21,841 classes and 10,000 labels:
# conversion, indexes, verify, both engines' epochs under ulimit -n 256, resume, a bucket
# behind a 20 ms proxy, the tf.data service (about 17 minutes on 2 cores).
bench-scale: $(BIN)/.installed
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_scale.py --json benchmarks/results/scale.json

# Issue #42: a mixture of datasets against the largest alone, both engines (~12 minutes).
bench-mix: $(BIN)/.installed
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_mix.py --rounds 3 --json benchmarks/results/mix.json

# The cost of each epoch in a user's own model.fit, quiet and under load.
bench-epochs: $(BIN)/.installed
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_epochs.py --json benchmarks/results/epochs.json

# Test accuracy against training CPU-seconds: chute's defaults vs the tutorial CNN
# (about 20 minutes on 2 cores). The data come from scikit-learn and scikit-image.
bench-accuracy: $(BIN)/.installed
	$(BIN)/python -m pip install -q -e ".[dev,bench]"
	mkdir -p benchmarks/results
	$(BIN)/python benchmarks/bench_accuracy.py --ablate

clean:
	rm -rf $(VENV) chute-demo .pytest_cache site
