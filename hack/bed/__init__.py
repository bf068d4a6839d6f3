"""The local test bed (docs/testbed.md): a real Kubernetes control plane with kwok-simulated GPU
nodes, Prometheus, the Pushgateway, KubeRay, Kueue and a pod runner that executes trial and operator
pods as local processes. `python hack/testbed.py ...` is its command line (`cli`).

One module a part, each importing only those above it in this list:

    paths        where its files live (.state/bed, RLTUNE_BED_STATE)
    network      its ports, URLs and pod IP range (RLTUNE_BED_PORT_OFFSET)
    log          its log line
    binaries     the programs it runs (hack/binaries.sh, apt)
    processes    its processes: start, stop, find again, wait for
    pki          its CA, certificates and kubeconfigs
    clients      its own calls to the API server and health endpoints
    images       the images the pod runner executes (hack/images.yaml)
    kwok         kwok's Stages (hack/kwok/) and Logs CRD
    configs      the files it writes: audit policy, Prometheus config, .state/bed/env
    pools        kwok node pools with GPU Feature Discovery labels (hack/pools.yaml)
    serviceaccounts  RBAC and token kubeconfigs of components that run as a ServiceAccount
    kuberay      KubeRay (RLTUNE_BED_KUBERAY)
    kueue        Kueue (RLTUNE_BED_KUEUE) and the queue objects tests use
    components   which processes, in which order, with which command lines
    lifecycle    up, down, restart, status
    cli          `hack/testbed.py`'s commands

and the pod runner, a fake kubelet, as the sub-package `kubelet` (`python -m hack.bed.kubelet`),
which imports `paths` and `images` only.
"""
