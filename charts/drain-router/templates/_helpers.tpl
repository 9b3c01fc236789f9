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

{{/* Labels and annotations of the objects the ModelService lists (Deployment, Service, routes, pool).
The drainrouter.dev/service label marks them as this service's own: the controller deletes, scales
or patches only objects that carry it (or an owner reference to the ModelService), and the pods of
this Deployment are the service's through its ReplicaSets. helm.sh/resource-policy: keep makes `helm uninstall`
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



{{/* Checks that a schema cannot express (they compare two values). */}}
{{- define "drain-router.validate" -}}
{{- $r := .Values.router -}}
{{- if eq (int $r.port) (int $r.adminPort) -}}
{{- fail (printf "router.port and router.adminPort are both %v: the admin listener (probes, /admin/drain-wait) must have its own port" $r.port) -}}
{{- end -}}
{{- $engine := fromYaml (include "drain-router.engine" .) -}}
{{- if eq .Values.modelServer.engine "custom" -}}
{{- if not .Values.modelServer.image.repository -}}
{{- fail "modelServer.engine custom needs modelServer.image.repository (and modelServer.args, modelServer.port)" -}}
{{- end -}}
{{- if kindIs "invalid" .Values.modelServer.port -}}
{{- fail "modelServer.engine custom needs modelServer.port: the router's --upstream is http://127.0.0.1:<port>" -}}
{{- end -}}
{{- end -}}
{{- if or (eq (int $engine.port) (int $r.port)) (eq (int $engine.port) (int $r.adminPort)) -}}
{{- fail (printf "modelServer.port %v collides with a router port (%v, %v): the containers share the pod's network namespace" $engine.port $r.port $r.adminPort) -}}
{{- end -}}
{{- if and .Values.httpRoute.enabled (eq .Values.httpRoute.backend "InferencePool") (not .Values.inferencePool.enabled) -}}
{{- fail "httpRoute.backend InferencePool needs inferencePool.enabled (the pool the route sends to)" -}}
{{- end -}}
{{- include "drain-router.validateGrpc" (dict "root" . "engine" $engine) -}}
{{- include "drain-router.validateAdmission" . -}}
{{- include "drain-router.validateFront" (dict "root" . "engine" $engine) -}}
{{- $drain := int .Values.shutdownDrainSecs -}}
{{- $grace := int .Values.terminationGraceSecs -}}
{{- if and (gt $drain 0) (ge $drain $grace) -}}
{{- fail (printf "shutdownDrainSecs (%d) must be below terminationGraceSecs (%d): the router's deadline (grace - 2 s) would abort every in-flight stream before the drain even ends. Raise terminationGraceSecs to the drain plus your longest completion" $drain $grace) -}}
{{- end -}}
{{- $rp := $r.readinessProbe -}}
{{- $window := mul (int $rp.periodSeconds) (int $rp.failureThreshold) -}}
{{- if and $rp.declareToRouter (le $drain (int $window)) -}}
{{- fail (printf "shutdownDrainSecs (%d) must be above the readiness probe window (router.readinessProbe.failureThreshold %v x periodSeconds %v = %d s): a probe-driven load balancer would still send requests after the listener closes. Raise shutdownDrainSecs above %d, or set router.readinessProbe.declareToRouter false if no balancer follows this probe" $drain $rp.failureThreshold $rp.periodSeconds (int $window) (int $window)) -}}
{{- end -}}
{{- $timeout := int $r.upstreamHealthTimeoutSecs -}}
{{- $notice := add (mul (int $r.upstreamHealthFailureThreshold) (max (int $r.upstreamHealthIntervalSecs) $timeout)) $timeout -}}
{{- /* 8: the router's default polling's own notice time (3 x max(2, 2) + 2), the budget's floor:
a drain shorter than that says how fast balancers follow /readyz, not that the defaults are wrong. */ -}}
{{- if and $engine.healthPath (gt $drain 0) (gt (int $notice) (max $drain 8)) -}}
{{- fail (printf "noticing a model server that stopped answering its health path takes up to %d s (router.upstreamHealthFailureThreshold %v x max(upstreamHealthIntervalSecs %v, upstreamHealthTimeoutSecs %v) + upstreamHealthTimeoutSecs), longer than shutdownDrainSecs (%d), the time load balancers are given to stop sending to a pod, and than the default polling's 8 s: lower those, or raise shutdownDrainSecs" (int $notice) $r.upstreamHealthFailureThreshold $r.upstreamHealthIntervalSecs $r.upstreamHealthTimeoutSecs $drain) -}}
{{- end -}}
{{- $a := .Values.autoscaling -}}
{{- if $a.enabled -}}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) -}}
{{- fail (printf "autoscaling.minReplicas (%v) is above autoscaling.maxReplicas (%v)" $a.minReplicas $a.maxReplicas) -}}
{{- end -}}
{{- if and $a.keda.enabled (not $a.keda.serverAddress) -}}
{{- fail "autoscaling.keda.enabled needs autoscaling.keda.serverAddress: the Prometheus KEDA queries for drain_router_inflight_requests" -}}
{{- end -}}
{{- if and $a.keda.enabled .Values.modelService.enabled -}}
{{- range .Values.modelService.lifecycleRules -}}
{{- if eq .policy "ScaleToZero" -}}
{{- fail "autoscaling.keda.enabled with a ScaleToZero lifecycle rule: KEDA scales a Deployment below minReplicaCount straight back up, undoing the rule (the HorizontalPodAutoscaler leaves a Deployment at 0 alone: use it instead)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- else if $a.keda.enabled -}}
{{- fail "autoscaling.keda.enabled needs autoscaling.enabled: the ScaledObject is one of the two autoscalers it chooses between" -}}
{{- end -}}
{{- $names := list "router" .Values.modelServer.name -}}
{{- range .Values.workload.extraContainers -}}
{{- if has .name $names -}}
{{- fail (printf "workload.extraContainers: a container named %q is already in the pod (router, modelServer.name %q)" .name $.Values.modelServer.name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $volumes := list -}}
{{- if .Values.modelServer.shmSize -}}
{{- $volumes = append $volumes "dshm" -}}
{{- end -}}
{{- range .Values.workload.volumes -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range $engine.emptyDirs -}}
{{- if has .name $volumes -}}
{{- fail (printf "workload.volumes: a volume named %q is already in the pod (the engine preset's writable %s)" .name .mountPath) -}}
{{- end -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range (list (dict "where" "router.volumeMounts" "mounts" .Values.router.volumeMounts) (dict "where" "modelServer.volumeMounts" "mounts" .Values.modelServer.volumeMounts)) -}}
{{- $where := .where -}}
{{- range .mounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "%s mounts volume %q, which is not in workload.volumes" $where .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The gRPC checks. Call with (dict "root" $ "engine" $engine). */}}
{{- define "drain-router.validateGrpc" -}}
{{- $v := .root.Values -}}
{{- $g := $v.grpc -}}
{{- $r := $v.router -}}
{{- $e := .engine -}}
{{- $name := $v.modelServer.engine -}}
{{- if and (eq $r.readinessProbe.protocol "grpc") (not $g.enabled) -}}
{{- fail "router.readinessProbe.protocol grpc needs grpc.enabled: the probe checks grpc.health.v1 on the router's gRPC listener" -}}
{{- end -}}
{{- if and $v.grpcRoute.enabled (not $g.enabled) -}}
{{- fail "grpcRoute.enabled needs grpc.enabled: the route sends to the Service's grpc port, which only exists then" -}}
{{- end -}}
{{- if $g.enabled -}}
{{- if and (ne $name "custom") (not $e.grpc.flag) -}}
{{- fail (printf "grpc.enabled: modelServer.engine %s has no gRPC server (vllm and sglang have one; for another engine, Triton included, use engine custom with grpc.modelServerPort)" $name) -}}
{{- end -}}
{{- if kindIs "invalid" $e.grpc.port -}}
{{- fail "grpc.enabled with modelServer.engine custom needs grpc.modelServerPort: the router's --grpc-upstream is http://127.0.0.1:<port> (Triton: 8001)" -}}
{{- end -}}
{{- if and $e.grpc.only (ne (int $e.grpc.port) (int $e.port)) -}}
{{- fail (printf "grpc.modelServerPort %v: %s serves gRPC on its --port (modelServer.port %v) in gRPC mode; leave grpc.modelServerPort null" $e.grpc.port $name $e.port) -}}
{{- end -}}
{{- if has (int $g.port) (list (int $r.port) (int $r.adminPort)) -}}
{{- fail (printf "grpc.port %v collides with a router port (router.port %v, router.adminPort %v): the gRPC listener needs a port of its own" $g.port $r.port $r.adminPort) -}}
{{- end -}}
{{- if has (int $g.port) (list (int $e.port) (int $e.grpc.port)) -}}
{{- fail (printf "grpc.port %v collides with a model server port (%v, gRPC %v): the containers share the pod's network namespace" $g.port $e.port $e.grpc.port) -}}
{{- end -}}
{{- if has (int $e.grpc.port) (list (int $r.port) (int $r.adminPort)) -}}
{{- fail (printf "grpc.modelServerPort %v collides with a router port (%v, %v): the containers share the pod's network namespace" $e.grpc.port $r.port $r.adminPort) -}}
{{- end -}}
{{- if and (not $e.grpc.only) (eq (int $g.servicePort) (int $v.service.port)) -}}
{{- fail (printf "grpc.servicePort and service.port are both %v: the Service needs one port for HTTP and one for gRPC" $g.servicePort) -}}
{{- end -}}
{{- if and $e.grpc.only $v.httpRoute.enabled -}}
{{- fail (printf "httpRoute.enabled with grpc.enabled: %s serves gRPC instead of HTTP in gRPC mode, so the HTTPRoute would reach no model server (use grpcRoute)" $name) -}}
{{- end -}}
{{- if and $e.grpc.only $e.healthPath -}}
{{- fail (printf "router.upstreamHealthPath %q with grpc.enabled: %s serves no HTTP in gRPC mode, so /readyz would wait for it forever; leave it null (router.readinessProbe.protocol grpc follows the engine's gRPC health)" $e.healthPath $name) -}}
{{- end -}}
{{- if and $v.httpRoute.enabled (eq $v.httpRoute.backend "InferencePool") -}}
{{- fail "httpRoute.backend InferencePool with grpc.enabled: the pool targets the router's gRPC port then (one protocol per pool, kubernetes.io/h2c); send the HTTPRoute to the Service, and gRPC to the pool with grpcRoute.backend InferencePool" -}}
{{- end -}}
{{- if and $v.grpcRoute.enabled (eq $v.grpcRoute.backend "InferencePool") (not $v.inferencePool.enabled) -}}
{{- fail "grpcRoute.backend InferencePool needs inferencePool.enabled (the pool the route sends to)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The engine preset, as YAML: image, port, health path, command, args (the model and the
127.0.0.1 binding, then the drain flag, then the gRPC mode flag, then modelServer.args), the probe
of the model server (http: curl of the health path; tcp: a connect to its port, for an engine that
serves gRPC only; none), and with grpc.enabled the model server's gRPC port, whether that replaces
its HTTP server, and the grpc.health.v1 service name that says it is ready. custom: the values
themselves. */}}
{{- define "drain-router.engine" -}}
{{- $m := .Values.modelServer -}}
{{- $g := .Values.grpc -}}
{{- $e := $m.engine -}}
{{- $p := dict -}}
{{- /* grpcFlag: the engine's gRPC mode flag (none: no gRPC server). grpcOnly: it then serves gRPC
instead of HTTP, on its --port. */ -}}
{{- if eq $e "vllm" -}}
{{- $p = dict "repository" "vllm/vllm-openai" "tag" "v0.18.0" "port" 8000 "healthPath" "/health" "metricsPath" "/metrics" "command" (list) "grpcFlag" "--grpc" "grpcOnly" true "grpcHealthService" "vllm.grpc.engine.VllmEngine" -}}
{{- else if eq $e "sglang" -}}
{{- $p = dict "repository" "lmsysorg/sglang" "tag" "v0.5.2" "port" 30000 "healthPath" "/health" "metricsPath" "/metrics" "command" (list "python3" "-m" "sglang.launch_server") "grpcFlag" "--grpc-mode" "grpcOnly" true "grpcHealthService" "sglang.grpc.scheduler.SglangScheduler" -}}
{{- else if eq $e "tgi" -}}
{{- $p = dict "repository" "ghcr.io/huggingface/text-generation-inference" "tag" "3.3.4" "port" 8000 "healthPath" "/health" "metricsPath" "/metrics" "command" (list) "grpcFlag" "" "grpcOnly" false "grpcHealthService" "" -}}
{{- else if eq $e "llamacpp" -}}
{{- $p = dict "repository" "ghcr.io/ggml-org/llama.cpp" "tag" "server-b11151" "port" 8000 "healthPath" "/health" "metricsPath" "/metrics" "command" (list) "grpcFlag" "" "grpcOnly" false "grpcHealthService" "" -}}
{{- else -}}
{{- $p = dict "repository" "" "tag" "" "port" nil "healthPath" "" "metricsPath" "" "command" (list) "grpcFlag" "" "grpcOnly" false "grpcHealthService" "" -}}
{{- end -}}
{{- /* The container's securityContext and what it writes. A preset image runs as root by default and
writes caches under $HOME and /tmp: the preset runs it as uid 1000 with HOME on an emptyDir, /tmp on
another (TGI: /data, its HF_HOME, on a third), and a read-only root filesystem. USER names the uid,
which has no /etc/passwd entry: Python's getpass.getuser() (torch's compile caches) reads it first. */ -}}
{{- $restricted := dict "runAsNonRoot" true "allowPrivilegeEscalation" false "capabilities" (dict "drop" (list "ALL")) "seccompProfile" (dict "type" "RuntimeDefault") -}}
{{- $writable := list -}}
{{- $env := list -}}
{{- if eq $e "custom" -}}
{{- $p = set $p "securityContext" $restricted -}}
{{- else -}}
{{- $p = set $p "securityContext" (merge (dict "runAsUser" 1000 "runAsGroup" 1000 "readOnlyRootFilesystem" true) $restricted) -}}
{{- $writable = list (dict "name" "model-server-home" "mountPath" "/home/model-server") (dict "name" "model-server-tmp" "mountPath" "/tmp") -}}
{{- if eq $e "tgi" -}}
{{- $writable = append $writable (dict "name" "model-server-data" "mountPath" "/data") -}}
{{- end -}}
{{- $env = list (dict "name" "HOME" "value" "/home/model-server") (dict "name" "USER" "value" "model-server") -}}
{{- end -}}
{{- $sc := deepCopy $p.securityContext -}}
{{- range $key, $value := $m.securityContext -}}
{{- if kindIs "invalid" $value -}}
{{- $_ := unset $sc $key -}}
{{- else -}}
{{- $_ := set $sc $key $value -}}
{{- end -}}
{{- end -}}
{{- $mounted := list -}}
{{- range $m.volumeMounts -}}
{{- $mounted = append $mounted (trimSuffix "/" .mountPath) -}}
{{- end -}}
{{- $emptyDirs := list -}}
{{- range $writable -}}
{{- if not (has .mountPath $mounted) -}}
{{- $emptyDirs = append $emptyDirs . -}}
{{- end -}}
{{- end -}}
{{- $named := list -}}
{{- range $m.env -}}
{{- $named = append $named .name -}}
{{- end -}}
{{- $presetEnv := list -}}
{{- range $env -}}
{{- if not (has .name $named) -}}
{{- $presetEnv = append $presetEnv . -}}
{{- end -}}
{{- end -}}
{{- $port := int (default $p.port $m.port) -}}
{{- $grpcOnly := and $g.enabled $p.grpcOnly -}}
{{- $args := list -}}
{{- if eq $e "vllm" -}}
{{- $args = list "--model" $m.model "--host" "127.0.0.1" "--port" (toString $port) -}}
{{- if $m.engineDrainFlag -}}
{{- $args = concat $args (list "--shutdown-timeout" (toString (sub (int .Values.terminationGraceSecs) (int .Values.shutdownDrainSecs)))) -}}
{{- end -}}
{{- else if eq $e "sglang" -}}
{{- $args = list "--model-path" $m.model "--host" "127.0.0.1" "--port" (toString $port) "--enable-metrics" -}}
{{- else if eq $e "tgi" -}}
{{- $args = list "--model-id" $m.model "--hostname" "127.0.0.1" "--port" (toString $port) -}}
{{- else if eq $e "llamacpp" -}}
{{- $args = list "--hf-repo" $m.model "--host" "127.0.0.1" "--port" (toString $port) "--metrics" -}}
{{- end -}}
{{- if and $g.enabled $p.grpcFlag -}}
{{- $args = append $args $p.grpcFlag -}}
{{- end -}}
{{- $health := $p.healthPath -}}
{{- if $grpcOnly -}}
{{- $health = "" -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.router.upstreamHealthPath) -}}
{{- $health = .Values.router.upstreamHealthPath -}}
{{- end -}}
{{- $metrics := $p.metricsPath -}}
{{- if $grpcOnly -}}
{{- $metrics = "" -}}
{{- end -}}
{{- if not (kindIs "invalid" .Values.router.engineMetricsPath) -}}
{{- $metrics = .Values.router.engineMetricsPath -}}
{{- end -}}
{{- $probe := "" -}}
{{- if and $m.probes.enabled (ne $e "custom") -}}
{{- if $grpcOnly -}}
{{- $probe = "tcp" -}}
{{- else if $health -}}
{{- $probe = "http" -}}
{{- end -}}
{{- end -}}
{{- $grpcPort := $g.modelServerPort -}}
{{- if and $p.grpcOnly (kindIs "invalid" $grpcPort) -}}
{{- $grpcPort = $port -}}
{{- end -}}
repository: {{ default $p.repository $m.image.repository | quote }}
tag: {{ default $p.tag $m.image.tag | quote }}
port: {{ $port }}
healthPath: {{ $health | quote }}
metricsPath: {{ $metrics | quote }}
probe: {{ $probe | quote }}
command: {{ toJson (default $p.command $m.command) }}
args: {{ toJson (concat $args $m.args) }}
securityContext: {{ toJson $sc }}
emptyDirs: {{ toJson $emptyDirs }}
env: {{ toJson $presetEnv }}
grpc:
  flag: {{ $p.grpcFlag | quote }}
  only: {{ $grpcOnly }}
  port: {{ if kindIs "invalid" $grpcPort }}null{{ else }}{{ int $grpcPort }}{{ end }}
  healthService: {{ $p.grpcHealthService | quote }}
{{- end -}}

{{/* The model server's exec probe command (the kubelet's own probes go to the pod IP, which a server
bound to 127.0.0.1 does not answer). Call with (dict "engine" $engine "timeout" seconds). */}}
{{- define "drain-router.probeCommand" -}}
{{- $e := .engine -}}
{{- if eq $e.probe "tcp" -}}
{{- toJson (list "python3" "-c" (printf "import socket; socket.create_connection(('127.0.0.1', %d), timeout=%d).close()" (int $e.port) (int .timeout))) -}}
{{- else -}}
{{- toJson (list "curl" "-fsS" "-o" "/dev/null" (printf "http://127.0.0.1:%d%s" (int $e.port) $e.healthPath) "--max-time" (toString .timeout)) -}}
{{- end -}}
{{- end -}}

{{/* The front's objects' name (Deployment, Service, ServiceAccount, Role, RoleBinding, PDB,
NetworkPolicy, PodMonitor). */}}
{{- define "drain-router.frontName" -}}
{{- printf "%s-front" (include "drain-router.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The front's --continuation: front.continuation, else the engine preset's (custom: completions,
what every OpenAI-compatible server serves). false is off: YAML reads a bare `off` as false. */}}
{{- define "drain-router.frontContinuation" -}}
{{- $presets := dict "vllm" "token-ids" "sglang" "chat" "tgi" "completions" "llamacpp" "completions" "custom" "completions" -}}
{{- if kindIs "invalid" .Values.front.continuation -}}
{{- get $presets .Values.modelServer.engine -}}
{{- else if kindIs "bool" .Values.front.continuation -}}
off
{{- else -}}
{{- .Values.front.continuation -}}
{{- end -}}
{{- end -}}

{{/* The traffic ports' `from`, as the model's NetworkPolicy and the front's render it: nothing when
networkPolicy.trafficFrom is empty (the rule then admits every source), else its peers, and with
"activator" true the activator's pods (drain-router-controller chart). Call with (dict "root" $
"activator" bool). */}}
{{- define "drain-router.trafficFrom" -}}
{{- $np := .root.Values.networkPolicy -}}
{{- with $np.trafficFrom }}
from:
  {{- toYaml . | nindent 2 }}
  {{- if $.activator }}
  # The activator (drain-router-controller chart): relays requests it held while this service
  # was scaled to zero, and asks the routers' /readyz on this port whether a pod is ready.
  - namespaceSelector:
      matchLabels:
        kubernetes.io/metadata.name: {{ default $.root.Release.Namespace $np.controller.namespace }}
    podSelector:
      matchLabels:
        {{- toYaml $np.activator.podLabels | nindent 8 }}
  {{- end }}
{{- end }}
{{- end -}}

{{- define "drain-router.inferencePoolName" -}}
{{- default (include "drain-router.fullname" .) .Values.inferencePool.name -}}
{{- end -}}


{{/* The front's checks. Call with (dict "root" $ "engine" $engine). */}}
{{- define "drain-router.validateFront" -}}
{{- $v := .root.Values -}}
{{- $f := $v.front -}}
{{- if $f.enabled -}}
{{- if not $v.modelService.enabled -}}
{{- fail "front.enabled needs modelService.enabled: the front reads its ModelService (--service) and asks it for a wake when no pod is ready" -}}
{{- end -}}
{{- if $v.inferencePool.enabled -}}
{{- fail "front.enabled with inferencePool.enabled: the front chooses the pod for each request (and the one a cut stream continues on), and so would the pool's endpoint picker; enable one of them" -}}
{{- end -}}
{{- if .engine.grpc.only -}}
{{- fail (printf "front.enabled with grpc.enabled: %s serves gRPC only then, and the front relays HTTP; the GRPCRoute goes to the model's Service without it" $v.modelServer.engine) -}}
{{- end -}}
{{- if eq (int $f.port) (int $f.adminPort) -}}
{{- fail (printf "front.port and front.adminPort are both %v: the front's admin listener (probes, /metrics) must have its own port" $f.port) -}}
{{- end -}}
{{- $drain := int $f.shutdownDrainSecs -}}
{{- $grace := int $f.terminationGracePeriodSeconds -}}
{{- if ge $drain $grace -}}
{{- fail (printf "front.shutdownDrainSecs (%d) must be below front.terminationGracePeriodSeconds (%d): the front aborts the streams it holds at grace - 2 s" $drain $grace) -}}
{{- end -}}
{{- $window := mul (int $f.readinessProbe.periodSeconds) (int $f.readinessProbe.failureThreshold) -}}
{{- if and (gt $drain 0) (le $drain (int $window)) -}}
{{- fail (printf "front.shutdownDrainSecs (%d) must be above the front's readiness probe window (front.readinessProbe.periodSeconds %v x failureThreshold %v = %d s): a draining front pod would close its listener while its Service still sends to it" $drain $f.readinessProbe.periodSeconds $f.readinessProbe.failureThreshold (int $window)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
