{{/*
ipkeep.defaults: every template includes it first. It sets each value (values.yaml's documented
keys; a map such as `resources` is one value) that Helm passed without to its default, from
files/defaults.json (generated from values.yaml; a test holds the two equal). `helm upgrade
--reuse-values` renders a chart with the previous release's chart defaults, which lack every value
added since: with this it renders as `--reset-then-reuse-values` does for those, and no value a
release added is ever missing. What a value holds stays, even false, 0 or "".
*/}}
{{- define "ipkeep.defaults" -}}
{{- range $path, $default := .Files.Get "files/defaults.json" | fromJson -}}
{{- $map := $.Values -}}
{{- $keys := splitList "." $path -}}
{{- range initial $keys -}}
{{- if not (kindIs "map" (get $map .)) -}}
{{- $_ := set $map . dict -}}
{{- end -}}
{{- $map = get $map . -}}
{{- end -}}
{{- if not (hasKey $map (last $keys)) -}}
{{- $_ := set $map (last $keys) $default -}}
{{- end -}}
{{- end -}}
{{- end -}}

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

{{/* The image reference: the digest wins over the tag; the tag defaults to appVersion. No
repository is refused here, at helm install, rather than as ImagePullBackOff on every node. */}}
{{- define "ipkeep.image" -}}
{{- $repository := required "image.repository is not set: set it to the registry and repository your nodes pull ipkeep's image from, e.g. --set image.repository=registry.example.internal/ipkeep (README.md, \"Install with Helm\")" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (default .Chart.AppVersion .Values.image.tag) -}}
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

{{/*
ipkeep.seconds: a duration value (the schema's grammar: digits, then s, m, h or d) in seconds.
*/}}
{{- define "ipkeep.seconds" -}}
{{- $unit := regexFind "[smhd]$" . -}}
{{- mul (trimSuffix $unit . | int64) (get (dict "s" 1 "m" 60 "h" 3600 "d" 86400) $unit) -}}
{{- end -}}

{{/*
ipkeep.refuse: combinations of values the binaries would refuse at start, refused by helm
install and upgrade themselves, naming the values (the schema checks each value alone).
*/}}
{{- define "ipkeep.refuse" -}}
{{- $c := .Values.controller -}}
{{- if gt (include "ipkeep.seconds" $c.defaultRetainFor | int64) (include "ipkeep.seconds" $c.maxRetainFor | int64) -}}
{{- fail (printf "controller.defaultRetainFor (%s) is longer than controller.maxRetainFor (%s), which the controller refuses: set controller.defaultRetainFor to at most %s, or controller.maxRetainFor to at least %s" $c.defaultRetainFor $c.maxRetainFor $c.maxRetainFor $c.defaultRetainFor) -}}
{{- end -}}
{{- end -}}
