# The two commands of README.md: `make run` (a working master on embedded SQLite) and
# `make test` (install everything, lint, type-check, run the whole suite).
PYTHON ?= python3
VENV ?= .venv
DET_VENV ?= .venv-det
BIN := $(VENV)/bin
PORT ?= 8080
DATA_DIR ?= data

.PHONY: install run migrate test lint pytest official-client postgres debian-packages azurite container-images clean

# What running a cluster needs (`make run`): the master's extra and the agent's task
# servers, no torch and no test tools. uv installs them (about 5 s against pip's 30-40 s),
# into a venv made without ensurepip (0.2 s against 7 s); pip comes along for later installs.
# --compile-bytecode: uv leaves no .pyc behind by default, and where PYTHONDONTWRITEBYTECODE
# is set (this machine sets it) every process would compile fastapi, sqlalchemy and pydantic
# again at each start (0.5 s more for those imports, measured).
$(BIN)/.installed-run: pyproject.toml
	$(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(BIN)/python install -q uv
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python pip -e '.[master,tasks]'
	touch $@

# What `make test` needs: the run venv plus the test, lint and dev groups (uv: 33 s where pip
# took 397 s for the same 417 packages and versions, side by side on one loaded 2-core
# machine), and torch, which pip installs: torch 2.13.0's CPU build lies in this machine's
# pip find-links (/opt/wheels), where uv does not look, and PyPI's is the CUDA build.
$(BIN)/.installed: $(BIN)/.installed-run pyproject.toml
	$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python -e '.[master,tasks]' --group dev
	$(BIN)/pip install -q torch==2.13.0
	touch $@

# The training walkthrough's example (examples/ddp_synthetic) imports torch in the agent's
# interpreter: `make torch` adds it to a `make run` venv.
.PHONY: torch
torch: $(BIN)/.installed-run
	$(BIN)/pip install -q torch==2.13.0

install: $(BIN)/.installed

# Determined's official client lives in its own virtualenv: it pins requests<2.32. uv
# installs it (the run venv's uv, hence the order-only prerequisite).
$(DET_VENV)/bin/det: | $(BIN)/.installed-run
	$(PYTHON) -m venv --without-pip $(DET_VENV)
	$(BIN)/uv pip install -q --compile-bytecode --python $(DET_VENV)/bin/python --no-deps determined==0.38.1
	$(BIN)/uv pip install -q --compile-bytecode --python $(DET_VENV)/bin/python \
		requests==2.31.0 termcolor tabulate argcomplete ruamel.yaml \
		filelock pyOpenSSL packaging python-dateutil pathspec appdirs psutil numpy lomond \
		boto3 google-cloud-storage azure-storage-blob

official-client: $(DET_VENV)/bin/det

# The interpreter that trials of Determined workloads (determined.core, its launchers, the
# PyTorch Trainer) run with on this machine. determined 0.38.1's core.init() imports torch
# plus tensorboard (or TensorFlow) even for scripts that never touch them. The container
# tests' trial image is made of this venv, so it also holds what our notebook and shell
# tasks run in an image: JupyterLab (Determined's images carry it too) and the shell
# server's asyncssh and websockets (where Determined's need sshd).
TRIAL_VENV ?= .venv-trial
.PHONY: trial-venv
$(TRIAL_VENV)/.installed: | $(BIN)/.installed-run
	$(PYTHON) -m venv $(TRIAL_VENV)
	$(TRIAL_VENV)/bin/pip install -q torch==2.13.0
	$(BIN)/uv pip install -q --compile-bytecode --python $(TRIAL_VENV)/bin/python \
		determined==0.38.1 tensorboard==2.21.0 'jupyterlab>=4.2,<5' 'ipykernel>=6.29' \
		'asyncssh>=2.14,<3' 'websockets>=13,<17'
	touch $@

trial-venv: $(TRIAL_VENV)/.installed

# Where PYTHONDONTWRITEBYTECODE is set (this machine sets it) nothing writes the project's
# own .pyc files, so every master, agent and CLI the suite starts compiled our modules again
# at each start: 0.25 s of a master's 1.9 s of start-up CPU, measured. Compiled once here
# (Python still checks each .pyc against its source, so an edited module is compiled in
# memory as before).
.PHONY: bytecode
bytecode: $(BIN)/.installed-run
	$(BIN)/python -m compileall -q -j 0 master agent cli resolute proto/resolute_proto harness benchmarks migrations

run: $(BIN)/.installed-run bytecode
	BIN=$(BIN) PORT=$(PORT) DATA_DIR=$(DATA_DIR) bash scripts/local-cluster.sh

migrate: $(BIN)/.installed-run
	$(BIN)/det-master migrate --data-dir $(DATA_DIR)

postgres:
	bash scripts/ensure-postgres.sh

# Debian packages the suite drives: chromium, which the dashboard's browser tests drive
# through Playwright (no browser is ever downloaded), and OpenSSH's ssh, which Determined's
# `det shell start` runs. Installed only when missing, and only as root.
# After postgres: a bare machine installs both with apt-get, which takes one at a time.
debian-packages: postgres
	@missing=""; \
	which chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	which ssh >/dev/null 2>&1 || missing="$$missing openssh-client"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
		else \
			echo "missing:$$missing and not root; their tests skip (and fail under CI=true)"; \
		fi; \
	fi

# Podman (with runc: crun fails on this machine kind's cgroups), catatonit (--init),
# Debian's docker-registry and htpasswd for the container tests (tests/e2e/test_containers.py),
# and Debian's docker.io, whose dockerd the Docker runtime's tests start privately
# (tests/e2e/test_containers_docker.py; on a machine without an init system, as this kind
# is, the package starts no daemon of its own).
# Their images are built in the background (debootstrap from Debian's registry, then the
# trial venv's packages: about 3 minutes on a fresh machine) and kept in podman's store; a
# test that needs one waits for its build (a lock in harness/images.py), not make.
CONTAINER_TOOLS := podman runc catatonit debootstrap docker-registry htpasswd dockerd
container-images: debian-packages trial-venv $(BIN)/.installed-run
	@missing=""; \
	for tool in $(CONTAINER_TOOLS); do which $$tool >/dev/null 2>&1 || missing=1; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
				podman runc catatonit debootstrap docker-registry apache2-utils docker.io; \
		else \
			echo "container tools missing and not root; their tests skip (and fail under CI=true)"; \
		fi; \
	fi
	nohup $(BIN)/python -m harness.images --trial-venv $(TRIAL_VENV) >> .container-images.log 2>&1 &

# Azurite, the Azure Blob server the checkpoint-storage tests talk to (S3 and GCS servers
# come from PyPI with the test group).
AZURITE_VERSION ?= 3.37.0
.azurite/node_modules/.bin/azurite-blob:
	npm install --prefix .azurite --no-audit --no-fund --loglevel=error azurite@$(AZURITE_VERSION)

azurite: .azurite/node_modules/.bin/azurite-blob

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python scripts/check-import-cycles.py master agent cli resolute
	PYTHON=$(BIN)/python bash scripts/gen-protos.sh --check

# The set-up steps download and install independently, so `make setup` runs them side by
# side (each one's output kept together); lint then runs before the suite, not beside it.
# Defined before the rules that name it: make expands prerequisites as it reads them.
SETUP := install official-client trial-venv postgres debian-packages azurite container-images

# Three workers on two cores, a file at a time: each file's clusters start once, and the e2e
# files spend about a quarter of their time waiting on processes (leases, restarts, outages),
# which a third worker fills (vmstat: 24% idle with two workers, 8-15% with three; at
# 7ed1a19, in the same hour on this machine, pytest took 1088 s on two workers and 849 s on
# three). Files in tests/conftest.py's order, longest first
# (xdist's own reordering off). PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 3
PYTEST_ENV = DET_OFFICIAL_CLIENT=$(abspath $(DET_VENV))/bin/det DET_TRIAL_VENV=$(abspath $(TRIAL_VENV))
pytest: $(SETUP) bytecode
	$(PYTEST_ENV) $(BIN)/pytest --numprocesses=$(PYTEST_WORKERS) --dist=loadfile --no-loadscope-reorder --durations=50

# The e2e and web tests with one busy process per core (scripts/test-stress.sh), on two
# workers: run it before submitting a change to e2e, web or fault tests. ARGS narrows it
# (ARGS=tests/e2e/x.py).
STRESS_WORKERS ?= 2
.PHONY: test-stress
test-stress: $(SETUP)
	$(PYTEST_ENV) BIN=$(BIN) PYTEST_WORKERS=$(STRESS_WORKERS) bash scripts/test-stress.sh $(ARGS)

.PHONY: setup
setup:
	$(MAKE) --jobs=6 --output-sync=target $(SETUP)

# Lint needs only the test venv, so it runs beside the rest of the set-up (mypy's 47 s on one
# core while the others download and unpack), then the suite; a lint failure still fails it.
test:
	$(MAKE) --jobs=6 --output-sync=target $(SETUP) lint
	$(MAKE) pytest

clean:
	rm -rf $(VENV) $(DET_VENV) $(TRIAL_VENV) .azurite .pytest_cache .mypy_cache .ruff_cache
