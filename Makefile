# The two commands a newcomer needs:  make demo  (the main job)  and  make test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install native dist demo test lint bench clean

$(BIN)/aggbox: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(MAKE) native
	touch $@

install: $(BIN)/aggbox

# The native core (native/, docs/design.md "The hot path"): the executor's parse, the writer's
# batch fold, ids and payload hashes in Rust. Built when cargo is on PATH; without it aggbox
# runs the pure-Python definitions (same bytes), and says so in `aggbox --version`.
native:
	@if command -v cargo >/dev/null; then $(BIN)/pip install -q ./native; \
	else echo "cargo not found: the native core is not built, aggbox runs pure Python (same results, slower)"; fi

# The wheels a team installs aggbox from (README "Install"; aggbox is not on the package index),
# into $(DIST): aggbox (pure Python, with the extra `native` = aggbox-native of the same
# version), the native core's wheel for this platform (when cargo is on PATH) and
# aggbox-native's pure fallback (no module), which pip takes on a platform dist/ has no native
# wheel for — so one `pip install --find-links dist 'aggbox[native]'` works everywhere.
# Needs `make install` first (its setuptools and wheel; maturin is fetched as `make native` does).
DIST ?= dist
dist:
	@test -x $(BIN)/pip || { echo "make dist needs $(VENV): run make install first"; exit 1; }
	rm -rf $(DIST) build native/fallback/build
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w $(DIST) .
	$(BIN)/pip wheel -q --no-deps --no-build-isolation -w $(DIST) ./native/fallback
	@if command -v cargo >/dev/null; then $(BIN)/pip wheel -q --no-deps -w $(DIST) ./native; \
	else echo "cargo not found: no native wheel in $(DIST); aggbox[native] installs the pure fallback"; fi
	rm -rf build native/fallback/build *.egg-info native/fallback/*.egg-info
	@ls -1 $(DIST)

demo: install          ## the Customers & Orders scenario on the embedded default
	$(BIN)/aggbox demo

test: install          ## the whole test suite (starts its own MongoDB stand-in, Kafka, Spark)
	$(BIN)/pytest -q -p no:cacheprovider

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/writer.py
	$(BIN)/python bench/pipeline.py
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis native/target \
	    native/fallback/build native/fallback/*.egg-info
