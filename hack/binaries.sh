#!/usr/bin/env bash
# Build the test bed's control-plane binaries from Go modules (the only
# source reachable here is the Go module proxy), once per machine.
#
#   hack/binaries.sh            build what is missing, print the bin dir
#   hack/binaries.sh --print    only print the bin dir (no build)
#   hack/binaries.sh --check    exit 1 if any binary is missing
#
# Output: ${XDG_CACHE_HOME:-$HOME/.cache}/rltune/bin/<k8s-version>/
#   etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm
#   kuberay-operator + kuberay/ (KubeRay's CRDs and operator ClusterRole, copied from the Go module)
#   kueue + kueue.d/ (Kueue's manager; its CRDs, ClusterRole and webhook manifests from the Go module)
# Versions are pinned below; the bin dir is keyed by them (VERSIONS file). KubeRay and Kueue are not
# part of the key (adding them would rebuild everything): a bin dir without them gets them built.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.12}"          # newest 1.34 patch on the proxy
STAGING_VERSION="v0.${K8S_VERSION#v1.}"          # k8s.io/api etc: v0.34.12
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
HELM_VERSION="${HELM_VERSION:-v3.19.5}"
KUBERAY_VERSION="${KUBERAY_VERSION:-v1.5.0}"     # github.com/ray-project/kuberay/ray-operator
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"        # sigs.k8s.io/kueue (cmd/kueue)

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/rltune"
BIN="$CACHE/bin/$K8S_VERSION-etcd$ETCD_VERSION-kwok$KWOK_VERSION-helm$HELM_VERSION"

case "${1:-}" in
  --print) echo "$BIN"; exit 0 ;;
  --check)
    for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm \
             kuberay-operator kueue; do
      [[ -x "$BIN/$b" ]] || { echo "missing $BIN/$b" >&2; exit 1; }
    done
    for f in crd/ray.io_rayclusters.yaml crd/ray.io_rayjobs.yaml crd/ray.io_rayservices.yaml rbac/role.yaml; do
      [[ -f "$BIN/kuberay/$f" ]] || { echo "missing $BIN/kuberay/$f" >&2; exit 1; }
    done
    grep -qx "kuberay=$KUBERAY_VERSION" "$BIN/VERSIONS" 2>/dev/null \
      || { echo "kuberay-operator in $BIN is not $KUBERAY_VERSION" >&2; exit 1; }
    for f in crd/kueue.x-k8s.io_workloads.yaml crd/kueue.x-k8s.io_clusterqueues.yaml \
             rbac/role.yaml webhook/manifests.yaml; do
      [[ -f "$BIN/kueue.d/$f" ]] || { echo "missing $BIN/kueue.d/$f" >&2; exit 1; }
    done
    grep -qx "kueue=$KUEUE_VERSION" "$BIN/VERSIONS" 2>/dev/null \
      || { echo "kueue in $BIN is not $KUEUE_VERSION" >&2; exit 1; }
    echo "$BIN"; exit 0 ;;
esac

export CGO_ENABLED=0
export GOTOOLCHAIN=local
export GOFLAGS="-trimpath -buildvcs=false -mod=mod"
export GOPROXY="${GOPROXY:-https://proxy.golang.org,direct}"
JOBS="${GO_BUILD_JOBS:-2}"

mkdir -p "$BIN"
log() { printf '[binaries %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T0=$(date +%s)

# gobuild <workdir> <out-name> <pkg> [extra ldflags]
gobuild() {
  local dir=$1 name=$2 pkg=$3 extra=${4:-}
  if [[ -x "$BIN/$name" ]]; then log "$name: cached"; return 0; fi
  local t=$(date +%s)
  log "$name: go build $pkg ..."
  (cd "$dir" && go build -p "$JOBS" -ldflags="-s -w $extra" -o "$BIN/$name.tmp" "$pkg")
  mv "$BIN/$name.tmp" "$BIN/$name"
  log "$name: built in $(( $(date +%s) - t ))s ($(du -h "$BIN/$name" | cut -f1))"
}

need() { for b in "$@"; do [[ -x "$BIN/$b" ]] || return 0; done; return 1; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rltune-bin.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# ---- Kubernetes: apiserver, controller-manager, scheduler, kubectl ----------
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
if need "${K8S_CMDS[@]}"; then
  d="$WORK/k8s"; mkdir -p "$d"
  log "kubernetes $K8S_VERSION: resolving module (staging modules pinned to $STAGING_VERSION)"
  (cd "$d" && go mod init rltune.local/k8sbin >/dev/null 2>&1)
  gomod=$(cd "$d" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
          | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  # every "k8s.io/x => ./staging/src/k8s.io/x" becomes "k8s.io/x => k8s.io/x vSTAGING"
  replaces=()
  while read -r m; do replaces+=("-replace=$m=$m@$STAGING_VERSION"); done \
    < <(sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/.*#\1#p' "$gomod")
  log "kubernetes: ${#replaces[@]} staging replace directives"
  (cd "$d" && go mod edit -go=1.25.0 "${replaces[@]}" -require="k8s.io/kubernetes@$K8S_VERSION")
  pkgs=(); for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c@$K8S_VERSION"); done
  (cd "$d" && go get "${pkgs[@]}" >&2)
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  vflags=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    vflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    vflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  for c in "${K8S_CMDS[@]}"; do gobuild "$d" "$c" "k8s.io/kubernetes/cmd/$c" "$vflags"; done
fi

# ---- etcd ----------------------------------------------------------------------
if need etcd; then
  d="$WORK/etcd"; mkdir -p "$d"
  log "etcd $ETCD_VERSION: resolving module"
  (cd "$d" && go mod init rltune.local/etcdbin >/dev/null 2>&1 \
     && go mod edit -go=1.26.0 && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2)
  gobuild "$d" etcd go.etcd.io/etcd/server/v3
fi

# ---- kwok -----------------------------------------------------------------------
if need kwok; then
  d="$WORK/kwok"; mkdir -p "$d"
  log "kwok $KWOK_VERSION: resolving module"
  (cd "$d" && go mod init rltune.local/kwokbin >/dev/null 2>&1 \
     && go get "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2)
  gobuild "$d" kwok sigs.k8s.io/kwok/cmd/kwok \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
fi

# ---- helm -----------------------------------------------------------------------
if need helm; then
  d="$WORK/helm"; mkdir -p "$d"
  log "helm $HELM_VERSION: resolving module"
  (cd "$d" && go mod init rltune.local/helmbin >/dev/null 2>&1 \
     && go get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2)
  gobuild "$d" helm helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
fi

# ---- KubeRay operator + CRDs --------------------------------------------------------
# Not in the bin dir key: a binary of another version (VERSIONS) is rebuilt in place.
if ! grep -qx "kuberay=$KUBERAY_VERSION" "$BIN/VERSIONS" 2>/dev/null; then
  rm -rf "$BIN/kuberay-operator" "$BIN/kuberay"
fi
if need kuberay-operator || [[ ! -f "$BIN/kuberay/rbac/role.yaml" ]]; then
  d="$WORK/kuberay"; mkdir -p "$d"
  mod=github.com/ray-project/kuberay/ray-operator
  log "kuberay $KUBERAY_VERSION: resolving module"
  (cd "$d" && go mod init rltune.local/kuberaybin >/dev/null 2>&1 \
     && go mod edit -go=1.26.0 && go get "$mod@$KUBERAY_VERSION" >&2)
  gobuild "$d" kuberay-operator "$mod"
  src=$(cd "$d" && go list -m -f '{{.Dir}}' "$mod")
  rm -rf "$BIN/kuberay.tmp"; mkdir -p "$BIN/kuberay.tmp/crd" "$BIN/kuberay.tmp/rbac"
  for c in rayclusters rayjobs rayservices; do
    cp "$src/config/crd/bases/ray.io_$c.yaml" "$BIN/kuberay.tmp/crd/"
  done
  cp "$src/config/rbac/role.yaml" "$BIN/kuberay.tmp/rbac/"
  chmod -R u+w "$BIN/kuberay.tmp"
  rm -rf "$BIN/kuberay" "$BIN/kuberay-crds"; mv "$BIN/kuberay.tmp" "$BIN/kuberay"
  log "kuberay: CRDs and ClusterRole copied from $src/config"
fi

# ---- Kueue manager + CRDs, ClusterRole, webhook manifests ----------------------------
# Not in the bin dir key either (like KubeRay).
if ! grep -qx "kueue=$KUEUE_VERSION" "$BIN/VERSIONS" 2>/dev/null; then
  rm -rf "$BIN/kueue" "$BIN/kueue.d"
fi
if need kueue || [[ ! -f "$BIN/kueue.d/webhook/manifests.yaml" ]]; then
  d="$WORK/kueue"; mkdir -p "$d"
  mod=sigs.k8s.io/kueue
  log "kueue $KUEUE_VERSION: resolving module"
  (cd "$d" && go mod init rltune.local/kueuebin >/dev/null 2>&1 \
     && go mod edit -go=1.26.0 && go get "$mod/cmd/kueue@$KUEUE_VERSION" >&2)
  gobuild "$d" kueue "$mod/cmd/kueue" \
    "-X $mod/pkg/version.GitVersion=$KUEUE_VERSION -X $mod/pkg/version.BuildDate=1970-01-01"
  src=$(cd "$d" && go list -m -f '{{.Dir}}' "$mod")
  rm -rf "$BIN/kueue.tmp"; mkdir -p "$BIN/kueue.tmp/crd" "$BIN/kueue.tmp/rbac" "$BIN/kueue.tmp/webhook"
  cp "$src"/config/components/crd/bases/*.yaml "$BIN/kueue.tmp/crd/"
  cp "$src/config/components/rbac/role.yaml" "$BIN/kueue.tmp/rbac/"
  cp "$src/config/components/webhook/manifests.yaml" "$BIN/kueue.tmp/webhook/"
  chmod -R u+w "$BIN/kueue.tmp"
  rm -rf "$BIN/kueue.d"; mv "$BIN/kueue.tmp" "$BIN/kueue.d"
  log "kueue: CRDs, ClusterRole and webhook manifests copied from $src/config/components"
fi

cat > "$BIN/VERSIONS" <<EOF
kubernetes=$K8S_VERSION
staging=$STAGING_VERSION
etcd=$ETCD_VERSION
kwok=$KWOK_VERSION
helm=$HELM_VERSION
kuberay=$KUBERAY_VERSION
kueue=$KUEUE_VERSION
go=$(go env GOVERSION)
EOF
log "done in $(( $(date +%s) - T0 ))s -> $BIN"
echo "$BIN"
