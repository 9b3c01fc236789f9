{{- define "drain-router-controller.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release name, unless it does not contain the chart name (then release-chart). */}}
{{- define "drain-router-controller.fullname" -}}
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

{{- define "drain-router-controller.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels. app.kubernetes.io/name is what the drain-router chart's NetworkPolicy admits to
the routers' admin port (networkPolicy.controller.podLabels there). */}}
{{- define "drain-router-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "drain-router-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "drain-router-controller.labels" -}}
helm.sh/chart: {{ include "drain-router-controller.chart" . }}
{{ include "drain-router-controller.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: drain-router
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "drain-router-controller.image" -}}
{{- $img := .Values.image -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{- define "drain-router-controller.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "drain-router-controller.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the controller watches in namespaced mode: the list, or the release's namespace. */}}
{{- define "drain-router-controller.watchNamespaces" -}}
{{- $list := .Values.watch.namespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $list) -}}
{{- end -}}

{{/* The activator: its own name (release fullname + -activator) and selector labels (component
activator, so the controller's selector never matches its pods). */}}
{{- define "drain-router-controller.activatorName" -}}
{{- printf "%s-activator" (include "drain-router-controller.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "drain-router-controller.activatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "drain-router-controller.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: activator
{{- end -}}

{{- define "drain-router-controller.activatorLabels" -}}
{{ include "drain-router-controller.labels" . | replace "app.kubernetes.io/component: controller" "app.kubernetes.io/component: activator" }}
{{- end -}}

