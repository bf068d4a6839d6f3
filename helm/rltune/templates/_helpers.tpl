{{/* Chart name (nameOverride wins). */}}
{{- define "rltune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name of the release's objects: RELEASE-rltune, or RELEASE when it already says rltune. */}}
{{- define "rltune.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rltune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator pod (never change them on upgrade: the selector is immutable). */}}
{{- define "rltune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rltune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rltune.labels" -}}
helm.sh/chart: {{ include "rltune.chart" . }}
{{ include "rltune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: rltune
{{- end }}

{{- define "rltune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rltune.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image; the tag defaults to the chart's appVersion (the operator's version). */}}
{{- define "rltune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the kubelet mounts the operator's settings, the Prometheus token and CA. */}}
{{- define "rltune.configDir" -}}/etc/rltune{{- end }}
{{- define "rltune.tokenDir" -}}/var/run/secrets/rltune/prometheus-token{{- end }}
{{- define "rltune.caDir" -}}/var/run/rltune/prometheus-ca{{- end }}
{{- define "rltune.metricsKeyDir" -}}/var/run/secrets/rltune/metrics-key{{- end }}
{{- define "rltune.metricsKeySecret" -}}{{ .Values.metricsKey.existingSecret | default (printf "%s-metrics-key" (include "rltune.fullname" .)) }}{{- end }}
{{- define "rltune.tokenFile" -}}{{ include "rltune.tokenDir" . }}/{{ .Values.prometheus.bearerTokenSecret.key }}{{- end }}
{{- define "rltune.caFile" -}}{{ include "rltune.caDir" . }}/{{ .Values.prometheus.caConfigMap.key }}{{- end }}

{{/* The rules the operator needs on RLTuningJobs and their pods, services and events: one list
for the ClusterRole (all namespaces) and the per-namespace Roles. Nothing on Secrets, no wildcards. */}}
{{- define "rltune.namespacedRules" -}}
- apiGroups: ["rltune.io"]
  resources: ["rltuningjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["rltune.io"]
  resources: ["rltuningjobs/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["rltune.io"]
  resources: ["rltuningjobs/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# one NetworkPolicy per trial (networkPolicy.enabled): created with the trial, listed and deleted
# (owner checked) at its teardown
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["list", "create", "delete"]
# verl/OpenRLHF trials are KubeRay RayJobs (a rule for a kind not installed grants nothing)
- apiGroups: ["ray.io"]
  resources: ["rayjobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- end }}
