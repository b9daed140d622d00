# triton-operator developer entry points. `make test` and `make demo` work from a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
## The venv is (re)installed when pyproject.toml or the version changes: the installed metadata carries the version.
STAMP := $(VENV)/.installed-$(shell { cat pyproject.toml; grep '^__version__' operator/triton_operator/__init__.py; } | sha256sum | cut -c1-12)
PYTEST_ARGS ?=
## `make test` runs pytest in TEST_WORKERS processes (pytest-xdist), each in a network namespace of its own
## (e2e/netns-python) with a local cluster of its own under .cluster/gw<N>/; a test file stays on one worker.
## TEST_WORKERS=0 runs every test in one process on .cluster/. So does a KUBECONFIG of your own: one cluster cannot
## host the node-loss, kubelet-restart and install tests of several workers side by side.
## 3 on the 2-core machine. 4 was tried (issue 40): from a fresh clone, quiet, pytest took 1,105 s, 1,130 s and
## 1,298 s in three runs, and a fourth ran away (the CPU 95-98 % busy with 24 runnable tasks on average from its
## start, API servers answering "Handler timeout", two tests failed; stopped 23 min into pytest), where 3 workers took
## 1,267-1,274 s in three runs in a row. e2e/node.py gives at most 5 workers subnet blocks of their own.
TEST_WORKERS ?= 3
## LIGHT_WORKERS more workers start no cluster and take only the files outside e2e/ (the unit tier and the tests
## against a real tritonserver; tests/schedule.py): the CPU the three clusters leave idle, without a fourth cluster.
LIGHT_WORKERS ?= 1
ifneq ($(strip $(KUBECONFIG)),)
TEST_WORKERS := 0
endif
ifeq ($(TEST_WORKERS),0)
XDIST :=
else
XDIST := --tx $(shell echo $$(( $(TEST_WORKERS) + $(LIGHT_WORKERS) )))*popen//python=$(CURDIR)/e2e/netns-python \
	--dist loadfile --no-loadscope-reorder
export TEST_CLUSTER_WORKERS := $(TEST_WORKERS)
endif
## Before the tests start their clusters: the node state of clusters whose checkout is gone is collected and the disk
## is checked to hold this run's clusters (e2e/cluster.py preflight), failing in seconds with the space and the largest
## node states named, instead of every worker failing on images it cannot unpack (a CI run on a full disk: 109 errors).
PREFLIGHT = $(BIN)/python -m e2e.cluster preflight --workers $(TEST_WORKERS)

.PHONY: all venv test unit triton e2e crd docs lint cluster-bin prebuild prebuild-cluster cluster cluster-down demo clean

all: test

## Installed with uv, at the version the dev extra pins: from a fresh clone 12.6 s against pip's 46.3 s here (uv's
## cache cold; pip kept no cache), most of `.ci/run`'s time outside pytest. pip is upgraded too: e2e/images.py and
## bench/ call `python -m pip` for their wheels.
UV_PIN := $(shell grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet '$(UV_PIN)'
	$(BIN)/uv pip install --python $(BIN)/python --quiet --upgrade pip -e '.[dev,s3,gcs,bench]'
	@rm -f $(VENV)/.installed-*; touch $@

venv: $(STAMP)

## Regenerate the CRDs from the pydantic models: crds/tritonmodels.yaml and crds/tritonpools.yaml, and the chart's
## templates of them (charts/triton-operator/templates/crds.yaml and crds-tritonpools.yaml: templates, so that
## `helm upgrade` upgrades them).
crd: $(STAMP)
	$(BIN)/triton-operator crd > crds/tritonmodels.yaml
	$(BIN)/triton-operator crd --chart-template > charts/triton-operator/templates/crds.yaml
	$(BIN)/triton-operator crd --kind TritonPool > crds/tritonpools.yaml
	$(BIN)/triton-operator crd --kind TritonPool --chart-template > charts/triton-operator/templates/crds-tritonpools.yaml

## Regenerate requirements.lock, what the operator image installs (pyproject's dependencies with the s3 and gcs
## extras, every file's hash), with uv; UPGRADE=1 moves every pin to the newest version that fits.
## e2e/test_images.py fails while the lock is older than pyproject.toml.
.PHONY: lock
lock: $(STAMP)
	$(BIN)/python -m e2e.images lock $(if $(UPGRADE),--upgrade)

## The docs site (mkdocs.yml, docs/): first the generated pages, then `mkdocs build --strict` into site/, which fails on
## a broken link or anchor, a page outside the nav or a missing include (tests/test_docs_site.py runs the same build).
## Generated: the TritonModel and TritonPool references (docs/reference/, from the pydantic field descriptions), the
## chart's values (docs/reference/helm-values.md, from values.schema.json and values.yaml), the counts of the invalid
## corpus and of the CRDs' CEL rules (tests/corpus_counts.py: the schema/CEL-webhook split is a figure measured by
## e2e/test_admission.py) and the benchmark tables and figures from bench/results/*.json (bench/readme.py;
## tests/test_readme_bench.py), on every page that marks them, README.md included.
docs: $(STAMP)
	$(BIN)/triton-operator docs --update docs/reference/tritonmodel.md --update docs/reference/tritonpool.md
	$(BIN)/python -m tools.values_reference --update docs/reference/helm-values.md
	$(BIN)/python -m tests.corpus_counts --update
	$(BIN)/python -m bench.readme --update
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

## The layers (import-linter), ruff, mypy --strict on operator/, deptry (every import of operator/ declared in
## pyproject.toml, [tool.deptry]) (and, below, helm lint and hadolint).
lint: $(STAMP)
	$(BIN)/lint-imports
	$(BIN)/ruff check operator tests e2e bench tools conftest.py
	$(BIN)/mypy
	$(BIN)/deptry operator

## Write a release's version V=X.Y.Z where it is written by hand: operator/triton_operator/__init__.py (the one
## source: pyproject.toml, the image tag and the user agent read it) and the chart's Chart.yaml (Helm cannot read it
## from Python). tests/test_version.py checks they agree. The CHANGELOG is yours to write.
.PHONY: set-version
set-version:
	@test -n "$(V)" || { echo "usage: make set-version V=X.Y.Z" >&2; exit 2; }
	$(PYTHON) tools/set_version.py $(V)

## A release of the version in operator/triton_operator/__init__.py (`make set-version V=` first), under dist/: the
## operator image as an OCI archive (the same image digest for every build of one commit: SOURCE_DATE_EPOCH = the
## commit's time), the chart package, the wheel and sdist, the image's SBOM (SPDX JSON, by syft) and SHA256SUMS
## (tools/release.py; docs/development.md, "Releases").
.PHONY: release release-push registry
release: $(STAMP)
	$(BIN)/python tools/release.py build

## Push dist/'s image (by digest, tagged with the version) to REGISTRY/triton-operator and its chart to
## oci://REGISTRY/charts, then pull both back and compare. REGISTRY=HOST:PORT; without it, a local registry is started
## on a free 127.0.0.1 port for the push and stopped after it (a rehearsal: `make registry` keeps one running).
release-push: $(STAMP)
	$(BIN)/python tools/release.py push $(if $(REGISTRY),--registry $(REGISTRY))

## A local OCI registry in the foreground on 127.0.0.1:REGISTRY_PORT (default 5000; go-containerregistry's, built
## from its Go module, in memory: what it holds goes when it stops). Then `make release-push REGISTRY=127.0.0.1:5000`.
REGISTRY_PORT ?= 5000
registry: $(STAMP)
	$(BIN)/python tools/release.py registry --port $(REGISTRY_PORT)

## Build (once, cached by pins) etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
## kube-proxy, helm and our fake-GPU device plugin from their Go modules.
cluster-bin:
	@bash e2e/toolchain/build.sh >/dev/null

## What the machine must have (Debian packages, Go, Python, root), checked before anything is built: as root the
## missing Debian packages are installed; otherwise one line names them and the command to run (tools/prereqs.sh).
.PHONY: prereqs-demo prereqs-test
prereqs-demo:
	@bash tools/prereqs.sh demo
prereqs-test:
	@bash tools/prereqs.sh test

## What the local cluster needs, built side by side (each a no-op when its cache has it): the Go binaries above and
## the images (`make images`). Cold, about 11 min on 2 cores.
prebuild-cluster: $(STAMP)
	@bash e2e/toolchain/build.sh >/dev/null & bin=$$!; \
	  $(BIN)/python -m e2e.images build >/dev/null & img=$$!; \
	  wait $$bin; b=$$?; wait $$img; i=$$?; \
	  if [ $$b -ne 0 ] || [ $$i -ne 0 ]; then echo "prebuild failed: binaries exit $$b, images exit $$i" >&2; exit 1; fi

## The cluster's pieces and the tests' Go tools (tools/kstatus, tools/objectstores, the local OCI registry), here in the host's network
## namespace: `make test`'s workers run in namespaces with no route out, where no Go module can be fetched. Also the
## previous release (0.1.0: its operator image and chart, built from its commit once, cached by it; tools/release.py
## `previous`), which e2e/test_upgrade.py upgrades from: its image's wheels come from the package index.
prebuild: $(STAMP)
	@$(MAKE) --no-print-directory prebuild-cluster & cl=$$!; \
	  { bash tools/kstatus/build.sh && bash e2e/toolchain/registry/build.sh && bash tools/objectstores/build.sh versitygw \
	    && bash tools/objectstores/build.sh fake-gcs-server && bash e2e/toolchain/prometheus/build.sh \
	    && $(BIN)/python tools/release.py previous; } >/dev/null & tools=$$!; \
	  wait $$cl; c=$$?; wait $$tools; t=$$?; \
	  if [ $$c -ne 0 ] || [ $$t -ne 0 ]; then echo "prebuild failed: cluster pieces exit $$c, test tools exit $$t" >&2; exit 1; fi

## Start the local cluster in the background (control plane, two GPU nodes with containerd and a kubelet each,
## kube-proxy; images built and imported); kubeconfig in .cluster/kubeconfig.
cluster: prereqs-demo
	@$(MAKE) --no-print-directory prebuild-cluster
	$(BIN)/python -m e2e.cluster up

cluster-down: $(STAMP)
	$(BIN)/python -m e2e.cluster down

## The product on an embedded local cluster: two real GPU nodes, the operator installed by its chart, two models,
## live progress, inference through the Services.
## It builds only what it runs: no test tools.
demo: prereqs-demo
	@$(MAKE) --no-print-directory prebuild-cluster
	$(BIN)/python -m e2e.demo

## `make demo`, then an operator upgrade to watch (`e2e.demo --upgrade`): a `helm upgrade` to the operator's image
## under a new tag, which changes every model's pod template; each model rolling or waiting (its Progressing reason)
## is printed as it happens, under client load, then the end state. bench/upgrade.py measures the same upgrade.
.PHONY: demo-upgrade
demo-upgrade: prereqs-demo
	@$(MAKE) --no-print-directory prebuild-cluster
	$(BIN)/python -m e2e.demo --upgrade

## Every test: unit, real tritonserver, real control plane. Exit code 5 (nothing collected) is a failure.
test: prereqs-test
	@$(MAKE) --no-print-directory prebuild lint
	$(PREFLIGHT)
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## The fast tests: no tritonserver, no cluster, in UNIT_WORKERS pytest-xdist processes (0: one process). Most of their
## time is spent waiting out the deadlines they check, so more workers than the 2 cores still shorten the run.
## --dist worksteal: an idle worker takes tests queued on another (with xdist's default `load`, one worker ended 97
## test-seconds busy beside three at 71-76, and the run took 122-128 s; with worksteal 72-74 each, 101 s; issue 40).
UNIT_WORKERS ?= 4
unit: $(STAMP)
	$(BIN)/python -m pytest -m "not triton and not cluster" \
	  $(if $(filter 0,$(UNIT_WORKERS)),,-n $(UNIT_WORKERS) --dist worksteal) $(PYTEST_ARGS)

## The oldest Kubernetes the chart claims (its kubeVersion), K8S_OLDEST=1.30: every Kubernetes binary and the fake-GPU
## plugin built from e2e/toolchain/kube-$(K8S_OLDEST)/go.mod (TROP_KUBE_MINOR, cached apart from 1.35's), and the
## subset K8S_OLDEST_TESTS run on it: the platform (smoke), the operator's apply, gate, rollout and delete, the chart's
## install, a pool. Not part of `make test` (which runs 1.35 only).
K8S_OLDEST ?= 1.30
K8S_OLDEST_TESTS ?= e2e/test_smoke.py e2e/test_operator.py e2e/test_helm.py \
	e2e/test_pool_wiring.py::test_a_pool_places_loads_and_gates_each_model
.PHONY: test-k8s-oldest
test-k8s-oldest: export TROP_KUBE_MINOR := $(K8S_OLDEST)
test-k8s-oldest: prereqs-test
	@$(MAKE) --no-print-directory prebuild
	$(PREFLIGHT)
	$(BIN)/python -m pytest $(XDIST) $(K8S_OLDEST_TESTS) $(PYTEST_ARGS)

## The tests against a real tritonserver (no cluster).
triton: $(STAMP)
	$(BIN)/python -m pytest -m "triton and not cluster" $(PYTEST_ARGS)

## The tests against the local cluster: control plane, real nodes, the operator from its image and chart.
e2e: prereqs-test
	@$(MAKE) --no-print-directory prebuild
	$(BIN)/python -m e2e.cluster preflight --workers 0
	$(BIN)/python -m pytest -m cluster $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

## Benchmarks (not tests: they never fail on a time): `make bench` runs all, `make bench BENCH=gate` one.
## Writes bench/results/<name>.json, its picture <name>.png (bench/plots.py; `python -m bench.run --plots-only` redraws
## them all) and bench/results/RESULTS.md. Uses its own cluster under /tmp, never .cluster.
.PHONY: bench
bench: prereqs-test
	@$(MAKE) --no-print-directory prebuild
	$(BIN)/python -m bench.run $(BENCH)

## Helm chart and image lint: helm lint --strict (cluster-wide and namespaced values), hadolint.
.PHONY: lint-chart
lint-chart: $(STAMP)
	@helm="$$(bash e2e/toolchain/build.sh helm 2>/dev/null)/helm"; \
	  "$$helm" lint --strict charts/triton-operator && \
	  "$$helm" lint --strict charts/triton-operator --set 'watch.namespaces={team-a,team-b}'
	$(BIN)/hadolint Dockerfile e2e/images/tritonserver/Dockerfile e2e/images/endless-tritonserver/Dockerfile

## Container images for the real nodes (base, operator, tritonserver, pause): buildah, no Docker, no registry; cached
## by the hash of their inputs under ~/.cache/triton-operator/images (e2e/images.py). Prints REF ARCHIVE per image.
.PHONY: images
images: $(STAMP)
	$(BIN)/python -m e2e.images build

lint: lint-chart
