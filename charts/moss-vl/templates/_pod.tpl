{{/*
The server pod template, written once for both devices.
Call with (dict "root" $ "device" "cuda"|"npu").

The server is configured only through MOSS_VL_* variables: the image's
ENTRYPOINT `moss-vl serve` turns them and the device preset into SGLang flags,
so no SGLang flag is spelled here (see src/moss_vl/presets.py).
*/}}
{{- define "moss-vl.serverPodTemplate" -}}
{{- $root := .root }}
{{- $device := .device }}
{{- $v := $root.Values }}
{{- $pool := index $v $device }}
{{- $image := include "moss-vl.image" . }}
{{- $pullPolicy := include "moss-vl.imagePullPolicy" . }}
{{- $resources := include "moss-vl.poolResources" . | fromYaml }}
{{- $modelPath := include "moss-vl.modelPath" $root -}}
metadata:
  labels:
    {{- include "moss-vl.poolSelectorLabels" . | nindent 4 }}
    {{- include "moss-vl.metaLabels" $root | nindent 4 }}
    {{- with merge (dict) (default (dict) $pool.podLabels) $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    {{- if $v.metrics.scrapeAnnotations }}
    prometheus.io/scrape: "true"
    prometheus.io/port: {{ $v.server.port | quote }}
    prometheus.io/path: /metrics
    {{- end }}
    {{- /* Generated keys persist (lookup); a key given as a value rolls the pods when it changes. */}}
    {{- if and (include "moss-vl.apiKeyEnabled" $root) $v.server.apiKey.value (not $v.server.apiKey.existingSecret) }}
    checksum/api-key: {{ $v.server.apiKey.value | sha256sum }}
    {{- end }}
    {{- with merge (dict) (default (dict) $pool.podAnnotations) $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  serviceAccountName: {{ include "moss-vl.serviceAccountName" $root }}
  # The server never talks to the Kubernetes API.
  automountServiceAccountToken: false
  {{- with default $v.priorityClassName $pool.priorityClassName }}
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $pool.runtimeClassName }}
  runtimeClassName: {{ . }}
  {{- end }}
  {{- with $pool.schedulerName }}
  schedulerName: {{ . }}
  {{- end }}
  terminationGracePeriodSeconds: {{ $v.shutdown.terminationGracePeriodSeconds }}
  securityContext:
    {{- $psc := deepCopy $v.podSecurityContext }}
    {{- if $pool.supplementalGroups }}
    {{- $_ := set $psc "supplementalGroups" (concat (default (list) $psc.supplementalGroups) $pool.supplementalGroups | uniq) }}
    {{- end }}
    {{- toYaml $psc | nindent 4 }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $pool.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $v.topologySpreadConstraints }}
  topologySpreadConstraints:
    {{- range $v.topologySpreadConstraints }}
    - {{- toYaml (merge (dict) . (dict "labelSelector" (dict "matchLabels" (include "moss-vl.poolSelectorLabels" (dict "root" $root "device" $device) | fromYaml)))) | nindent 6 }}
    {{- end }}
  {{- end }}
  {{- if $v.model.download.enabled }}
  initContainers:
    # Fills the weights volume from the hub when <dir> is missing or was left
    # half-written; a complete directory is left untouched (restarts are free).
    - name: download-model
      image: {{ $image }}
      imagePullPolicy: {{ $pullPolicy }}
      command:
        - python3
        - /opt/moss-vl/download/download_model.py
      args:
        - --source={{ $v.model.download.source }}
        - --repo-id={{ $v.model.download.repoId }}
        - --revision={{ $v.model.download.revision }}
        - --target={{ $modelPath }}
        {{- if eq $v.model.storage.type "hostPath" }}
        - --host-path={{ $v.model.storage.hostPath }}
        {{- end }}
      env:
        - name: HF_HOME
          value: /tmp/hf-home
        - name: MODELSCOPE_CACHE
          value: /tmp/modelscope
        {{- with $v.model.download.endpoint }}
        - name: {{ ternary "HF_ENDPOINT" "MODELSCOPE_DOMAIN" (eq $v.model.download.source "huggingface") }}
          value: {{ . | quote }}
        {{- end }}
        {{- with $v.model.download.tokenSecret.name }}
        - name: {{ ternary "HF_TOKEN" "MODELSCOPE_API_TOKEN" (eq $v.model.download.source "huggingface") }}
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $v.model.download.tokenSecret.key }}
        {{- end }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        {{- toYaml $v.model.download.resources | nindent 8 }}
      volumeMounts:
        - name: models
          mountPath: {{ $v.model.mountPath }}
        - name: tmp
          mountPath: /tmp
        - name: download-script
          mountPath: /opt/moss-vl/download
          readOnly: true
  {{- end }}
  containers:
    - name: server
      image: {{ $image }}
      imagePullPolicy: {{ $pullPolicy }}
      ports:
        - name: http
          containerPort: {{ $v.server.port }}
          protocol: TCP
      env:
        - name: MOSS_VL_DEVICE
          value: {{ $device }}
        - name: MOSS_VL_MODEL_PATH
          value: {{ $modelPath | quote }}
        - name: MOSS_VL_SERVED_MODEL_NAME
          value: {{ $v.server.servedModelName | quote }}
        - name: MOSS_VL_HOST
          value: "0.0.0.0"
        - name: MOSS_VL_PORT
          value: {{ $v.server.port | quote }}
        - name: MOSS_VL_TP
          value: {{ $pool.count | quote }}
        - name: MOSS_VL_DTYPE
          value: {{ $v.server.dtype | quote }}
        {{- if not (kindIs "invalid" $v.server.memFractionStatic) }}
        - name: MOSS_VL_MEM_FRACTION_STATIC
          value: {{ $v.server.memFractionStatic | quote }}
        {{- end }}
        {{- if not (kindIs "invalid" $v.server.contextLength) }}
        - name: MOSS_VL_CONTEXT_LENGTH
          value: {{ $v.server.contextLength | int64 | quote }}
        {{- end }}
        {{- if not (kindIs "invalid" $v.server.maxRunningRequests) }}
        - name: MOSS_VL_MAX_RUNNING_REQUESTS
          value: {{ $v.server.maxRunningRequests | int64 | quote }}
        {{- end }}
        - name: MOSS_VL_CROSS_ATTN_PLAN
          value: {{ $v.server.crossAttnPlan | quote }}
        {{- /* Video limits first, so an operator's extraArgs can still override them. */}}
        {{- $vid := $v.server.video }}
        {{- $videoConfig := dict "video_fps" $vid.fps "max_frames" (int64 $vid.maxFrames) "video_max_pixels" (int64 $vid.maxPixels) }}
        {{- if $vid.maxDurationSeconds }}{{ $_ := set $videoConfig "max_duration_seconds" $vid.maxDurationSeconds }}{{ end }}
        {{- if $vid.maxBytes }}{{ $_ := set $videoConfig "max_video_bytes" (int64 $vid.maxBytes) }}{{ end }}
        {{- $videoArgs := printf "--mm-process-config %s" (dict "video" $videoConfig | toJson | squote) }}
        {{- /* SGLang 0.5.23 has this flag, 0.5.17 (the npu default line) refuses it: only when set. */}}
        {{- if $vid.maxDownloadMiB }}{{ $videoArgs = printf "%s --media-url-max-file-size-mb %d" $videoArgs (int64 $vid.maxDownloadMiB) }}{{ end }}
        {{- $extra := list $videoArgs $v.server.extraArgs $pool.extraArgs | compact | join " " }}
        {{- if $extra }}
        - name: MOSS_VL_EXTRA_ARGS
          value: {{ $extra | quote }}
        {{- end }}
        {{- if include "moss-vl.apiKeyEnabled" $root }}
        # Files, not values: `moss-vl serve` hands the keys to SGLang in a
        # --config file on /dev/shm, so no key reaches argv or the environment.
        - name: MOSS_VL_API_KEY_FILE
          value: /etc/moss-vl/keys/api-key
        - name: MOSS_VL_ADMIN_API_KEY_FILE
          value: /etc/moss-vl/keys/admin-api-key
        {{- end }}
        # The weights are local: never reach a hub from the server.
        - name: HF_HUB_OFFLINE
          value: "1"
        - name: TRANSFORMERS_OFFLINE
          value: "1"
        - name: SGLANG_PLUGINS
          value: moss_vl
        # Readiness and liveness poll /health: answer from the server's state
        # instead of generating a token, which SGLang (0.5.17, 0.5.23) does on
        # /health unless this is false, so a long prefill cannot fail them.
        # The startup probe keeps /health_generate.
        - name: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
          value: "false"
        # The root filesystem is read-only; JIT caches go to the cache volume.
        - name: TRITON_CACHE_DIR
          value: /home/moss/.cache/triton
        {{- if eq $device "npu" }}
        # Fused attention operators cannot take the cross-attention mask.
        - name: ASCEND_USE_FA
          value: "false"
        - name: ASCEND_USE_FIA
          value: "false"
        {{- end }}
        {{- with $pool.env }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with $v.server.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      startupProbe:
        httpGet:
          path: {{ $v.probes.startup.path }}
          port: http
        periodSeconds: {{ $pool.startupProbe.periodSeconds }}
        failureThreshold: {{ $pool.startupProbe.failureThreshold }}
        timeoutSeconds: {{ $v.probes.startup.timeoutSeconds }}
      readinessProbe:
        httpGet:
          path: {{ $v.probes.readiness.path }}
          port: http
        periodSeconds: {{ $v.probes.readiness.periodSeconds }}
        timeoutSeconds: {{ $v.probes.readiness.timeoutSeconds }}
        failureThreshold: {{ $v.probes.readiness.failureThreshold }}
      livenessProbe:
        httpGet:
          path: {{ $v.probes.liveness.path }}
          port: http
        periodSeconds: {{ $v.probes.liveness.periodSeconds }}
        timeoutSeconds: {{ $v.probes.liveness.timeoutSeconds }}
        failureThreshold: {{ $v.probes.liveness.failureThreshold }}
      lifecycle:
        # Keep serving while endpoints and load balancers drop the pod; then
        # SIGTERM starts SGLang's drain (TokenizerManager.sigterm_watchdog waits
        # for every in-flight request before exiting).
        preStop:
          sleep:
            seconds: {{ $v.shutdown.preStopSleepSeconds }}
      securityContext:
        {{- toYaml $v.securityContext | nindent 8 }}
      resources:
        requests:
          {{- with omit (default (dict) $resources.requests) $pool.resourceName }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          {{ $pool.resourceName }}: {{ $pool.count }}
        limits:
          {{- with omit (default (dict) $resources.limits) $pool.resourceName }}
          {{- toYaml . | nindent 10 }}
          {{- end }}
          {{ $pool.resourceName }}: {{ $pool.count }}
      volumeMounts:
        - name: models
          mountPath: {{ $v.model.mountPath }}
          readOnly: true
        - name: dshm
          mountPath: /dev/shm
        - name: tmp
          mountPath: /tmp
        - name: cache
          mountPath: /home/moss/.cache
        {{- if include "moss-vl.apiKeyEnabled" $root }}
        - name: api-keys
          mountPath: /etc/moss-vl/keys
          readOnly: true
        {{- end }}
        {{- range $i, $dir := $pool.writableDirs }}
        - name: writable-{{ $i }}
          mountPath: {{ $dir }}
        {{- end }}
        {{- range $pool.hostMounts }}
        - name: {{ .name }}
          mountPath: {{ .mountPath }}
          readOnly: true
        {{- end }}
        {{- with $v.extraVolumeMounts }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
  volumes:
    - name: models
      {{- if eq $v.model.storage.type "hostPath" }}
      hostPath:
        path: {{ $v.model.storage.hostPath }}
        type: {{ ternary "DirectoryOrCreate" "Directory" $v.model.download.enabled }}
      {{- else }}
      persistentVolumeClaim:
        claimName: {{ include "moss-vl.poolModelClaimName" . }}
      {{- end }}
    - name: dshm
      emptyDir:
        medium: Memory
        sizeLimit: {{ $pool.shmSize }}
    - name: tmp
      emptyDir:
        sizeLimit: {{ $v.server.tmpSizeLimit }}
    - name: cache
      {{- if $v.server.cache.existingClaim }}
      persistentVolumeClaim:
        claimName: {{ $v.server.cache.existingClaim }}
      {{- else }}
      emptyDir:
        sizeLimit: {{ $v.server.cache.sizeLimit }}
      {{- end }}
    {{- if include "moss-vl.apiKeyEnabled" $root }}
    - name: api-keys
      secret:
        secretName: {{ include "moss-vl.apiKeySecretName" $root }}
        # Readable by the server's group (fsGroup) only.
        defaultMode: 0440
        items:
          - key: {{ $v.server.apiKey.secretKey }}
            path: api-key
          - key: {{ $v.server.apiKey.adminSecretKey }}
            path: admin-api-key
    {{- end }}
    {{- range $i, $dir := $pool.writableDirs }}
    - name: writable-{{ $i }}
      emptyDir: {}
    {{- end }}
    {{- range $pool.hostMounts }}
    - name: {{ .name }}
      hostPath:
        path: {{ .hostPath }}
        {{- with .type }}
        type: {{ . }}
        {{- end }}
    {{- end }}
    {{- if $v.model.download.enabled }}
    - name: download-script
      configMap:
        name: {{ include "moss-vl.fullname" $root }}-download
    {{- end }}
    {{- with $v.extraVolumes }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end }}
