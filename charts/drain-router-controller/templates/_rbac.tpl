{{/*
The controller's namespaced rules: exactly the calls it makes for the enabled features, one rule per
resource. API discovery (/api, /apis/...) needs no rule (the default system:discovery role covers
every authenticated user), and kopf's namespace and CRD scanning is off, so no namespaces or
customresourcedefinitions access. tests/chart/test_controller_rbac.py pins this list: broadening it
fails the test on purpose.
*/}}
{{- define "drain-router-controller.rules" -}}
{{- $f := .Values.features -}}
{{- $a := .Values.activator.enabled -}}
# Watch ModelServices; patch: the finalizer and kopf's progress annotations; delete (only with
# features.lifecycleRules): the rule DeleteSelf (its finalizer then runs the staged teardown).
- apiGroups: [drainrouter.dev]
  resources: [modelservices]
  verbs: [get, list, watch, patch{{ if $f.lifecycleRules }}, delete{{ end }}]
# The staged-deletion status, written before each action (a merge patch: never read through the
# subresource, the ModelService's own get carries its status).
- apiGroups: [drainrouter.dev]
  resources: [modelservices/status]
  verbs: [patch]
# The events of the staged deletion (core v1 events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Count the service's pods (list); delete only with features.forceDelete (grace 0, UID precondition).
- apiGroups: [""]
  resources: [pods]
  verbs: [list{{ if $f.forceDelete }}, delete{{ end }}]
{{- if $f.recycling }}
# Pod recycling: one Eviction at a time (UID precondition), so PodDisruptionBudgets are respected.
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
{{- end }}
# The workload's Service (Uninstalling stage).
- apiGroups: [""]
  resources: [services]
  verbs: [get, delete]
# The workload's Deployment: read for recycling's stability gate, deleted in the Uninstalling stage;
# patch (only with features.lifecycleRules): spec.replicas, by the lifecycle rule ScaleToZero.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, delete{{ if $f.lifecycleRules }}, patch{{ end }}]
# A selected pod is the service's only through a ReplicaSet of a Deployment it owns: read each
# ReplicaSet the pods name, by name (never listed, never written).
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [get]
{{- if $f.httpRoutes }}
# The route (RouteRemoving stage). Never patched: a sleeping service wakes through its Services'
# endpoints, the user's routes untouched.
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, delete]
{{- end }}
{{- if $f.grpcRoutes }}
# A GRPCRoute: the route itself (RouteRemoving), or the first workload object after the HTTPRoute.
- apiGroups: [gateway.networking.k8s.io]
  resources: [grpcroutes]
  verbs: [get, delete]
{{- end }}
{{- if $f.inferencePools }}
# An InferencePool: the route itself (RouteRemoving) or a workload object deleted after the route.
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, delete]
{{- end }}
{{- if $a }}
# With the activator: a sleeping service's activator EndpointSlices (one per Service it owns,
# labelled and owned by the ModelService): listed by label, created, their endpoints patched as the
# activator's pods change, deleted at the wake. Never the user's Services or routes.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, create, patch, delete]
# The NetworkPolicies the ModelService owns: their ingress peers are admitted to its activator ports.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list]
{{- end }}
{{- with .Values.rbac.extraRules }}
# rbac.extraRules
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "drain-router-controller.clusterRules" -}}
# Is a stuck pod's node NotReady or gone? (cluster-scoped, read one by name)
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- end -}}


{{/* The controller's rules in the activator's namespace (activator.enabled): its own objects there. */}}
{{- define "drain-router-controller.wakeRules" -}}
{{- $activator := include "drain-router-controller.activatorName" . -}}
# The activator's pods: the ready endpoints of its Service (listed by the service-name label).
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list]
# The activator's Service, for its selector (the NetworkPolicies select its pods by it).
- apiGroups: [""]
  resources: [services]
  resourceNames: [{{ $activator }}]
  verbs: [get]
# The port map (which port is which service's): read and merge-patched by name on the
# resourceVersion read; created once (create cannot be limited to a name).
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [{{ $activator }}-ports]
  verbs: [get, patch]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create]
# One NetworkPolicy per sleeping service, admitting the model's own clients to its activator ports;
# deleted when the ModelService goes.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch, delete]
{{- end -}}


{{/* The activator's rules: read a ModelService and its pods, and ask for a wake. */}}
{{- define "drain-router-controller.activatorRules" -}}
# The ModelService whose requests it holds: its podSelector, router ports and lifecycle status.
- apiGroups: [drainrouter.dev]
  resources: [modelservices]
  verbs: [get]
# Ask for a wake: status.lifecycle.wakeRequestedAt (a merge patch with a resourceVersion precondition).
- apiGroups: [drainrouter.dev]
  resources: [modelservices/status]
  verbs: [patch]
# Find the service's pods, whose routers it probes for readiness.
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- end -}}
