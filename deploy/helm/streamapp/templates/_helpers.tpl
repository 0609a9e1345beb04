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

{{- define "streamapp.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{- define "streamapp.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{ .Values.serviceAccount.name | default (include "streamapp.fullname" .) }}
{{- else -}}
{{ .Values.serviceAccount.name | default "default" }}
{{- end -}}
{{- end -}}

{{- define "streamapp.secretName" -}}
{{- .Values.kafka.existingSecret | default (printf "%s-kafka" (include "streamapp.fullname" .)) -}}
{{- end -}}

{{- define "streamapp.secured" -}}
{{- if ne .Values.kafka.securityProtocol "PLAINTEXT" }}true{{ end -}}
{{- end -}}

{{/* Whether the Kafka Secret holds ca.crt: the chart writes one from kafka.caCert; an existing
Secret has one unless kafka.existingSecretHasCA says not (a service signed by a public CA). */}}
{{- define "streamapp.hasCA" -}}
{{- if or .Values.kafka.caCert (and .Values.kafka.existingSecret .Values.kafka.existingSecretHasCA) }}true{{ end -}}
{{- end -}}

{{- define "streamapp.webTokenSecretName" -}}
{{- .Values.web.existingSecret | default (printf "%s-web" (include "streamapp.fullname" .)) -}}
{{- end -}}

{{- define "streamapp.webToken" -}}
{{- if or .Values.web.token .Values.web.existingSecret }}true{{ end -}}
{{- end -}}

{{/* The settings every process of the release shares, as NAME: "value" lines: the ConfigMap's
data, and the topics Job's environment (a hook runs before the ConfigMap exists). */}}
{{- define "streamapp.settings" -}}
STREAMAPP_BROKER: {{ .Values.kafka.broker | quote }}
STREAMAPP_SECURITY_PROTOCOL: {{ .Values.kafka.securityProtocol | quote }}
{{- with .Values.kafka.saslMechanism }}
STREAMAPP_SASL_MECHANISM: {{ . | quote }}
{{- end }}
STREAMAPP_PARTITIONS: {{ .Values.pipeline.partitions | quote }}
STREAMAPP_REPLICATION_FACTOR: {{ .Values.pipeline.replicationFactor | quote }}
STREAMAPP_TOPIC_PREFIX: {{ .Values.pipeline.topicPrefix | quote }}
STREAMAPP_JOIN_TTL: {{ .Values.pipeline.joinTtl | quote }}
STREAMAPP_MAX_FRAME_BYTES: "{{ .Values.pipeline.maxFrameMiB }}MiB"
STREAMAPP_DISK_RESERVE: "{{ .Values.pipeline.diskReserveMiB }}MiB"
STREAMAPP_BROKER_DISK_BUDGET: "{{ .Values.pipeline.brokerDiskBudgetGiB }}GiB"
STREAMAPP_DETECTOR: {{ .Values.pipeline.detector | quote }}
STREAMAPP_LOG_FORMAT: {{ .Values.pipeline.logFormat | quote }}
STREAMAPP_DATA_DIR: /data
STREAMAPP_OUT_DIR: /out
# Probes and Prometheus reach the web port from outside the pod.
STREAMAPP_WEB_BIND: "0.0.0.0"
{{- range $name, $value := .Values.pipeline.extraEnv }}
{{ $name }}: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* Memory limit of a worker: its budget plus its stage's headroom (docs/operations.md). */}}
{{- define "streamapp.memoryLimit" -}}
{{- add .memoryBudgetMiB .memoryHeadroomMiB }}Mi
{{- end -}}

{{- define "streamapp.sinkOutMiB" -}}
{{- add (div (mul .Values.sink.diskBudgetMiB 5) 4) .Values.pipeline.diskReserveMiB -}}
{{- end -}}

{{/* The emptyDirs of a worker together: /tmp, /data but on the join, /out on a sink without a
volume of its own. (list $ "stage" values) */}}
{{- define "streamapp.scratchMiB" -}}
{{- $ := index . 0 -}}
{{- $stage := index . 1 -}}
{{- $total := 64 -}}
{{- if ne $stage "join" }}{{ $total = add $total 256 }}{{ end -}}
{{- if and (eq $stage "sink") (not (index . 2).outVolume) }}{{ $total = add $total (include "streamapp.sinkOutMiB" $) }}{{ end -}}
{{- $total -}}
{{- end -}}

{{/* The pod-level settings every pod of the release shares, the topics Job's included:
(list $ serviceAccountName) */}}
{{- define "streamapp.podCommon" -}}
{{- $ := index . 0 -}}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ index . 1 }}
# No process of the release calls the Kubernetes API.
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  # Mounted Secrets (0440) and volumes are readable by the group of the process.
  fsGroup: 10001
  fsGroupChangePolicy: OnRootMismatch
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/* Where a pod may run: ($ values component); component "" adds no spread. */}}
{{- define "streamapp.scheduling" -}}
{{- $ := index . 0 -}}
{{- $values := index . 1 -}}
{{- $component := index . 2 -}}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if $values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml $values.topologySpreadConstraints | nindent 2 }}
{{- else if $component }}
# Soft: the workers of a stage spread over nodes and zones where they can, and still start where
# they cannot.
topologySpreadConstraints:
  {{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
  - maxSkew: 1
    topologyKey: {{ $key }}
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "streamapp.selector" (list $ $component) | nindent 8 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* Annotations that roll the pods when their settings or credentials change. */}}
{{- define "streamapp.checksums" -}}
checksum/env: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end -}}

{{/* The pod spec every worker shares: (list $ "stage") */}}
{{- define "streamapp.podSpec" -}}
{{- $ := index . 0 -}}
{{- $stage := index . 1 -}}
{{- /* The stage's own values, then stageDefaults for what it does not set. */}}
{{- $values := merge (deepCopy (index $.Values $stage)) (deepCopy $.Values.stageDefaults) -}}
{{- include "streamapp.podCommon" (list $ (include "streamapp.serviceAccountName" $)) | trim }}
{{- include "streamapp.scheduling" (list $ $values $stage) }}
terminationGracePeriodSeconds: {{ $values.terminationGracePeriodSeconds }}
containers:
  - name: {{ $stage }}
    image: {{ include "streamapp.image" $ | quote }}
    imagePullPolicy: {{ $.Values.image.pullPolicy }}
    # --quiet: no banner on stdout, so that every line of the log is JSON.
    command: ["faust", "--quiet", "-A", "streamapp.app", "worker", "-l", "info", "--web-port", "6066"]
    envFrom:
      - configMapRef:
          name: {{ include "streamapp.fullname" $ }}-env
      {{- with $.Values.pipeline.extraEnvFrom }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
    env:
      - name: STREAMAPP_STAGES
        value: {{ $stage }}
      # A static member's id includes its host name: stable for the join's StatefulSet, so a
      # restarted join worker takes its partitions back at once; new at every restart of a
      # Deployment's pod, where a static member would only hold its partitions for the session
      # timeout after a clean stop.
      - name: STREAMAPP_STATIC_MEMBERSHIP
        value: {{ eq $stage "join" | quote }}
      - name: STREAMAPP_SESSION_TIMEOUT
        value: {{ $values.sessionTimeout | quote }}
      - name: STREAMAPP_MEMORY_BUDGET
        value: "{{ $values.memoryBudgetMiB }}MiB"
      # OpenCV's and OpenMP's threads: as many as the CPUs the worker asks for, not the node's.
      - name: OPENCV_FOR_THREADS_NUM
        value: {{ $values.threads | quote }}
      - name: OMP_NUM_THREADS
        value: {{ $values.threads | quote }}
      {{- if eq $stage "join" }}
      - name: STREAMAPP_DISK_BUDGET
        value: "{{ $values.diskBudgetMiB }}MiB"
      {{- end }}
      {{- if eq $stage "sink" }}
      - name: STREAMAPP_SINK_DISK_BUDGET
        value: "{{ $values.diskBudgetMiB }}MiB"
      {{- end }}
      {{- if include "streamapp.webToken" $ }}
      - name: STREAMAPP_WEB_TOKEN_FILE
        value: /etc/streamapp/web/token
      {{- end }}
      {{- with include "streamapp.secretEnv" (list $ (include "streamapp.secretName" $)) }}
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
        memory: {{ include "streamapp.memoryLimit" $values }}
        # The emptyDirs below, so that the scheduler reserves their space on the node.
        ephemeral-storage: {{ include "streamapp.scratchMiB" (list $ $stage $values) }}Mi
      limits:
        memory: {{ include "streamapp.memoryLimit" $values }}
        {{- with $values.cpuLimit }}
        cpu: {{ . | quote }}
        {{- end }}
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
      {{- if include "streamapp.webToken" $ }}
      - name: web-token
        mountPath: /etc/streamapp/web
        readOnly: true
      {{- end }}
      {{- with $.Values.pipeline.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
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
    {{- if $values.outVolume }}
    {{- toYaml $values.outVolume | nindent 4 }}
    {{- else }}
    emptyDir:
      sizeLimit: {{ include "streamapp.sinkOutMiB" $ }}Mi
    {{- end }}
  {{- end }}
  {{- if include "streamapp.secured" $ }}
  - name: kafka-credentials
    secret:
      secretName: {{ include "streamapp.secretName" $ }}
      defaultMode: 0440
  {{- end }}
  {{- if include "streamapp.webToken" $ }}
  - name: web-token
    secret:
      secretName: {{ include "streamapp.webTokenSecretName" $ }}
      defaultMode: 0440
      items:
        - key: token
          path: token
  {{- end }}
  {{- with $.Values.pipeline.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{/* The Kafka credentials: files from the Secret, never values in the environment. (list $ secretName) */}}
{{- define "streamapp.secretEnv" -}}
{{- $ := index . 0 -}}
{{- if include "streamapp.secured" $ -}}
{{- if include "streamapp.hasCA" $ }}
- name: STREAMAPP_SSL_CA_FILE
  value: /etc/streamapp/kafka/ca.crt
{{- end }}
{{- if $.Values.kafka.saslMechanism }}
- name: STREAMAPP_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ index . 1 }}
      key: sasl-username
- name: STREAMAPP_SASL_PASSWORD_FILE
  value: /etc/streamapp/kafka/sasl-password
{{- end }}
{{- end -}}
{{- end -}}

{{/* What the chart's Kafka Secret holds (also the topics Job's copy of it). */}}
{{- define "streamapp.secretData" -}}
{{- if .Values.kafka.saslMechanism }}
sasl-username: {{ required "kafka.saslUsername is required with kafka.saslMechanism" .Values.kafka.saslUsername | quote }}
sasl-password: {{ required "kafka.saslPassword is required with kafka.saslMechanism (--set or --set-file)" .Values.kafka.saslPassword | quote }}
{{- end }}
{{- with .Values.kafka.caCert }}
ca.crt: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* The topics Job's credentials: an admin's Secret, else the workers' existing Secret, else a
copy of the chart's own that the hook writes (the chart's Secret does not exist before install). */}}
{{- define "streamapp.topicsSecretName" -}}
{{- .Values.topicsJob.existingSecret | default .Values.kafka.existingSecret | default (printf "%s-topics-kafka" (include "streamapp.fullname" .)) -}}
{{- end -}}

{{/* A map of labels as `key=value, ...`, for NOTES.txt. */}}
{{- define "streamapp.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}{{ $pairs = append $pairs (printf "%s=%s" $key $value) }}{{ end }}
{{- join ", " $pairs }}
{{- end -}}
