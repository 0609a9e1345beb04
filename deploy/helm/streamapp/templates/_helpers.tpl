{{- define "streamapp.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "streamapp.labels" -}}
app.kubernetes.io/name: streamapp
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (list $ "join") */}}
{{- define "streamapp.selector" -}}
app.kubernetes.io/name: streamapp
app.kubernetes.io/instance: {{ (index . 0).Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "streamapp.secretName" -}}
{{- .Values.kafka.existingSecret | default (printf "%s-kafka" (include "streamapp.fullname" .)) -}}
{{- end -}}

{{- define "streamapp.secured" -}}
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" }}true{{ end -}}
{{- end -}}

{{/* Memory limit of a worker: the budget plus the headroom docs/operations.md gives. */}}
{{- define "streamapp.memoryLimit" -}}
{{- add .Values.pipeline.memoryBudgetMiB .Values.pipeline.memoryHeadroomMiB }}Mi
{{- end -}}

{{/* The pod spec every worker shares: (list $ "stage" extraVolumeMounts) */}}
{{- define "streamapp.podSpec" -}}
{{- $ := index . 0 -}}
{{- $stage := index . 1 -}}
{{- $values := index $.Values $stage -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
terminationGracePeriodSeconds: 30
containers:
  - name: {{ $stage }}
    image: "{{ $.Values.image.repository }}:{{ $.Values.image.tag }}"
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    # --quiet: no banner on stdout, so that every line of the log is JSON.
    command: ["faust", "--quiet", "-A", "streamapp.app", "worker", "-l", "info", "--web-port", "6066"]
    envFrom:
      - configMapRef:
          name: {{ include "streamapp.fullname" $ }}-env
    env:
      - name: STREAMAPP_STAGES
        value: {{ $stage }}
      # A static member's id includes its host name: stable for the join's StatefulSet, so a
      # restarted join worker takes its partitions back at once; new at every restart of a
      # Deployment's pod, where a static member would only hold its partitions for the session
      # timeout after a clean stop.
      - name: STREAMAPP_STATIC_MEMBERSHIP
        value: {{ eq $stage "join" | quote }}
      {{- if eq $stage "join" }}
      - name: STREAMAPP_DISK_BUDGET
        value: "{{ $values.diskBudgetMiB }}MiB"
      {{- end }}
      {{- if eq $stage "sink" }}
      - name: STREAMAPP_SINK_DISK_BUDGET
        value: "{{ $values.diskBudgetMiB }}MiB"
      {{- end }}
      {{- with include "streamapp.secretEnv" $ }}
      {{- . | trim | nindent 6 }}
      {{- end }}
    ports:
      - name: web
        containerPort: 6066
    startupProbe:
      httpGet: {path: /healthz, port: web}
      periodSeconds: 5
      failureThreshold: 60
    livenessProbe:
      httpGet: {path: /healthz, port: web}
      periodSeconds: 10
      timeoutSeconds: 5
      failureThreshold: 3
    readinessProbe:
      httpGet: {path: /readyz, port: web}
      periodSeconds: 5
      timeoutSeconds: 5
      failureThreshold: 2
    resources:
      requests:
        cpu: {{ $values.cpu | quote }}
        memory: {{ include "streamapp.memoryLimit" $ }}
      limits:
        memory: {{ include "streamapp.memoryLimit" $ }}
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: ["ALL"]
    volumeMounts:
      - name: data
        mountPath: /data
      - name: tmp
        mountPath: /tmp
      {{- if eq $stage "sink" }}
      - name: out
        mountPath: /out
      {{- end }}
      {{- if include "streamapp.secured" $ }}
      - name: kafka-credentials
        mountPath: /etc/streamapp/kafka
        readOnly: true
      {{- end }}
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
  {{- if ne $stage "join" }}
  # Stateless stages keep nothing worth a restart: Faust's files only.
  - name: data
    emptyDir:
      sizeLimit: 256Mi
  {{- end }}
  {{- if eq $stage "sink" }}
  - name: out
    emptyDir:
      sizeLimit: {{ add (div (mul $values.streams $values.diskBudgetMiB 5) 4) $.Values.pipeline.diskReserveMiB }}Mi
  {{- end }}
  {{- if include "streamapp.secured" $ }}
  - name: kafka-credentials
    secret:
      secretName: {{ include "streamapp.secretName" $ }}
      defaultMode: 0440
  {{- end }}
{{- end -}}

{{/* The Kafka credentials: files from the Secret, never values in the environment. */}}
{{- define "streamapp.secretEnv" -}}
{{- if include "streamapp.secured" . -}}
{{- if or .Values.kafka.caCert .Values.kafka.existingSecret }}
- name: STREAMAPP_SSL_CA_FILE
  value: /etc/streamapp/kafka/ca.crt
{{- end }}
{{- if .Values.kafka.saslMechanism }}
- name: STREAMAPP_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ include "streamapp.secretName" . }}
      key: sasl-username
- name: STREAMAPP_SASL_PASSWORD_FILE
  value: /etc/streamapp/kafka/sasl-password
{{- end }}
{{- end -}}
{{- end -}}
