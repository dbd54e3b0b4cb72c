# The two commands a newcomer needs:  make demo  (the main job)  and  make test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install native demo test lint bench clean

$(BIN)/aggbox: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(MAKE) native
	touch $@

install: $(BIN)/aggbox

# The native core (native/, docs/design.md "The hot path"): the writer's ids and payload
# hashes in Rust. Built when cargo is on PATH; without it aggbox runs the pure-Python
# definitions (same bytes), and says so in `aggbox --version`.
native:
	@if command -v cargo >/dev/null; then $(BIN)/pip install -q ./native; \
	else echo "cargo not found: the native core is not built, aggbox runs pure Python (same results, slower)"; fi

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
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis native/target
