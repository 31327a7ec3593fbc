{{/* Names and labels. */}}
{{- define "orbitkv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "orbitkv.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "orbitkv.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "orbitkv.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "orbitkv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "orbitkv.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "orbitkv.labels" -}}
{{ include "orbitkv.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "orbitkv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "orbitkv.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "orbitkv.socket" -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.socketDir) .Values.socketName -}}
{{- end -}}

{{/* The probes reach the metrics listener on the node's loopback (hostNetwork). */}}
{{- define "orbitkv.probeHost" -}}
{{- if has .Values.metrics.host (list "0.0.0.0" "127.0.0.1" "") -}}
127.0.0.1
{{- else -}}
{{- .Values.metrics.host -}}
{{- end -}}
{{- end -}}

{{/* Flags the chart sets from structured values; values.flags may not name them. */}}
{{- define "orbitkv.ownedFlags" -}}
{{- list "data-dir" "socket" "metrics-addr" "cluster-addr" "cluster-advertise" "cluster-join" "cluster-key-file" "cluster-insecure" "peer-addr" "data-addr" "tls-cert" "tls-key" "tls-ca" | toJson -}}
{{- end -}}

{{/* The container's arguments: `orbitkv serve` and its flags, one per item. */}}
{{- define "orbitkv.args" -}}
{{- $owned := include "orbitkv.ownedFlags" . | fromJsonArray -}}
- serve
- --data-dir={{ .Values.dataDir.path }}
- --socket={{ include "orbitkv.socket" . }}
- --metrics-addr={{ printf "%s:%v" .Values.metrics.host .Values.metrics.port }}
{{- range $name, $value := .Values.flags }}
{{- if has $name $owned }}
{{- fail (printf "values.flags.%s: the chart sets --%s itself (see values.yaml)" $name $name) }}
{{- end }}
{{- if kindIs "float64" $value }}{{/* YAML numbers arrive as float64: print 1073741824, not 1.073741824e+09 */}}
- --{{ $name }}={{ int64 $value }}
{{- else if ne (toString $value) "" }}
- --{{ $name }}={{ $value }}
{{- end }}
{{- end }}
{{- if .Values.cluster.enabled }}
- --cluster-addr=0.0.0.0:{{ .Values.cluster.port }}
- --cluster-advertise=$(NODE_IP):{{ .Values.cluster.port }}
- --cluster-join={{ default (list (printf "%s.%s.svc.%s:%v" (include "orbitkv.fullname" .) .Release.Namespace .Values.cluster.domain .Values.cluster.port)) .Values.cluster.join | join "," }}
{{- if .Values.cluster.tlsSecret }}
- --tls-ca=/etc/orbitkv/cluster/ca.pem
- --tls-cert=/etc/orbitkv/cluster/peer.pem
- --tls-key=/etc/orbitkv/cluster/peer-key.pem
- --cluster-key-file=/etc/orbitkv/cluster/gossip.key
{{- else if .Values.cluster.insecure }}
- --cluster-insecure=true
{{- else }}
{{- fail "cluster.enabled needs cluster.tlsSecret (orbitkv pki init/issue) or cluster.insecure=true" }}
{{- end }}
{{- end }}
{{- range .Values.extraArgs }}
- {{ . }}
{{- end }}
{{- end -}}
