{{/* Names, labels and the image reference shared by every template. */}}

{{- define "triton-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "triton-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "triton-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "triton-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "triton-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "triton-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "triton-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "triton-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator's own image: it also becomes the `fetch` init container of every Triton replica. */}}
{{- define "triton-operator.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs, the same in a ClusterRole (cluster-wide) and in each namespace's
Role. Every rule maps to a call in operator/triton_operator/ (platform/kube.py, controller/operator.py)
or to kopf itself; see the chart README for the reason of each.
*/}}
{{- define "triton-operator.rules" -}}
# TritonModels: kopf lists and watches them; the admission webhook lists a namespace's TritonModels
# live for each review (an ensemble's steps and the ensembles using a step; never the watch cache).
# GET: reads of one object. Event handlers only (no kopf timers, daemons or change handlers), so kopf
# writes no finalizer or annotation onto them: no patch.
- apiGroups: ["serving.triton-operator.dev"]
  resources: ["tritonmodels"]
  verbs: ["get", "list", "watch"]
# Status: conditions, counts and the selector, written with a merge patch.
- apiGroups: ["serving.triton-operator.dev"]
  resources: ["tritonmodels/status"]
  verbs: ["patch"]
# TritonPools (issue 29): watched and read like TritonModels; the webhook reads the one a pooled model names.
- apiGroups: ["serving.triton-operator.dev"]
  resources: ["tritonpools"]
  verbs: ["get", "list", "watch"]
# A pool's status: its replicas' models, capacity used and free, conditions.
- apiGroups: ["serving.triton-operator.dev"]
  resources: ["tritonpools/status"]
  verbs: ["patch"]
# A pooled model's EndpointSlices (its Service has no selector): only the pool replicas where the model is READY at
# the desired config and warm are ready endpoints. Written, and deleted when the model leaves the pool.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The Endpoints Kubernetes' endpoints controller wrote for a model's Service while it had a selector: read (listed
# once per namespace after a restart) and deleted once the model is on a pool (its Service has none), or the
# EndpointSliceMirroring controller mirrors its old addresses into a slice kube-proxy reads (issue 41). The admission
# policy allows only that delete.
- apiGroups: [""]
  resources: ["endpoints"]
  verbs: ["get", "list", "delete"]
# Children: watched (kopf), read when not cached yet (GET), written with server-side apply
# (PATCH; an apply that creates the object is also authorized as `create`).
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Repository ConfigMaps also: immutable and named by content, each deleted once no ReplicaSet uses it.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Deleted only when a TritonModel moves onto a TritonPool (issue 29): its own replicas go, the pool's serve it.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# The Deployments' ReplicaSets: listed (their pod templates) to find the repository ConfigMaps still in use.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list"]
# PodDisruptionBudgets also: deleted when a TritonModel scales down to one replica.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# HorizontalPodAutoscalers of spec.autoscaling: applied like the other children, deleted when it is unset.
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Triton pods: watched for the warm-up gate and the replica counts; their annotations patched for in-place
# rollouts (which config a replica is to load, which it has loaded, a reload that failed); deleted when a replica
# that stopped serving cannot be healed in place (its ReplicaSet replaces it; controller/gate.py).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# The warm-up readiness gate: one pod condition, patched on the status subresource.
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Events on TritonModels when a condition flips (core/v1 Events, POST).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Each model's repository key Secret: created once (immutable, named by a digest of its content), never read,
# listed, watched, updated or deleted. The operator derives the key from its master key instead of reading it back.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
{{- end }}

{{/* Whether the operator serves TLS (the admission webhook, the custom metrics API, or both): one Service,
     one certificate, one port. */}}
{{- define "triton-operator.servesTLS" -}}
{{- if and (or .Values.webhook.enabled .Values.customMetrics.enabled) (gt (int .Values.replicaCount) 0) }}true{{ end }}
{{- end }}

{{/*
Refuses to register the custom metrics API over another server's. The HPA controller asks every custom metric of
the group's preferred version, and ours (v1beta2 at versionPriority 200) would outrank prometheus-adapter's v1beta1
(100): every HPA already reading that adapter's metrics would be asked of the operator. So when Helm's `lookup` finds
an APIService of custom.metrics.k8s.io (any version) whose Service is not this release's, the render fails with one
message. `lookup` sees the cluster only in `helm install`/`upgrade` (and --dry-run=server): `helm template`, and so
Argo CD, gets nothing back and cannot check (chart README, "Autoscaling").
*/}}
{{- define "triton-operator.refuseCustomMetricsTakeover" -}}
{{- $ctx := .context }}
{{- $others := list }}
{{- range (lookup "apiregistration.k8s.io/v1" "APIService" "" "").items | default list }}
{{- if eq (.spec.group | default "") "custom.metrics.k8s.io" }}
{{- $svc := .spec.service | default dict }}
{{- if not (and (eq ($svc.namespace | default "") $ctx.Release.Namespace) (eq ($svc.name | default "") $.service)) }}
{{- $others = append $others (printf "%s (Service %s/%s)" .metadata.name ($svc.namespace | default "-") ($svc.name | default "-")) }}
{{- end }}
{{- end }}
{{- end }}
{{- if $others }}
{{- fail (printf "customMetrics.enabled: custom.metrics.k8s.io is already served by another server: APIService %s. Registering this chart's v1beta2 would take that API over: every HorizontalPodAutoscaler on its metrics would be asked of triton-operator instead. Keep customMetrics.enabled=false and serve Triton's metrics through that server (chart README, \"Autoscaling\": prometheus-adapter rules), or remove its APIService first." (join ", " $others)) }}
{{- end }}
{{- end }}

{{/*
The repository master key (base64, as the Secret's data holds it) of the chart's own Secret: the one in the cluster
(`lookup`, so an upgrade keeps it), else 64 new random characters. Worked out once per render and kept in .Values, so
that the Secret and the Deployment's checksum annotation agree (each template calls this).
*/}}
{{- define "triton-operator.repositoryKey" -}}
{{- if not (hasKey .Values "_repositoryKeyData") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (printf "%s-repository-key" (include "triton-operator.fullname" .)) }}
{{- $data := "" }}
{{- if and $existing (index ($existing.data | default dict) "key") }}
{{- $data = index $existing.data "key" }}
{{- else }}
{{- $data = randAlphaNum 64 | b64enc }}
{{- end }}
{{- $_ := set .Values "_repositoryKeyData" $data }}
{{- end }}
{{- index .Values "_repositoryKeyData" }}
{{- end }}

{{/* The Secret the operator reads the repository master key from. */}}
{{- define "triton-operator.repositoryKeySecret" -}}
{{- .Values.repositoryKey.existingSecret | default (printf "%s-repository-key" (include "triton-operator.fullname" .)) }}
{{- end }}

{{/*
The peers the NetworkPolicy admits to the TLS port: networkPolicy.apiServer.from when set; else the API server's own
addresses, those of the `kubernetes` Service's endpoints (EndpointSlices in `default`, read with Helm's `lookup`), one
ipBlock each; else (nothing found: `helm template` and Argo CD render without the cluster) an empty list, which
admits every source. A YAML list.
*/}}
{{- define "triton-operator.apiServerPeers" -}}
{{- $peers := list }}
{{- if .Values.networkPolicy.apiServer.from }}
{{- $peers = .Values.networkPolicy.apiServer.from }}
{{- else }}
{{- range (lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "").items | default list }}
{{- if eq (index (.metadata.labels | default dict) "kubernetes.io/service-name" | default "") "kubernetes" }}
{{- range .endpoints | default list }}
{{- range .addresses | default list }}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" (printf "%s/%s" . (ternary "128" "32" (contains ":" .))))) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- toYaml $peers }}
{{- end }}

{{/* What a TritonModel or TritonPool without spec.server.image runs: the operator's --default-triton-image. */}}
{{- define "triton-operator.defaultTritonImage" -}}
{{ .Values.tritonImage }}
{{- end }}

{{/* A policy binding's matchResources: the namespaces the release serves, as the webhook's namespaceSelector says
     (webhook.namespaceSelector, else watch.namespaces, else every namespace). */}}
{{- define "triton-operator.servedNamespaces" -}}
{{- if .Values.webhook.namespaceSelector }}
matchResources:
  namespaceSelector:
    {{- toYaml .Values.webhook.namespaceSelector | nindent 4 }}
{{- else if .Values.watch.namespaces }}
matchResources:
  namespaceSelector:
    matchExpressions:
      - key: kubernetes.io/metadata.name
        operator: In
        values:
          {{- range (sortAlpha .Values.watch.namespaces) }}
          - {{ . }}
          {{- end }}
{{- end }}
{{- end }}

{{/*
A CEL expression over a container `c`: whether its image is from a registry (or repository prefix) of
admissionPolicies.tritonModels.allowedImageRegistries, as spec.server.image must be (true when none is set). An image
without a registry is docker.io's (docker.io/library/ for a bare name).
*/}}
{{- define "triton-operator.allowedTritonImage" -}}
{{- $allowed := .Values.admissionPolicies.tritonModels.allowedImageRegistries -}}
{{- if and .Values.admissionPolicies.tritonModels.enabled $allowed -}}
[(c.image.contains('/') && (c.image.split('/')[0].contains('.') || c.image.split('/')[0].contains(':') || c.image.split('/')[0] == 'localhost')) ? c.image : (c.image.contains('/') ? 'docker.io/' + c.image : 'docker.io/library/' + c.image)].exists(ref, {{ toJson $allowed }}.exists(r, ref.startsWith(r + '/') || ref.startsWith(r + ':') || ref.startsWith(r + '@')))
{{- else -}}
true
{{- end -}}
{{- end }}
