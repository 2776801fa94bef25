#!/bin/sh
# Certificates for TLS to docker-compose.yml's NATS (deploy/compose/nats-tls.yml, or nats-mtls.yml for mutual
# TLS), made with openssl:
#
#   deploy/compose/nats-tls-certs.sh [DIR]        (DIR: NATS_TLS_DIR, default deploy/compose/nats-tls)
#
# writes into DIR
#   ca.pem, ca-key.pem          a CA of your own (kept when both exist: run again to renew the certificates
#                               without handing the services a new CA); ca-key.pem is mounted into no container
#   server.pem, server-key.pem  the nats service's certificate and key, signed by that CA, for the names the
#                               services dial: nats (the compose service), localhost and 127.0.0.1; more names in
#                               NATS_TLS_HOSTS (space-separated, e.g. NATS_TLS_HOSTS="nats.example.org 10.0.0.5")
#   SERVICE.pem, SERVICE-key.pem  a client certificate (CN=SERVICE, clientAuth) for each NATS client of the
#                               compose file: trigger-gateway, run-executor, human-interaction, agent-collab,
#                               journal, timers-migrate, tools (NATS_TLS_CLIENTS: another list); nats-mtls.yml mounts
#                               each service's own pair into its container only
# The CA's and the server's keys are mode 0600 (the nats container reads its key as root), the certificates 0644.
# The client keys are 0644 -- the services read them as their image's user (uid 10001), not as you -- inside DIR,
# which is made 0700: on this machine only you (and root) can reach them.
# The certificates are valid for 825 days (NATS_TLS_DAYS), the CA for 10 years.
set -eu

tls_script=nats-tls-certs
dir=${1:-${NATS_TLS_DIR:-$(dirname "$0")/nats-tls}}
days=${NATS_TLS_DAYS:-825}
hosts="nats localhost 127.0.0.1 ${NATS_TLS_HOSTS:-}"
clients=${NATS_TLS_CLIENTS:-trigger-gateway run-executor human-interaction agent-collab journal timers-migrate tools}
command -v openssl >/dev/null || { echo "$tls_script: openssl is needed" >&2; exit 1; }
for client in $clients; do  # each name becomes a file name: checked before anything is written
  case $client in
    server | ca | *[!a-z0-9-]*) echo "$tls_script: '$client' is not a client's name (a-z, 0-9, -)" >&2; exit 1 ;;
  esac
done
. "$(dirname "$0")/tls-lib.sh"
mkdir -p "$dir"
chmod 700 "$dir"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tls_ca "$dir" "Temporality NATS CA"
tls_issue "$dir" server nats serverAuth "$hosts"
for client in $clients; do
  tls_issue "$dir" "$client" "$client" clientAuth "" 644
done
