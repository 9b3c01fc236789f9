{{/*
The controller's namespaced rules: exactly the calls it makes, one rule per resource. API discovery
(/api, /apis/...) needs no rule (the default system:discovery role covers every authenticated user),
and kopf's namespace and CRD scanning is off, so no namespaces or customresourcedefinitions access.
tests/chart/test_rbac.py pins this list: broadening it fails the test on purpose.
*/}}
{{- define "drain-router.controllerRules" -}}
# Watch ModelServices, add/remove the finalizer and kopf's progress annotations (patch); DeleteSelf
# lifecycle rule (delete).
- apiGroups: [drainrouter.dev]
  resources: [modelservices]
  verbs: [get, list, watch, patch, delete]
# The staged-deletion status, written before each action.
- apiGroups: [drainrouter.dev]
  resources: [modelservices/status]
  verbs: [get, patch]
# Setting finalizers where the OwnerReferencesPermissionEnforcement admission plugin is on.
- apiGroups: [drainrouter.dev]
  resources: [modelservices/finalizers]
  verbs: [update]
# The events of the staged deletion, recycling and lifecycle rules (core v1 events).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
# Count and watch the service's pods; delete only for the opt-in force delete (grace 0, UID precondition).
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, delete]
# Pod recycling goes through the Eviction API, so PodDisruptionBudgets are honoured.
- apiGroups: [""]
  resources: [pods/eviction]
  verbs: [create]
# The workload's Service (Uninstalling stage).
- apiGroups: [""]
  resources: [services]
  verbs: [get, delete]
# The workload's Deployment: stability checks before recycling (get, list), ScaleToZero (patch),
# Uninstalling (delete).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, patch, delete]
# The route (RouteRemoving stage).
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, delete]
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
