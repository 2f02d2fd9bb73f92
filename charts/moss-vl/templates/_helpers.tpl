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
Server image of a pool: repository:tag or repository@digest.
The pool's own `image` block wins field by field. The shared `image` block is
only a default that cannot hand one pool the other device's build:
- its tag is a version: the pool's imageTagSuffix is appended
  (`0.1.1` -> `0.1.1-cuda` / `0.1.1-ascend`); a tag that already ends in this
  pool's suffix is kept, one that ends in another pool's suffix fails;
- its digest names one image, so it is refused when several pools deploy.
Call with (dict "root" $ "device" "npu").
*/}}
{{- define "moss-vl.image" -}}
{{- $v := .root.Values }}
{{- $pool := index $v .device }}
{{- $own := default (dict) $pool.image }}
{{- $img := $v.image }}
{{- $repo := default $img.repository $own.repository }}
{{- if $own.digest }}
{{- printf "%s@%s" $repo $own.digest }}
{{- else if $own.tag }}
{{- printf "%s:%s" $repo $own.tag }}
{{- else if $img.digest }}
{{- $devices := include "moss-vl.devices" .root | fromJsonArray }}
{{- if gt (len $devices) 1 }}
{{- fail (printf "image.digest names one image, but pools %s each need their own build: set %s instead" (join ", " $devices) (include "moss-vl.eachPool" (dict "devices" $devices "key" "image.digest"))) }}
{{- end }}
{{- printf "%s@%s" $repo $img.digest }}
{{- else if $img.tag }}
{{- $suffix := printf "-%s" $pool.imageTagSuffix }}
{{- if hasSuffix $suffix $img.tag }}
{{- printf "%s:%s" $repo $img.tag }}
{{- else }}
{{- range $other := list "cuda" "npu" }}
{{- $otherSuffix := printf "-%s" (index $v $other).imageTagSuffix }}
{{- if and (ne $other $.device) (hasSuffix $otherSuffix $img.tag) }}
{{- fail (printf "image.tag=%s is the %s build; the %s pool would run it: set image.tag to a version (the pool suffix is appended) or %s.image.tag" $img.tag $other $.device $.device) }}
{{- end }}
{{- end }}
{{- printf "%s:%s%s" $repo $img.tag $suffix }}
{{- end }}
{{- else }}
{{- printf "%s:%s-%s" $repo .root.Chart.AppVersion $pool.imageTagSuffix }}
{{- end }}
{{- end }}

{{/* Pull policy of a pool's image. Call with (dict "root" $ "device" "npu"). */}}
{{- define "moss-vl.imagePullPolicy" -}}
{{- $own := default (dict) (index .root.Values .device).image }}
{{- default .root.Values.image.pullPolicy $own.pullPolicy }}
{{- end }}

{{/* "cuda.<key> and npu.<key>" for messages. Call with (dict "devices" list "key" "image.digest"). */}}
{{- define "moss-vl.eachPool" -}}
{{- $out := list }}
{{- range .devices }}{{ $out = append $out (printf "%s.%s" . $.key) }}{{ end }}
{{- join " and " $out }}
{{- end }}

{{/* Router image: images/router (router.image); its tag defaults to the shared
version (image.tag, a version as for the pools), else the chart's appVersion. */}}
{{- define "moss-vl.routerImage" -}}
{{- $r := .Values.router.image }}
{{- printf "%s:%s" $r.repository (default (default .Chart.AppVersion .Values.image.tag) $r.tag) }}
{{- end }}

{{- define "moss-vl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "moss-vl.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Paths the Ingress / HTTPRoute publish (Ingress pathType names), a YAML list.
Call with (dict "health" bool).
*/}}
{{- define "moss-vl.publishedPaths" -}}
- {path: /v1, type: Prefix}
{{- if .health }}
- {path: /health, type: Exact}
{{- end }}
{{- end }}

{{/*
Where the edge sends `/v1/models` when the router is on: sglang-router 0.3.2
answers its own model list without checking the client key, so the edge skips
the router for that one path (Prefix: /v1/models and /v1/models/<id>) and goes
to the server pools, where SGLang checks the key. The pools serve the same
model under the same key, so any weighted pool answers it. As a JSON list of
{name, weight}; empty when the router is off.
*/}}
{{- define "moss-vl.modelListBackends" -}}
{{- $out := list }}
{{- if .Values.router.enabled }}
{{- range $d := include "moss-vl.weightedDevices" . | fromJsonArray }}
{{- $ctx := dict "root" $ "device" $d }}
{{- $out = append $out (dict "name" (include "moss-vl.poolName" $ctx) "weight" (include "moss-vl.poolWeight" $ctx | int)) }}
{{- end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/*
"true" when clients must send an API key: asked for, or the endpoint leaves
the cluster through an Ingress or HTTPRoute (then there is no way to turn it off).
*/}}
{{- define "moss-vl.apiKeyEnabled" -}}
{{- if or .Values.server.apiKey.enabled .Values.ingress.enabled .Values.httpRoute.enabled }}true{{ end }}
{{- end }}

{{/* Secret holding the API key and the admin key. */}}
{{- define "moss-vl.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "moss-vl.fullname" .)) .Values.server.apiKey.existingSecret }}
{{- end }}

{{/* PVC holding the weights. */}}
{{- define "moss-vl.modelClaimName" -}}
{{- default (printf "%s-models" (include "moss-vl.fullname" .)) .Values.model.storage.existingClaim }}
{{- end }}

{{/* "true" when one weights claim serves every pool: one pool, `model.storage.shared`, or an existing claim. */}}
{{- define "moss-vl.modelClaimShared" -}}
{{- $devices := include "moss-vl.devices" . | fromJsonArray }}
{{- if or (eq (len $devices) 1) .Values.model.storage.shared .Values.model.storage.existingClaim }}true{{ else }}false{{ end }}
{{- end }}

{{/* Weights claim of one pool. Call with (dict "root" $ "device" "npu"). */}}
{{- define "moss-vl.poolModelClaimName" -}}
{{- if eq (include "moss-vl.modelClaimShared" .root) "true" }}
{{- include "moss-vl.modelClaimName" .root }}
{{- else }}
{{- printf "%s-models" (include "moss-vl.poolName" .) }}
{{- end }}
{{- end }}

{{/*
Share of the traffic a pool gets where the chart routes (HTTPRoute
backendRefs, the router's worker set): `weight`, else the pool's replicas
(autoscaling: minReplicas), so every replica gets about the same load.
Call with (dict "root" $ "device" "npu").
*/}}
{{- define "moss-vl.poolWeight" -}}
{{- $pool := index .root.Values .device }}
{{- if not (kindIs "invalid" $pool.weight) }}{{ $pool.weight | int }}
{{- else if .root.Values.autoscaling.enabled }}{{ .root.Values.autoscaling.minReplicas | int }}
{{- else }}{{ include "moss-vl.poolReplicas" . }}{{ end }}
{{- end }}

{{/* Pools with a weight above 0, as a JSON list. */}}
{{- define "moss-vl.weightedDevices" -}}
{{- $out := list }}
{{- range $d := include "moss-vl.devices" . | fromJsonArray }}
{{- if gt (include "moss-vl.poolWeight" (dict "root" $ "device" $d) | int) 0 }}{{ $out = append $out $d }}{{ end }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* Bytes of a Kubernetes quantity ("16Gi", "500M", 1024), as a float. */}}
{{- define "moss-vl.quantityBytes" -}}
{{- $q := toString . }}
{{- $unit := regexReplaceAll "^[0-9.]+" $q "" }}
{{- $num := regexReplaceAll "[a-zA-Z]+$" $q "" | float64 }}
{{- $mult := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 }}
{{- mulf $num (get $mult $unit) }}
{{- end }}

{{/* Server container resources of a pool: server.resources with the pool's `resources` over it. */}}
{{- define "moss-vl.poolResources" -}}
{{- $pool := index .root.Values .device }}
{{- toYaml (mergeOverwrite (deepCopy .root.Values.server.resources) (deepCopy (default (dict) $pool.resources))) }}
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
{{- if eq .Values.server.apiKey.secretKey .Values.server.apiKey.adminSecretKey }}
{{- fail "server.apiKey.adminSecretKey: must differ from server.apiKey.secretKey (the admin key is a separate key)" }}
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
{{- if and (kindIs "slice" .Values.devices) (eq (len .Values.devices) 0) }}
{{- fail "devices: [] lists no pool; leave devices unset (null) for one pool of `device`, or list the pools, e.g. devices: [cuda, npu]" }}
{{- end }}
{{- $devices := include "moss-vl.devices" . | fromJsonArray }}
{{- $st := .Values.model.storage }}
{{- if and (gt (len $devices) 1) (eq $st.type "pvc") (eq (include "moss-vl.modelClaimShared" .) "true") }}
{{- $rwx := has "ReadWriteMany" $st.accessModes }}
{{- $rox := and (has "ReadOnlyMany" $st.accessModes) (not .Values.model.download.enabled) }}
{{- if not (or $rwx $rox) }}
{{- if $st.existingClaim }}
{{- fail (printf "model.storage: pools %s would share the existing claim %s, declared %s, which one node at a time can mount: if the claim is ReadWriteMany, say so with model.storage.accessModes=[ReadWriteMany]; otherwise set model.storage.existingClaim=\"\" and the chart creates one claim per pool" (join ", " $devices) $st.existingClaim (join "/" $st.accessModes)) }}
{{- else }}
{{- fail (printf "model.storage: pools %s would share the %s claim %s, which one node at a time can mount: set model.storage.accessModes=[ReadWriteMany] (a ReadWriteMany storage class, e.g. NFS or CephFS), or model.storage.shared=false for one claim per pool" (join ", " $devices) (join "/" $st.accessModes) (include "moss-vl.modelClaimName" .)) }}
{{- end }}
{{- end }}
{{- end }}
{{- range $d := $devices }}
{{- $pool := index $.Values $d }}
{{- $res := include "moss-vl.poolResources" (dict "root" $ "device" $d) | fromYaml }}
{{- $shm := include "moss-vl.quantityBytes" $pool.shmSize | float64 }}
{{- $mem := dig "limits" "memory" "" $res }}
{{- if and $mem (gt $shm (include "moss-vl.quantityBytes" $mem | float64)) }}
{{- fail (printf "%s.shmSize=%v is above the server memory limit %v: /dev/shm is memory the container is charged for; lower %s.shmSize or raise the memory limit" $d $pool.shmSize $mem $d) }}
{{- end }}
{{- if gt $shm (include "moss-vl.quantityBytes" "512Gi" | float64) }}
{{- fail (printf "%s.shmSize=%v is above 512Gi" $d $pool.shmSize) }}
{{- end }}
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

{{/* PromQL matchers for one pool's server pods, by their labels. Call with (dict "root" $ "device" "npu"). */}}
{{- define "moss-vl.poolPromSelector" -}}
{{ include "moss-vl.promSelector" (dict "root" .root "component" "server") }}, device="{{ .device }}"
{{- end }}
