{{/* The chart name, overridable. */}}
{{- define "ipkeep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every resource name: <release>-<chart>, or <release> when it holds the chart name. */}}
{{- define "ipkeep.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels on every resource. */}}
{{- define "ipkeep.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "ipkeep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ipkeep
{{- end -}}

{{/* Selector labels of one component: call with (dict "root" $ "component" "controller"). */}}
{{- define "ipkeep.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ipkeep.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image reference: the digest wins over the tag; the tag defaults to appVersion. */}}
{{- define "ipkeep.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The controller's leader-election Lease name. */}}
{{- define "ipkeep.leaseName" -}}
{{- default (printf "%s-controller" (include "ipkeep.fullname" .)) .Values.controller.leaderElection.leaseName -}}
{{- end -}}

{{/* Log settings both components read from their environment. */}}
{{- define "ipkeep.logEnv" -}}
- name: IPKEEP_LOG_LEVEL
  value: {{ .Values.logging.level | quote }}
- name: IPKEEP_LOG_FORMAT
  value: {{ .Values.logging.format | quote }}
{{- end -}}

{{/* The container security context shared by everything: nothing to escalate, nothing to write. */}}
{{- define "ipkeep.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
