{{/*
Names, labels and small values shared by every template.
*/}}

{{- define "moss-vl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "moss-vl.fullname" -}}
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

{{- define "moss-vl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels every object carries. */}}
{{- define "moss-vl.labels" -}}
{{ include "moss-vl.selectorLabels" . }}
{{ include "moss-vl.metaLabels" . }}
{{- end }}

{{/* Labels that never select: combine with a component's selector labels. */}}
{{- define "moss-vl.metaLabels" -}}
helm.sh/chart: {{ include "moss-vl.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: moss-vl
{{- end }}

{{- define "moss-vl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "moss-vl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Selector of every server pod of every pool: no device label, so one Service
spans the CUDA and the Ascend pool.
*/}}
{{- define "moss-vl.serverSelectorLabels" -}}
{{ include "moss-vl.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{/* Selector of one pool. Call with (dict "root" $ "device" "cuda"). */}}
{{- define "moss-vl.poolSelectorLabels" -}}
{{ include "moss-vl.serverSelectorLabels" .root }}
moss-vl.openmoss.io/device: {{ .device }}
{{- end }}

{{- define "moss-vl.routerSelectorLabels" -}}
{{ include "moss-vl.selectorLabels" . }}
app.kubernetes.io/component: router
{{- end }}

{{/* Name of one pool's objects: <fullname>-<device>. */}}
{{- define "moss-vl.poolName" -}}
{{- printf "%s-%s" (include "moss-vl.fullname" .root) .device | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The devices to deploy, as a JSON list: `devices` when set (duplicates
dropped, order kept), else `[device]`.
*/}}
{{- define "moss-vl.devices" -}}
{{- if .Values.devices }}
{{- toJson (uniq .Values.devices) }}
{{- else }}
{{- toJson (list .Values.device) }}
{{- end }}
{{- end }}

{{/* The pool block (cuda: / npu:) of a device. Call with (dict "root" $ "device" "npu"); returns YAML. */}}
{{- define "moss-vl.pool" -}}
{{- toYaml (index .root.Values .device) }}
{{- end }}

{{/* Replicas of one pool. Call with (dict "root" $ "device" "npu"). */}}
{{- define "moss-vl.poolReplicas" -}}
{{- $pool := index .root.Values .device }}
{{- if kindIs "invalid" $pool.replicas }}{{ .root.Values.replicaCount }}{{ else }}{{ $pool.replicas }}{{ end }}
{{- end }}

{{/*
Server image of a pool: repository:tag or repository@digest; the tag
defaults to <appVersion>-<imageTagSuffix> (0.1.0-cuda, 0.1.0-ascend).
Call with (dict "root" $ "device" "npu").
*/}}
{{- define "moss-vl.image" -}}
{{- $pool := index .root.Values .device }}
{{- $img := .root.Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default (printf "%s-%s" .root.Chart.AppVersion $pool.imageTagSuffix) $img.tag) }}
{{- end }}
{{- end }}

{{/* Router image: the server image of the first pool unless router.image overrides it. */}}
{{- define "moss-vl.routerImage" -}}
{{- $first := first (include "moss-vl.devices" . | fromJsonArray) }}
{{- $r := .Values.router.image }}
{{- if or $r.repository $r.tag }}
{{- $tag := default (printf "%s-%s" .Chart.AppVersion (index .Values $first).imageTagSuffix) (default .Values.image.tag $r.tag) }}
{{- printf "%s:%s" (default .Values.image.repository $r.repository) $tag }}
{{- else }}
{{- include "moss-vl.image" (dict "root" . "device" $first) }}
{{- end }}
{{- end }}

{{- define "moss-vl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "moss-vl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Secret holding the API key. */}}
{{- define "moss-vl.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "moss-vl.fullname" .)) .Values.server.apiKey.existingSecret }}
{{- end }}

{{/* PVC holding the weights. */}}
{{- define "moss-vl.modelClaimName" -}}
{{- default (printf "%s-models" (include "moss-vl.fullname" .)) .Values.model.storage.existingClaim }}
{{- end }}

{{/* Directory the server loads: <mountPath>/<dir>. */}}
{{- define "moss-vl.modelPath" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.model.mountPath) .Values.model.dir }}
{{- end }}

{{/* In-cluster URL of the client endpoint. */}}
{{- define "moss-vl.endpointURL" -}}
{{- printf "http://%s.%s.svc:%v" (include "moss-vl.fullname" .) .Release.Namespace .Values.service.port }}
{{- end }}

{{/*
Values the schema cannot express; each failure names the value and the reason.
*/}}
{{- define "moss-vl.validate" -}}
{{- if and .Values.server.apiKey.enabled (not .Values.server.apiKey.existingSecret) (not .Values.server.apiKey.value) }}
{{- fail "server.apiKey.enabled: set server.apiKey.existingSecret (preferred) or server.apiKey.value" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" .Values.autoscaling.minReplicas .Values.autoscaling.maxReplicas) }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled: pick one, or every series is scraped twice" }}
{{- end }}
{{- if and (eq .Values.model.storage.type "hostPath") (not .Values.model.storage.hostPath) }}
{{- fail "model.storage.hostPath: required when model.storage.type is hostPath" }}
{{- end }}
{{- end }}

{{/*
PromQL label matchers for this release's pods, by the labels the
ServiceMonitor/PodMonitor copy from the pods (the names Prometheus's usual
`labelmap: __meta_kubernetes_pod_label_(.+)` gives them too), never by pod
name: a long release name truncates the names a regex would expect.
Call with (dict "root" $ "component" "server"|"router").
*/}}
{{- define "moss-vl.promSelector" -}}
namespace="{{ .root.Release.Namespace }}", app_kubernetes_io_instance="{{ .root.Release.Name }}", app_kubernetes_io_component="{{ .component }}"
{{- end }}

{{/*
The relabelings that put those labels (and the pool's `device`) on every
series of a scraped pod. Shared by the ServiceMonitor and the PodMonitor.
*/}}
{{- define "moss-vl.scrapeRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_instance]
  targetLabel: app_kubernetes_io_instance
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  targetLabel: app_kubernetes_io_component
{{- if eq .component "server" }}
# `device` tells the CUDA and the Ascend pool apart in alerts and dashboards.
- sourceLabels: [__meta_kubernetes_pod_label_moss_vl_openmoss_io_device]
  targetLabel: device
{{- end }}
{{- end }}
