{{/*
Chart name, truncated to 63 characters (Kubernetes name limit).
*/}}
{{- define "temporality.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: <release>-<chart>, or the release name alone when it already contains the chart name.
At most 63 characters.
*/}}
{{- define "temporality.fullname" -}}
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

{{/*
Name of one service's resources: <fullname>-<service>, the prefix shortened so the service name always
survives the 63-character limit. Call with (dict "root" $ "name" "trigger-gateway").
*/}}
{{- define "temporality.componentName" -}}
{{- $prefix := include "temporality.fullname" .root | trunc (int (sub 62 (len .name))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix .name }}
{{- end }}

{{/*
Chart label value.
*/}}
{{- define "temporality.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Common labels.
*/}}
{{- define "temporality.labels" -}}
helm.sh/chart: {{ include "temporality.chart" . }}
{{ include "temporality.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: temporality
{{- end }}

{{/*
Selector labels.
*/}}
{{- define "temporality.selectorLabels" -}}
app.kubernetes.io/name: {{ include "temporality.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels and selector labels of one service. Call with (dict "root" $ "name" "journal").
*/}}
{{- define "temporality.componentLabels" -}}
{{ include "temporality.labels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{- define "temporality.componentSelectorLabels" -}}
{{ include "temporality.selectorLabels" .root }}
app.kubernetes.io/component: {{ .name }}
{{- end }}

{{/*
One service's image: services.<name>.image.repository, else <image.repository>-<name> (the Dockerfile's
target of that name); services.<name>.image.tag, else image.tag, else the chart's appVersion.
Call with (dict "root" $ "name" "journal").
*/}}
{{- define "temporality.image" -}}
{{- $svc := index .root.Values.services .name }}
{{- $image := default (dict) $svc.image }}
{{- $repository := default (printf "%s-%s" .root.Values.image.repository .name) $image.repository }}
{{- $tag := default (default .root.Chart.AppVersion .root.Values.image.tag) $image.tag }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/*
Secret holding the journal's database URL, and its key; empty name when neither postgres.url nor
postgres.existingSecret.name is set (the journal then uses SQLite in an emptyDir).
*/}}
{{- define "temporality.databaseSecretName" -}}
{{- if .Values.postgres.existingSecret.name }}
{{- .Values.postgres.existingSecret.name }}
{{- else if .Values.postgres.url }}
{{- include "temporality.componentName" (dict "root" . "name" "postgres") }}
{{- end }}
{{- end }}

{{- define "temporality.databaseSecretKey" -}}
{{- if .Values.postgres.existingSecret.name }}
{{- .Values.postgres.existingSecret.key }}
{{- else }}
{{- "database-url" }}
{{- end }}
{{- end }}

{{/*
Where the config files are mounted.
*/}}
{{- define "temporality.configDir" -}}
/app/config
{{- end }}

{{/*
The probes of a service's container, on its named port (call with "http" or "health"): started and alive
while /healthz answers (liveness only: a NATS outage must not restart every pod at once), ready (traffic,
rollouts) while /readyz answers 200 (NATS connected, every consumer and responder running, checks passing).
*/}}
{{- define "temporality.probes" -}}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  periodSeconds: 2
  failureThreshold: 60
readinessProbe:
  httpGet:
    path: /readyz
    port: {{ . }}
  periodSeconds: 5
  timeoutSeconds: 3
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ . }}
  periodSeconds: 10
  timeoutSeconds: 3
  failureThreshold: 6
{{- end }}

{{/*
The NATS URL every service connects to: the embedded NATS's client Service when nats.embedded.enabled,
else nats.url.
*/}}
{{- define "temporality.natsUrl" -}}
{{- if .Values.nats.embedded.enabled }}
{{- printf "nats://%s:4222" (include "temporality.componentName" (dict "root" . "name" "nats")) }}
{{- else }}
{{- .Values.nats.url }}
{{- end }}
{{- end }}

{{/*
Copies of every stream and bucket (TEMPORALITY_NATS_STREAM_REPLICAS): the embedded NATS's server count when
nats.embedded.enabled (1 or 3), else nats.streamReplicas.
*/}}
{{- define "temporality.natsStreamReplicas" -}}
{{- if .Values.nats.embedded.enabled }}
{{- .Values.nats.embedded.replicas }}
{{- else }}
{{- .Values.nats.streamReplicas }}
{{- end }}
{{- end }}

{{/*
The environment variable the embedded nats-server reads a service's password from, as in
files/nats-authorization.conf (temporality_embedded.natsserver.password_variable): RUN_EXECUTOR_PASSWORD.
Call with the service's name.
*/}}
{{- define "temporality.natsPasswordVariable" -}}
{{- printf "%s_PASSWORD" (. | upper | replace "-" "_") }}
{{- end }}

{{/*
The Secret holding the timers migration's NATS password (timersMigrate.existingSecret.key): timersMigrate.existingSecret.name,
else nats.auth.existingSecret (the services' Secret); empty when neither is set (no NATS users: no Job).
*/}}
{{- define "temporality.timersMigrateSecret" -}}
{{- .Values.timersMigrate.existingSecret.name | default .Values.nats.auth.existingSecret }}
{{- end }}

{{/*
The Secret holding the operator toolbox's NATS password (tools.existingSecret.key): tools.existingSecret.name, else
nats.auth.existingSecret (the services' Secret); empty when neither is set (no NATS users: no toolbox).
*/}}
{{- define "temporality.toolsSecret" -}}
{{- .Values.tools.existingSecret.name | default .Values.nats.auth.existingSecret }}
{{- end }}

{{/*
How the timers migration's Job and the toolbox log in to NATS, non-empty when they can: nats.auth.credsSecret (their
own `timers-migrate.creds`, `tools.creds`), else their password's Secret. Empty: no NATS users, neither is rendered.
*/}}
{{- define "temporality.timersMigrateLogin" -}}
{{- .Values.nats.auth.credsSecret | default (include "temporality.timersMigrateSecret" .) }}
{{- end }}

{{- define "temporality.toolsLogin" -}}
{{- .Values.nats.auth.credsSecret | default (include "temporality.toolsSecret" .) }}
{{- end }}

{{/*
NATS credentials files (nats.auth.credsSecret: a server in operator/JWT mode): one Secret, one key per client,
`<client>.creds` (trigger-gateway, run-executor, human-interaction, agent-collab, journal, timers-migrate, tools).
Each pod mounts only its own key, read-only and readable by the pod's user only, at
/etc/temporality/nats-creds/<client>.creds, named by TEMPORALITY_NATS_CREDS_FILE; it then gets no
TEMPORALITY_NATS_USER/_PASSWORD (the services refuse both at once). Call each with (dict "root" $ "name" <client>).
*/}}
{{- define "temporality.natsAuthCheck" -}}
{{- $auth := .Values.nats.auth }}
{{- if and $auth.credsSecret .Values.nats.embedded.enabled }}
{{- fail "nats.auth.credsSecret is for an external NATS in operator/JWT mode: the embedded NATS's users log in with the passwords of nats.auth.existingSecret" }}
{{- end }}
{{- if and $auth.credsSecret $auth.existingSecret }}
{{- fail "nats.auth.credsSecret and nats.auth.existingSecret are both set: the services log in with a credentials file or a password, not both; keep one" }}
{{- end }}
{{- end }}

{{- define "temporality.natsCredsEnv" -}}
- name: TEMPORALITY_NATS_CREDS_FILE
  value: /etc/temporality/nats-creds/{{ .name }}.creds
{{- end }}

{{- define "temporality.natsCredsMount" -}}
- name: nats-creds
  mountPath: /etc/temporality/nats-creds
  readOnly: true
{{- end }}

{{- define "temporality.natsCredsVolume" -}}
- name: nats-creds
  secret:
    secretName: {{ .root.Values.nats.auth.credsSecret }}
    defaultMode: 0400
    items:
      - key: {{ .name }}.creds
        path: {{ .name }}.creds
{{- end }}

{{/*
The timers migration's Job name: with the embedded NATS an ordinary Job, one per revision
(<fullname>-timers-migrate-<revision>: a Job's pod template is immutable); with an external NATS a hook,
<fullname>-timers-migrate (deleted before it is created again).
*/}}
{{- define "temporality.timersMigrateJobName" -}}
{{- $name := include "temporality.componentName" (dict "root" . "name" "timers-migrate") }}
{{- if .Values.nats.embedded.enabled }}
{{- printf "%s-%d" ($name | trunc 52 | trimSuffix "-") (int .Release.Revision) }}
{{- else }}
{{- $name }}
{{- end }}
{{- end }}

{{/*
The port of a URL (dict "url" "default"): its own (`host:port`), else its scheme's (https 443, http 80), else
"default" -- for the NetworkPolicies' egress to NATS, the OIDC provider and the tracing collector.
*/}}
{{- define "temporality.urlPort" -}}
{{- $url := urlParse (trim .url) -}}
{{- $port := regexFind ":[0-9]+$" $url.host -}}
{{- if $port -}}{{ trimPrefix ":" $port }}
{{- else if eq $url.scheme "https" -}}443
{{- else if eq $url.scheme "http" -}}80
{{- else -}}{{ .default }}
{{- end -}}
{{- end -}}

{{/*
TLS to NATS for one client of the chart (dict "root" $ "name" <service, timers-migrate or tools>), as JSON (read it with
fromJson): `ca`, the Secret whose `ca.crt` verifies the server ("": plain TCP); `caOnly`, mount only that key of
it (the embedded server's Secret holds the server's key); `cert`, the Secret with this client's `tls.crt` and
`tls.key` ("": no client certificate).
- The embedded NATS (nats.embedded.tls.existingSecret): its CA; with nats.embedded.tls.mutual, the client's own
  nats.tls.clientCertSecrets.<name> (required: "temporality.natsTlsCheck" names every one missing).
- An external NATS (nats.tls.existingSecret): its CA only (caOnly: a cert-manager Secret holds a tls.key too, which
  a client without mutual TLS has no use for); with nats.tls.mutual, the client's own
  nats.tls.clientCertSecrets.<name>, else the shared tls.crt/tls.key of nats.tls.existingSecret (as before
  per-client Secrets existed).
*/}}
{{- define "temporality.natsClientTls" -}}
{{- include "temporality.natsTlsCheck" .root }}
{{- $nats := .root.Values.nats }}
{{- $own := get ($nats.tls.clientCertSecrets | default dict) .name | default "" }}
{{- $ca := "" }}
{{- $cert := "" }}
{{- $caOnly := false }}
{{- if $nats.embedded.enabled }}
{{- $ca = $nats.embedded.tls.existingSecret }}
{{- $caOnly = true }}
{{- if and $ca $nats.embedded.tls.mutual }}
{{- $cert = required (printf "nats.embedded.tls.mutual: set nats.tls.clientCertSecrets.%s (the Secret with its client certificate)" .name) $own }}
{{- end }}
{{- else if $nats.tls.existingSecret }}
{{- $ca = $nats.tls.existingSecret }}
{{- $caOnly = true }}
{{- if $nats.tls.mutual }}
{{- $cert = $own | default $ca }}
{{- $caOnly = ne $cert $ca }}
{{- end }}
{{- end }}
{{- dict "ca" $ca "caOnly" $caOnly "cert" $cert | toJson }}
{{- end }}

{{/*
The nats-tls volume of a client's pod for "temporality.natsClientTls"'s answer (given as is): the CA's Secret
(only its `ca.crt` when caOnly) or, with a Secret of the client's own, both projected into one directory:
`ca.crt` from the CA's, `tls.crt` and `tls.key` from the client's (never another key of either). Readable by
the pod's user only. A Secret of both (the shared client certificate of an external NATS): those three keys of it.
*/}}
{{- define "temporality.natsTlsVolume" -}}
- name: nats-tls
{{- if and .cert .caOnly }}
  projected:
    defaultMode: 0400
    sources:
      - secret:
          name: {{ .ca }}
          items:
            - key: ca.crt
              path: ca.crt
      - secret:
          name: {{ .cert }}
          items:
            - key: tls.crt
              path: tls.crt
            - key: tls.key
              path: tls.key
{{- else }}
  secret:
    secretName: {{ .ca }}
    defaultMode: 0400
    items:
      - key: ca.crt
        path: ca.crt
      {{- if not .caOnly }}
      {{- /* the shared client certificate of nats.tls.existingSecret (mutual TLS) */}}
      - key: tls.crt
        path: tls.crt
      - key: tls.key
        path: tls.key
      {{- end }}
{{- end }}
{{- end }}

{{/*
The checks of TLS to NATS (by deployments.yaml and "temporality.natsClientTls", so whichever template Helm
renders first fails with the whole message): every
nats.tls.clientCertSecrets key names a NATS client of the chart, none is set without mutual TLS to the NATS the
services use, and with the embedded NATS's mutual TLS every client it renders has one.
*/}}
{{- define "temporality.natsTlsCheck" -}}
{{- $nats := .Values.nats }}
{{- $secrets := $nats.tls.clientCertSecrets | default dict }}
{{- $clients := concat (keys .Values.services | sortAlpha) (list "timers-migrate" "tools") }}
{{- range $client, $secret := $secrets }}
{{- if not (has $client $clients) }}
{{- fail (printf "nats.tls.clientCertSecrets.%s: not a NATS client of the chart (one of %s)" $client (join ", " $clients)) }}
{{- end }}
{{- end }}
{{- $given := list }}
{{- range $client, $secret := $secrets }}{{- if $secret }}{{- $given = append $given $client }}{{- end }}{{- end }}
{{- if $nats.embedded.enabled }}
{{- if $nats.tls.mutual }}
{{- fail "nats.tls.mutual is for an external NATS server: for the embedded one set nats.embedded.tls.mutual (its server then requires the client certificates)" }}
{{- end }}
{{- if and $nats.embedded.tls.mutual (not $nats.embedded.tls.existingSecret) }}
{{- fail "nats.embedded.tls.mutual needs nats.embedded.tls.existingSecret (the server's certificate and the CA the clients' certificates are signed by)" }}
{{- end }}
{{- if $nats.embedded.tls.mutual }}
{{- $missing := list }}
{{- range $service, $svc := .Values.services }}
{{- if and $svc.enabled (not (get $secrets $service)) }}{{- $missing = append $missing $service }}{{- end }}
{{- end }}
{{- if and .Values.timersMigrate.enabled (include "temporality.timersMigrateLogin" .) (not (get $secrets "timers-migrate")) }}
{{- $missing = append $missing "timers-migrate" }}
{{- end }}
{{- if and .Values.tools.enabled (not (get $secrets "tools")) }}
{{- $missing = append $missing "tools" }}
{{- end }}
{{- if $missing }}
{{- fail (printf "nats.embedded.tls.mutual: the server refuses a client without a certificate; set nats.tls.clientCertSecrets.<client> (a Secret with tls.crt and tls.key, signed by the CA of nats.embedded.tls.existingSecret) for %s" (join ", " $missing)) }}
{{- end }}
{{- else if $given }}
{{- fail (printf "nats.tls.clientCertSecrets (%s) needs mutual TLS: set nats.embedded.tls.mutual (with nats.embedded.tls.existingSecret)" (join ", " $given)) }}
{{- end }}
{{- else if and $given (not (and $nats.tls.existingSecret $nats.tls.mutual)) }}
{{- fail (printf "nats.tls.clientCertSecrets (%s) needs mutual TLS: set nats.tls.existingSecret (its ca.crt) and nats.tls.mutual" (join ", " $given)) }}
{{- end }}
{{- end }}

{{/*
Where a pod may run (dict "root" $ "name" <component> "own" <its values: services.<name>, nats.embedded, or an
empty dict> "affinity" <the chart's own affinity when neither the pod's nor the global one is set, optional>
"spread" <render topologySpreadConstraints, default true>): nodeSelector (global), and tolerations, affinity and
topologySpreadConstraints, each the pod's own when set, else the global one. A spread constraint without a
labelSelector gets the pod's component's selector labels (it counts the pods of its own Deployment).
*/}}
{{- define "temporality.scheduling" -}}
{{- $root := .root }}
{{- $own := .own | default dict }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($own.tolerations | default $root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with ($own.affinity | default $root.Values.affinity | default .affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if or (not (hasKey . "spread")) .spread }}
{{- $spread := list }}
{{- $selector := include "temporality.componentSelectorLabels" (dict "root" $root "name" .name) | fromYaml }}
{{- range ($own.topologySpreadConstraints | default $root.Values.topologySpreadConstraints) }}
{{- $constraint := deepCopy . }}
{{- if not $constraint.labelSelector }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $spread = append $spread $constraint }}
{{- end }}
{{- with $spread }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The pod securityContext of the services and the timers migration's Job: podSecurityContext (runAsNonRoot, the
image's user 10001, ...; a field set to null in your values is left out, e.g. runAsUser on OpenShift, which
assigns its own; absent altogether: the chart's defaults), and the seccomp profile given (dict "root" $ "seccompProfile" <profile or nil>), RuntimeDefault
unless set.
*/}}
{{- define "temporality.podSecurityContext" -}}
{{- $fixed := dict "runAsNonRoot" true "runAsUser" 10001 "runAsGroup" 10001 "fsGroup" 10001 }}
{{- /* the chart's defaults when the key is absent (`helm upgrade --reuse-values` of a release made before it) */ -}}
{{- $context := deepCopy (ternary .root.Values.podSecurityContext $fixed (hasKey .root.Values "podSecurityContext") | default dict) }}
{{- $_ := set $context "seccompProfile" (.seccompProfile | default (dict "type" "RuntimeDefault")) }}
{{- toYaml $context }}
{{- end }}
