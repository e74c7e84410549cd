# Everyday commands. `make install` once, then the others.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DJANGO_PYTHON ?= python3.12
DJANGO_VENV ?= .venv-django
PATHS := asyncq tests examples

.PHONY: help install test test-django lint fmt typecheck check example docs samples ci clean

help:
	@echo "make install    virtualenv in $(VENV) with asyncq[embedded,test], editable"
	@echo "make test       pytest (ASYNCQ_TEST_DSN=... to use your own PostgreSQL)"
	@echo "make test-django  tests/django in $(DJANGO_VENV) (Python 3.12+: DJANGO_PYTHON=...)"
	@echo "make lint       ruff check and ruff format --check"
	@echo "make fmt        ruff format and ruff check --fix"
	@echo "make typecheck  mypy --strict"
	@echo "make check      lint, typecheck and test"
	@echo "make example    run examples/quickstart.py"
	@echo "make docs       the documentation site: mkdocs build --strict (site/)"
	@echo "make samples    rewrite the sample outputs of README.md and docs/ from new runs"
	@echo "make ci         what CI runs, in a fresh .ci-venv"

install:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -e '.[embedded,test]'

test:
	$(BIN)/pytest

# Django 6 needs Python 3.12+: asyncq.contrib.django is tested in a virtualenv of its own.
test-django:
	test -x $(DJANGO_VENV)/bin/pytest || ($(DJANGO_PYTHON) -m venv $(DJANGO_VENV) \
		&& $(DJANGO_VENV)/bin/pip install -e '.[django,test]' django-stubs)
	$(DJANGO_VENV)/bin/mypy -p asyncq.contrib.django
	$(DJANGO_VENV)/bin/pytest tests/django tests/unit/test_contrib_django.py

lint:
	$(BIN)/ruff check $(PATHS)
	$(BIN)/ruff format --check $(PATHS)

fmt:
	$(BIN)/ruff format $(PATHS)
	$(BIN)/ruff check --fix $(PATHS)

typecheck:
	$(BIN)/mypy

check: lint typecheck test

example:
	$(BIN)/python examples/quickstart.py

docs:
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/mkdocs build --strict

# The outputs the pages show, from real runs (tests/samples.py); the tests compare them.
samples:
	$(BIN)/python -m tests.samples --write

ci:
	bash .ci/run

clean:
	rm -rf .ci-venv .ci-venv-django .mypy_cache .ruff_cache .pytest_cache build dist site
