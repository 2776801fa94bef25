#!/bin/sh
# Certificates for TLS to docker-compose.yml's PostgreSQL (deploy/compose/postgres-tls.yml), made with openssl:
#
#   deploy/compose/postgres-tls-certs.sh [DIR]    (DIR: POSTGRES_TLS_DIR, default deploy/compose/postgres-tls)
#
# writes into DIR
#   ca.pem, ca-key.pem          a CA of your own (kept when both exist: run again to renew the server's certificate
#                               without handing the journal a new CA); ca-key.pem is mounted into no container
#   server.pem, server-key.pem  the postgres service's certificate and key, signed by that CA, for the names the
#                               journal dials: postgres (the compose service), localhost and 127.0.0.1; more names
#                               in POSTGRES_TLS_HOSTS (space-separated, e.g. POSTGRES_TLS_HOSTS="db.example.org")
# Keys are mode 0600 (the postgres container copies its key as root, for its own user), certificates 0644, DIR 0700.
# The server certificate is valid for 825 days (POSTGRES_TLS_DAYS), the CA for 10 years.
set -eu

tls_script=postgres-tls-certs
dir=${1:-${POSTGRES_TLS_DIR:-$(dirname "$0")/postgres-tls}}
days=${POSTGRES_TLS_DAYS:-825}
hosts="postgres localhost 127.0.0.1 ${POSTGRES_TLS_HOSTS:-}"
command -v openssl >/dev/null || { echo "$tls_script: openssl is needed" >&2; exit 1; }
. "$(dirname "$0")/tls-lib.sh"
mkdir -p "$dir"
chmod 700 "$dir"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

tls_ca "$dir" "Temporality PostgreSQL CA"
tls_issue "$dir" server postgres serverAuth "$hosts"
