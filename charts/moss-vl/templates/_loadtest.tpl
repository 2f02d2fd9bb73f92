{{/*
The Locust container shared by the master Job and the worker Deployment.
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
      - --host={{ default (include "moss-vl.endpointURL" $root) $lt.host }}
      - --csv=/tmp/report/moss-vl
      - --html=/tmp/report/moss-vl.html
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
volumes:
  - name: locustfile
    configMap:
      name: {{ $fullname }}-loadtest
  - name: payloads
    configMap:
      name: {{ default (printf "%s-loadtest-payloads" $fullname) $lt.payloadsConfigMap }}
  - name: tmp
    emptyDir:
      sizeLimit: 1Gi
{{- end }}
