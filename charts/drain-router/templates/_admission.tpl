{{/* The router's admission control, as YAML: limit (--max-concurrent-requests; 0: off, no flags),
size (--queue-size), timeout (--queue-timeout-secs) and from (where the limit came from:
"router.admission.maxConcurrentRequests", the engine's batch flag, or "" when off).

router.admission.maxConcurrentRequests null takes the engine's own batch limit when the engine's
arguments (modelServer.args) set its batch flag, so the number is stated once: vLLM
--max-num-seqs, SGLang --max-running-requests, TGI --max-concurrent-requests, llama.cpp
--parallel. No preset assumes a default for it: vLLM's depends on the GPU (256 on most, 1024 on
those with 70 GiB or more other than the A100, 128 on a CPU), SGLang derives it from the memory
left for the KV cache, TGI's 128 is where it starts refusing rather than its batch, and llama.cpp's
depends on its version; a router limit below the engine's real batch would cap its throughput, so
without the flag admission stays off. queueTimeoutSecs null: the router's own default, rendered so
the pod spec shows it: shutdownDrainSecs, at most 60 (60 when the drain is 0, no window to keep
it within), so admission on with its defaults never trips QUEUE_TIMEOUT_EXCEEDS_DRAIN. */}}
{{- define "drain-router.admission" -}}
{{- $a := .Values.router.admission -}}
{{- $engine := fromYaml (include "drain-router.engine" .) -}}
{{- $flags := dict "vllm" "--max-num-seqs" "sglang" "--max-running-requests" "tgi" "--max-concurrent-requests" "llamacpp" "--parallel" -}}
{{- $flag := get $flags .Values.modelServer.engine -}}
{{- $limit := 0 -}}
{{- $from := "" -}}
{{- if not (kindIs "invalid" $a.maxConcurrentRequests) -}}
{{- $limit = int $a.maxConcurrentRequests -}}
{{- $from = "router.admission.maxConcurrentRequests" -}}
{{- else if $flag -}}
{{- $args := $engine.args -}}
{{- range $i, $arg := $args -}}
{{- $text := toString $arg -}}
{{- $value := "" -}}
{{- if and (eq $text $flag) (lt (add1 $i) (len $args)) -}}
{{- $value = toString (index $args (add1 $i)) -}}
{{- else if hasPrefix (printf "%s=" $flag) $text -}}
{{- $value = trimPrefix (printf "%s=" $flag) $text -}}
{{- else -}}
{{- continue -}}
{{- end -}}
{{- if not (regexMatch "^[0-9]+$" $value) -}}
{{- fail (printf "modelServer.args: %s %q is not a whole number; router.admission.maxConcurrentRequests (null) takes the engine's batch limit from it" $flag $value) -}}
{{- end -}}
{{- $limit = int $value -}}
{{- $from = printf "modelServer.args %s" $flag -}}
{{- end -}}
{{- end -}}
{{- $timeout := $a.queueTimeoutSecs -}}
{{- if kindIs "invalid" $timeout -}}
{{- $drain := int .Values.shutdownDrainSecs -}}
{{- $timeout = ternary 60 (min 60 $drain) (eq $drain 0) -}}
{{- end -}}
limit: {{ $limit }}
size: {{ int $a.queueSize }}
timeout: {{ int $timeout }}
from: {{ $from | quote }}
{{- end -}}

{{/* The admission checks: the queue timeout against the drain window (the router's
QUEUE_TIMEOUT_EXCEEDS_DRAIN: the chart refuses what `drain-router check --strict` refuses; silent
with no drain window, 0, where SIGTERM closes at once whatever the timeout). */}}
{{- define "drain-router.validateAdmission" -}}
{{- $adm := fromYaml (include "drain-router.admission" .) -}}
{{- $drain := int .Values.shutdownDrainSecs -}}
{{- if and (gt (int $adm.limit) 0) (gt (int $adm.size) 0) (gt $drain 0) (gt (int $adm.timeout) $drain) -}}
{{- fail (printf "router.admission: queueTimeoutSecs (%d) is longer than shutdownDrainSecs (%d): at closing the router answers every request still queued with 503, so during each rollout clients would be turned away before their queue timeout. Lower router.admission.queueTimeoutSecs to at most %d (null does), raise shutdownDrainSecs, or set router.admission.queueSize 0 (no queue) or maxConcurrentRequests 0 (admission off; the limit came from %s)" (int $adm.timeout) $drain $drain $adm.from) -}}
{{- end -}}
{{- end -}}
