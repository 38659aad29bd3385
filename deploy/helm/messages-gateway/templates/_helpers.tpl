{{/* Names and labels, as `helm create` makes them. */}}
{{- define "messages-gateway.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "messages-gateway.fullname" -}}
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

{{- define "messages-gateway.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "messages-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "messages-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "messages-gateway.labels" -}}
helm.sh/chart: {{ include "messages-gateway.chart" . }}
{{ include "messages-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: gateway
{{- end }}

{{- define "messages-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "messages-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The fewest pods the Deployment runs, and the most. */}}
{{- define "messages-gateway.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ int .Values.autoscaling.minReplicas }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}
{{- define "messages-gateway.maxReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ int .Values.autoscaling.maxReplicas }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/* terminationGracePeriodSeconds: the preStop sleep + the drain + a 5 s margin, unless set. */}}
{{- define "messages-gateway.gracePeriod" -}}
{{- $s := .Values.server }}
{{- if kindIs "invalid" $s.terminationGracePeriodSeconds }}
{{- add (int $s.preStopSleepSeconds) (ceil $s.drainTimeoutSeconds | int) 5 }}
{{- else }}
{{- int $s.terminationGracePeriodSeconds }}
{{- end }}
{{- end }}

{{- define "messages-gateway.sqlitePvc" -}}
{{- if and (eq .Values.store.type "sqlite") .Values.store.sqlite.persistence.enabled }}
{{- default (printf "%s-data" (include "messages-gateway.fullname" .)) .Values.store.sqlite.persistence.existingClaim }}
{{- end }}
{{- end }}

{{/* store.url */}}
{{- define "messages-gateway.storeUrl" -}}
{{- if eq .Values.store.type "postgresql" }}
{{- $pg := .Values.store.postgresql }}
{{- printf "postgresql://%s@%s:%d/%s" $pg.user $pg.host (int $pg.port) $pg.database }}
{{- if $pg.sslmode }}?sslmode={{ $pg.sslmode }}{{ end }}
{{- else }}
{{- print "sqlite:////var/lib/messages-gateway/ledger.db" }}
{{- end }}
{{- end }}

{{/* limits.redis_url, or nothing */}}
{{- define "messages-gateway.redisUrl" -}}
{{- $r := .Values.limits.redis }}
{{- if $r.host }}
{{- $auth := "" }}
{{- if $r.existingSecret }}{{ $auth = printf "%s:${MESSAGES_GATEWAY_REDIS_PASSWORD}@" $r.username }}{{ end }}
{{- printf "%s://%s%s:%d/%d" (ternary "rediss" "redis" (eq $r.tls true)) $auth $r.host (int $r.port) (int $r.db) }}
{{- end }}
{{- end }}

{{/* The gateway's config: .Values.config with what the chart owns written in. */}}
{{- define "messages-gateway.config" -}}
{{- $c := deepCopy (.Values.config | default dict) }}
{{- $server := get $c "server" | default dict }}
{{- $server = merge (dict "host" "0.0.0.0" "port" 8080 "workers" (int .Values.server.workers) "drain_timeout_s" .Values.server.drainTimeoutSeconds) $server }}
{{- $_ := set $c "server" $server }}
{{- $store := get $c "store" | default dict }}
{{- $_ := set $store "url" (include "messages-gateway.storeUrl" .) }}
{{- $_ := set $c "store" $store }}
{{- $redis := include "messages-gateway.redisUrl" . }}
{{- if $redis }}
{{- $limits := get $c "limits" | default dict }}
{{- $_ := set $limits "redis_url" $redis }}
{{- $_ := set $c "limits" $limits }}
{{- end }}
{{- if .Values.admin.existingSecret }}
{{- $_ := set $c "admin" (dict "keys" (list "${MESSAGES_GATEWAY_ADMIN_KEY}")) }}
{{- end }}
{{- toYaml $c }}
{{- end }}

{{/*
What the chart refuses to render: a shape that would run wrong. Each message names the value to change.
*/}}
{{- define "messages-gateway.validate" -}}
{{- $v := .Values }}
{{- $cfg := $v.config | default dict }}
{{- $owned := dict "host" "fixed: 0.0.0.0" "port" "fixed: 8080 (service.port is the Service's)" "workers" "set server.workers" "drain_timeout_s" "set server.drainTimeoutSeconds" }}
{{- range $key, $instead := $owned }}
{{- if hasKey (get $cfg "server" | default dict) $key }}
{{- fail (printf "config.server.%s is the chart's: %s" $key $instead) }}
{{- end }}
{{- end }}
{{- if hasKey (get $cfg "store" | default dict) "url" }}
{{- fail "config.store.url is the chart's: set store.type (sqlite or postgresql) and store.postgresql.* instead" }}
{{- end }}
{{- if hasKey (get $cfg "limits" | default dict) "redis_url" }}
{{- fail "config.limits.redis_url is the chart's: set limits.redis.host (and existingSecret) instead" }}
{{- end }}
{{- if hasKey $cfg "admin" }}
{{- fail "config.admin is the chart's: set admin.existingSecret (the ServiceMonitor then sends the same key to /metrics)" }}
{{- end }}
{{- $max := include "messages-gateway.maxReplicas" . | int }}
{{- $min := include "messages-gateway.minReplicas" . | int }}
{{- if gt $max 1 }}
{{- if ne $v.store.type "postgresql" }}
{{- fail (printf "up to %d pods with store.type %s: each pod would keep its own ledger (and issued keys). Set store.type: postgresql (values-replicated.yaml), or run one pod" $max $v.store.type) }}
{{- end }}
{{- if not $v.limits.redis.host }}
{{- fail (printf "up to %d pods without limits.redis.host: each pod would count the rate limits and budgets on its own. Set limits.redis.host (values-replicated.yaml), or run one pod" $max) }}
{{- end }}
{{- end }}
{{- if and (gt (int $v.server.workers) 1) (get $cfg "limits") (not $v.limits.redis.host) }}
{{- fail (printf "server.workers %d with limits and no limits.redis.host: each worker would count the limits on its own (the gateway refuses to start so)" (int $v.server.workers)) }}
{{- end }}
{{- if eq $v.store.type "postgresql" }}
{{- if not $v.store.postgresql.host }}
{{- fail "store.type postgresql needs store.postgresql.host" }}
{{- end }}
{{- if not $v.store.postgresql.existingSecret }}
{{- fail "store.type postgresql needs store.postgresql.existingSecret (a Secret with the password; the chart holds no secret)" }}
{{- end }}
{{- end }}
{{- $grace := include "messages-gateway.gracePeriod" . | int }}
{{- $needed := addf $v.server.preStopSleepSeconds $v.server.drainTimeoutSeconds }}
{{- if le (float64 $grace) $needed }}
{{- fail (printf "server.terminationGracePeriodSeconds %d must exceed server.preStopSleepSeconds + server.drainTimeoutSeconds (%v s): the kubelet would kill streams still draining" $grace $needed) }}
{{- end }}
{{- if and $v.podDisruptionBudget.enabled (le $min (int $v.podDisruptionBudget.minAvailable)) }}
{{- fail (printf "podDisruptionBudget.minAvailable %d with %d pod(s) at the least: no pod could ever be evicted, and node drains would hang. Disable it for one pod, or run more" (int $v.podDisruptionBudget.minAvailable) $min) }}
{{- end }}
{{- if and $v.autoscaling.enabled (gt (int $v.autoscaling.minReplicas) (int $v.autoscaling.maxReplicas)) }}
{{- fail "autoscaling.minReplicas exceeds autoscaling.maxReplicas" }}
{{- end }}
{{- end }}
