# The two commands a newcomer needs:  make demo  (the main job)  and  make test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: install demo test lint bench clean

$(BIN)/aggbox: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/aggbox

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
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .hypothesis
