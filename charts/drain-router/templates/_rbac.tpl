{{/*
The controller's namespaced rules: exactly the calls it makes, one rule per resource. API discovery
(/api, /apis/...) needs no rule (the default system:discovery role covers every authenticated user),
and kopf's namespace and CRD scanning is off, so no namespaces or customresourcedefinitions access.
tests/chart/test_rbac.py pins this list: broadening it fails the test on purpose.
*/}}
{{- define "drain-router.controllerRules" -}}
# Watch ModelServices; add/remove the finalizer and kopf's progress annotations (patch); delete one
# whose lifecycle rule DeleteSelf is due (its finalizer then runs the staged teardown).
- apiGroups: [drainrouter.dev]
  resources: [modelservices]
  verbs: [get, list, watch, patch, delete]
# The staged-deletion status, written before each action.
- apiGroups: [drainrouter.dev]
  resources: [modelservices/status]
  verbs: [get, patch]
# The events of the staged deletion (core v1 events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Count the service's pods (list); delete only for the opt-in force delete (grace 0, UID precondition).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, delete]
# Pod recycling: one Eviction at a time (UID precondition), so PodDisruptionBudgets are respected.
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# The workload's Service (Uninstalling stage).
- apiGroups: [""]
  resources: [services]
  verbs: [get, delete]
# The workload's Deployment: read for recycling's stability gate, deleted in the Uninstalling stage,
# patched (spec.replicas only) by the lifecycle rule ScaleToZero.
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, delete, patch]
# The route (RouteRemoving stage).
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, delete]
# Other kinds listed in a ModelService's spec.workload need get and delete here: add them with
# controller.rbac.extraRules.
{{- with .Values.controller.rbac.extraRules }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "drain-router.controllerClusterRules" -}}
# Is a stuck pod's node NotReady or gone? (cluster-scoped, read one by name)
- apiGroups: [""]
  resources: [nodes]
  verbs: [get]
{{- end -}}
