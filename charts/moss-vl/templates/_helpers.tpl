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

{{/* Router image: images/router (router.image), tagged with the chart's appVersion by default. */}}
{{- define "moss-vl.routerImage" -}}
{{- $r := .Values.router.image }}
{{- printf "%s:%s" $r.repository (default .Chart.AppVersion $r.tag) }}
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
PromQL label matchers for this release's server pods: the namespace plus the
pool Deployments' pod names (<fullname>-<device>-<replicaset hash>-<suffix>).
*/}}
{{- define "moss-vl.promSelector" -}}
{{- $devices := include "moss-vl.devices" . | fromJsonArray -}}
namespace="{{ .Release.Namespace }}", pod=~"{{ include "moss-vl.fullname" . }}-({{ join "|" $devices }})-[a-z0-9]+-[a-z0-9]+"
{{- end }}
