{{/*
Helpers of the pliant chart. The templates keep to a small subset of Helm's
template language (fields, include, define, if/else, with, range, toYaml,
nindent, indent, quote, default, trunc, trimSuffix, printf, eq, ne, not, and,
or): tests/cli/test_chart.py renders them with its own renderer of that subset,
since helm itself is not available where the tests run.
*/}}

{{/* The resource name: RELEASE-operator, at most 63 characters. */}}
{{- define "pliant.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-operator" (default .Release.Name .Values.nameOverride) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "pliant.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels that select the operator Pods (the workers' NetworkPolicies name them too). */}}
{{- define "pliant.selectorLabels" -}}
app.kubernetes.io/name: pliant-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "pliant.labels" -}}
helm.sh/chart: {{ include "pliant.chart" . }}
{{ include "pliant.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: pliant
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "pliant.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "pliant.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "pliant.operatorImage" -}}
{{- printf "%s:%s" .Values.operator.image.repository (default .Chart.AppVersion .Values.operator.image.tag) -}}
{{- end -}}

{{- define "pliant.workerImage" -}}
{{- printf "%s:%s" .Values.worker.image.repository (default .Chart.AppVersion .Values.worker.image.tag) -}}
{{- end -}}
