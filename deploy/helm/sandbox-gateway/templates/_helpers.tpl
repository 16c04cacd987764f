{{/* The release's base name: the release name, or release-chart when it does not contain the chart's name. */}}
{{- define "sg.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sg.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Pod selector labels of one component (gateway or node). */}}
{{- define "sg.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "sg.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sg.fleetSecret" -}}
{{- .Values.secrets.existingFleetTokenSecret | default (printf "%s-fleet-token" (include "sg.fullname" .)) -}}
{{- end -}}

{{- define "sg.apiKeysSecret" -}}
{{- .Values.secrets.existingApiKeysSecret | default (printf "%s-api-keys" (include "sg.fullname" .)) -}}
{{- end -}}

{{- define "sg.envdSecret" -}}
{{- .Values.secrets.existingEnvdSecret | default (printf "%s-envd" (include "sg.fullname" .)) -}}
{{- end -}}

{{- define "sg.servingSecret" -}}
{{- if .Values.gateway.servingCert.certManager -}}
{{- printf "%s-serving-cert" (include "sg.fullname" .) -}}
{{- else -}}
{{- required "gateway.servingCert.secretName is required when gateway.servingCert.certManager is false" .Values.gateway.servingCert.secretName -}}
{{- end -}}
{{- end -}}

{{/*
A generated secret value that survives upgrades: the one already in the cluster, else `given`,
else a new random one. Arguments: root, secret name, key, given value.
*/}}
{{- define "sg.keptSecret" -}}
{{- $existing := lookup "v1" "Secret" .root.Release.Namespace .name -}}
{{- if .given -}}
{{- .given | b64enc -}}
{{- else if and $existing $existing.data (hasKey $existing.data .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum 48 | b64enc -}}
{{- end -}}
{{- end -}}
