{{/* Chart name, truncated to 63 characters (label values and DNS names). */}}
{{- define "drain-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: the release name, unless it does not contain the chart name. */}}
{{- define "drain-router.fullname" -}}
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

{{- define "drain-router.controllerName" -}}
{{- printf "%s-controller" (include "drain-router.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "drain-router.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The ModelService's name; also the value of the drainrouter.dev/service label on the workload. */}}
{{- define "drain-router.modelServiceName" -}}
{{- default (include "drain-router.fullname" .) .Values.modelService.name -}}
{{- end -}}

{{/* Selector labels. Call with (dict "root" $ "component" "model-server"). The component keeps the
controller's pods out of the model server's selectors (and out of the ModelService's podSelector). */}}
{{- define "drain-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "drain-router.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "drain-router.labels" -}}
helm.sh/chart: {{ include "drain-router.chart" .root }}
{{ include "drain-router.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: drain-router
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels and annotations of the objects the ModelService lists (Deployment, Service, HTTPRoute).
The drainrouter.dev/service label marks them as this service's own (the controller never deletes an
object labelled with another service's name). helm.sh/resource-policy: keep makes `helm uninstall`
leave them to the controller, which removes them in order: route, settle, workload, pods. */}}
{{- define "drain-router.workloadLabels" -}}
{{ include "drain-router.labels" . }}
{{- if .root.Values.modelService.enabled }}
drainrouter.dev/service: {{ include "drain-router.modelServiceName" .root }}
{{- end }}
{{- end -}}

{{- define "drain-router.workloadAnnotations" -}}
{{- if and .Values.modelService.enabled .Values.modelService.keepWorkloadOnUninstall }}
helm.sh/resource-policy: keep
{{- end }}
{{- end -}}

{{/* This project's image (router sidecar and controller). */}}
{{- define "drain-router.image" -}}
{{- $img := .image -}}
{{- $tag := default .root.Chart.AppVersion $img.tag -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "drain-router.controllerServiceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "drain-router.controllerName" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespaces the controller watches (namespaced mode): the list, or the release's namespace. */}}
{{- define "drain-router.watchNamespaces" -}}
{{- $list := .Values.controller.watchNamespaces | default (list .Release.Namespace) -}}
{{- toJson (uniq $list) -}}
{{- end -}}

{{/* Checks that a schema cannot express (they compare two values). */}}
{{- define "drain-router.validate" -}}
{{- $r := .Values.router -}}
{{- if eq (int $r.port) (int $r.adminPort) -}}
{{- fail (printf "router.port and router.adminPort are both %v: the admin listener (probes, /admin/drain-wait) must have its own port" $r.port) -}}
{{- end -}}
{{- if or (eq (int .Values.modelServer.port) (int $r.port)) (eq (int .Values.modelServer.port) (int $r.adminPort)) -}}
{{- fail (printf "modelServer.port %v collides with a router port (%v, %v): the containers share the pod's network namespace" .Values.modelServer.port $r.port $r.adminPort) -}}
{{- end -}}
{{- $drain := int .Values.shutdownDrainSecs -}}
{{- $grace := int .Values.terminationGraceSecs -}}
{{- if and (gt $drain 0) (ge $drain $grace) -}}
{{- fail (printf "shutdownDrainSecs (%d) must be below terminationGraceSecs (%d): the router's deadline (grace - 2 s) would abort every in-flight stream before the drain even ends. Raise terminationGraceSecs to the drain plus your longest completion" $drain $grace) -}}
{{- end -}}
{{- end -}}
