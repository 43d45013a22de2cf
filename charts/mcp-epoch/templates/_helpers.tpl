{{/*
Names, labels, images and the generated secrets shared by every template.
*/}}

{{/* The chart name, overridable; trimmed to a DNS label. */}}
{{- define "mcp-epoch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Prefix of every object name: <release>-<chart>, or just the release name when it already
contains the chart name. 52 characters leave room for the longest suffix ("-epoch-service").
*/}}
{{- define "mcp-epoch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "mcp-epoch.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mcp-epoch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; "component" is passed in by the caller. */}}
{{- define "mcp-epoch.labels" -}}
{{- $ctx := .ctx -}}
helm.sh/chart: {{ include "mcp-epoch.chart" $ctx }}
{{ include "mcp-epoch.selectorLabels" . }}
app.kubernetes.io/version: {{ $ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $ctx.Release.Service }}
app.kubernetes.io/part-of: mcp-epoch
{{- with $ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The stable subset used in selectors (never changes on upgrade). */}}
{{- define "mcp-epoch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mcp-epoch.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Object names. */}}
{{- define "mcp-epoch.operator.fullname" -}}
{{- printf "%s-operator" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.epochService.fullname" -}}
{{- printf "%s-epoch-service" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.webhook.fullname" -}}
{{- printf "%s-webhook" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.webhook.tlsSecretName" -}}
{{- printf "%s-webhook-tls" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.operatorTokenSecretName" -}}
{{- printf "%s-operator-token" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.replicaTokenSecretName" -}}
{{- default (printf "%s-replica-token" (include "mcp-epoch.fullname" .)) .Values.replicaTokenSecret.name -}}
{{- end -}}

{{- define "mcp-epoch.sqliteClaimName" -}}
{{- default (printf "%s-ledger" (include "mcp-epoch.fullname" .)) .Values.store.sqlite.persistence.existingClaim -}}
{{- end -}}

{{- define "mcp-epoch.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "mcp-epoch.operator.fullname" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "mcp-epoch.epochService.serviceAccountName" -}}
{{- if .Values.epochService.serviceAccount.create -}}
{{- default (include "mcp-epoch.epochService.fullname" .) .Values.epochService.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.epochService.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference: registry/repository, then @digest or :tag (default appVersion). */}}
{{- define "mcp-epoch.image" -}}
{{- $repo := .Values.image.repository -}}
{{- if .Values.image.registry -}}
{{- $repo = printf "%s/%s" .Values.image.registry .Values.image.repository -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* The `helm test` image: the chart's own image unless tests.image.repository is set. */}}
{{- define "mcp-epoch.testImage" -}}
{{- with .Values.tests.image -}}
{{- if .repository -}}
{{- $repo := ternary (printf "%s/%s" .registry .repository) .repository (ne .registry "") -}}
{{- printf "%s:%s" $repo (default $.Chart.AppVersion .tag) -}}
{{- else -}}
{{- include "mcp-epoch.image" $ -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* In-cluster URL of the epoch service (what the operator and MCP server pods dial). */}}
{{- define "mcp-epoch.epochService.url" -}}
{{- printf "http://%s.%s.svc:%d" (include "mcp-epoch.epochService.fullname" .) .Release.Namespace (int .Values.epochService.port) -}}
{{- end -}}

{{/* Namespaces the webhook never sees: kube-system, the release namespace, and the extras. */}}
{{- define "mcp-epoch.webhook.excludedNamespaces" -}}
{{- $all := concat (list "kube-system" .Release.Namespace) .Values.webhook.excludeNamespaces -}}
{{- toJson (sortAlpha (uniq $all)) -}}
{{- end -}}

{{/*
A token: the value given in values, else the one already stored in the chart's Secret (so
upgrades keep it), else 48 fresh random characters. Memoized in .Values._generated: every
template of one render sees the same value. Arguments: ctx, key (tokens.<key>), secret, field.
*/}}
{{- define "mcp-epoch.token" -}}
{{- $ctx := .ctx -}}
{{- $memo := include "mcp-epoch.memo" $ctx | fromJson -}}
{{- $slot := printf "token-%s" .key -}}
{{- if not (hasKey $ctx.Values._generated $slot) -}}
{{- $value := get $ctx.Values.tokens .key -}}
{{- if not $value -}}
{{- $existing := lookup "v1" "Secret" $ctx.Release.Namespace .secret -}}
{{- if and $existing (hasKey ($existing.data | default dict) .field) -}}
{{- $value = index $existing.data .field | b64dec -}}
{{- else -}}
{{- $value = randAlphaNum 48 -}}
{{- end -}}
{{- end -}}
{{- $_ := set $ctx.Values._generated $slot $value -}}
{{- end -}}
{{- get $ctx.Values._generated $slot -}}
{{- end -}}

{{/* Creates the shared memo map once per render (see mcp-epoch.token). */}}
{{- define "mcp-epoch.memo" -}}
{{- if not (hasKey .Values "_generated") -}}
{{- $_ := set .Values "_generated" dict -}}
{{- end -}}
{}
{{- end -}}

{{/*
The webhook's CA and serving certificate when cert-manager is not used: the ones already in
the TLS Secret (upgrades keep them, so the caBundle never changes under running pods), else a
new CA and a certificate for the webhook Service's DNS names. Returns JSON {crt, key, ca}.
*/}}
{{- define "mcp-epoch.webhook.generatedTLS" -}}
{{- $memo := include "mcp-epoch.memo" . | fromJson -}}
{{- if not (hasKey .Values._generated "webhookTLS") -}}
{{- $secretName := include "mcp-epoch.webhook.tlsSecretName" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $secretName -}}
{{- $tls := dict -}}
{{- if and $existing $existing.data (hasKey $existing.data "tls.crt") (hasKey $existing.data "tls.key") (hasKey $existing.data "ca.crt") -}}
{{- $tls = dict "crt" (index $existing.data "tls.crt") "key" (index $existing.data "tls.key") "ca" (index $existing.data "ca.crt") -}}
{{- else -}}
{{- $svc := include "mcp-epoch.webhook.fullname" . -}}
{{- $ns := .Release.Namespace -}}
{{- $days := int .Values.webhook.generatedCertificate.validityDays -}}
{{- $ca := genCA (printf "%s-ca" $svc) $days -}}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) -}}
{{- $cert := genSignedCert (printf "%s.%s.svc" $svc $ns) nil $names $days $ca -}}
{{- $tls = dict "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc) "ca" ($ca.Cert | b64enc) -}}
{{- end -}}
{{- $_ := set .Values._generated "webhookTLS" $tls -}}
{{- end -}}
{{- toJson .Values._generated.webhookTLS -}}
{{- end -}}

{{/* Refuse combinations that would break the ledger, with a message saying what to change. */}}
{{- define "mcp-epoch.validate" -}}
{{- if and (eq .Values.store.type "sqlite") (gt (int .Values.epochService.replicas) 1) -}}
{{- fail (printf "epochService.replicas=%d needs store.type=postgresql: a SQLite ledger is one file with exactly one writer (the service takes an exclusive lock on it). Keep epochService.replicas=1, or set store.type=postgresql and store.postgresql.existingSecret." (int .Values.epochService.replicas)) -}}
{{- end -}}
{{- if and (eq .Values.store.type "postgresql") (not .Values.store.postgresql.existingSecret) -}}
{{- fail "store.type=postgresql needs store.postgresql.existingSecret: the name of a Secret in the release namespace whose key store.postgresql.secretKey (default url) holds the DSN postgresql://user:password@host:5432/db" -}}
{{- end -}}
{{- end -}}

{{/* The operator's record of servers with epochs (its --servers-configmap). */}}
{{- define "mcp-epoch.operator.serversConfigMapName" -}}
{{- printf "%s-operator-servers" (include "mcp-epoch.fullname" .) -}}
{{- end -}}

{{- define "mcp-epoch.operator.admissionLeaseName" -}}
{{- printf "%s-operator-admission" (include "mcp-epoch.fullname" .) -}}
{{- end -}}
