{{/*
One load-test run per Helm revision: install or upgrade with loadtest.enabled
creates a master Job and a worker Job under a new name (a Job's pod template
cannot be changed, so reusing names would break `helm upgrade`), and Helm
deletes the previous run's Jobs. Reports of every run stay on the reports
claim, under the run's name.
*/}}
{{- define "moss-vl.loadtestRun" -}}
{{- printf "%s-loadtest-r%d" (include "moss-vl.fullname" .) (int .Release.Revision) | trunc 56 | trimSuffix "-" }}
{{- end }}

{{- define "moss-vl.loadtestReportsClaim" -}}
{{- default (printf "%s-loadtest-reports" (include "moss-vl.fullname" .)) .Values.loadtest.reports.persistence.existingClaim }}
{{- end }}

{{/* Labels of a run's pods. Call with (dict "root" $ "role" "master"|"worker"). */}}
{{- define "moss-vl.loadtestLabels" -}}
{{ include "moss-vl.selectorLabels" .root }}
app.kubernetes.io/component: loadtest
moss-vl.openmoss.io/locust-role: {{ .role }}
moss-vl.openmoss.io/loadtest-run: {{ include "moss-vl.loadtestRun" .root | quote }}
{{- end }}

{{/*
The Locust container shared by the master Job and the worker Job.
Call with (dict "root" $ "role" "master"|"worker").
*/}}
{{- define "moss-vl.loadtestPodSpec" -}}
{{- $root := .root -}}
{{- $lt := $root.Values.loadtest -}}
{{- $fullname := include "moss-vl.fullname" $root -}}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
containers:
  - name: locust
    image: {{ $lt.image }}
    imagePullPolicy: IfNotPresent
    command:
      - locust
    args:
      - --locustfile=/mnt/locust/locustfile.py
      {{- if eq .role "master" }}
      - --master
      - --master-bind-port=5557
      - --headless
      - --users={{ $lt.users }}
      - --spawn-rate={{ $lt.spawnRate }}
      - --run-time={{ $lt.runTime }}
      - --expect-workers={{ $lt.workers }}
      # Workers that never come (no capacity, wrong image) end the run.
      - --expect-workers-max-wait={{ $lt.expectWorkersMaxWait }}
      - --stop-timeout={{ $lt.stopTimeout }}
      - --host={{ default (include "moss-vl.endpointURL" $root) $lt.host }}
      {{- if $lt.arrivalRate }}
      - --arrival-rate={{ $lt.arrivalRate }}
      {{- end }}
      - --csv=/reports/moss-vl
      - --html=/reports/report.html
      - --verdict-file=/reports/verdict.json
      - --only-summary
      {{- else }}
      - --worker
      - --master-host={{ $fullname }}-loadtest-master
      - --master-port=5557
      {{- end }}
    env:
      - name: PYTHONDONTWRITEBYTECODE
        value: "1"
      - name: MOSS_VL_LOADTEST_PAYLOADS
        value: /mnt/payloads
      - name: MOSS_VL_LOADTEST_MODEL
        value: {{ $root.Values.server.servedModelName | quote }}
      {{- if include "moss-vl.apiKeyEnabled" $root }}
      - name: MOSS_VL_LOADTEST_API_KEY
        valueFrom:
          secretKeyRef:
            name: {{ include "moss-vl.apiKeySecretName" $root }}
            key: {{ $root.Values.server.apiKey.secretKey }}
      {{- end }}
      {{- with $lt.env }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    {{- if eq .role "master" }}
    ports:
      - name: locust-master
        containerPort: 5557
        protocol: TCP
    {{- end }}
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    resources:
      {{- toYaml $lt.resources | nindent 6 }}
    volumeMounts:
      - name: locustfile
        mountPath: /mnt/locust
        readOnly: true
      - name: payloads
        mountPath: /mnt/payloads
        readOnly: true
      - name: tmp
        mountPath: /tmp
      {{- if eq .role "master" }}
      - name: reports
        mountPath: /reports
        {{- if $lt.reports.persistence.enabled }}
        # One folder per run (the kubelet creates it).
        subPath: {{ include "moss-vl.loadtestRun" $root }}
        {{- end }}
      {{- end }}
volumes:
  - name: locustfile
    configMap:
      name: {{ $fullname }}-loadtest
  - name: payloads
    {{- if $lt.payloadsVolume }}
    {{- toYaml $lt.payloadsVolume | nindent 4 }}
    {{- else }}
    configMap:
      name: {{ default (printf "%s-loadtest-payloads" $fullname) $lt.payloadsConfigMap }}
    {{- end }}
  - name: tmp
    emptyDir:
      sizeLimit: 1Gi
  {{- if eq .role "master" }}
  - name: reports
    {{- if $lt.reports.persistence.enabled }}
    persistentVolumeClaim:
      claimName: {{ include "moss-vl.loadtestReportsClaim" $root }}
    {{- else }}
    # Without a claim the reports live as long as the pod; the summary and the
    # verdict are in its log either way.
    emptyDir:
      sizeLimit: 1Gi
    {{- end }}
  {{- end }}
{{- end }}
