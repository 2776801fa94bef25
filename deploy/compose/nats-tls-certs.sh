#!/bin/sh
# Certificates for TLS to docker-compose.yml's NATS (deploy/compose/nats-tls.yml), made with openssl:
#
#   deploy/compose/nats-tls-certs.sh [DIR]        (DIR: NATS_TLS_DIR, default deploy/compose/nats-tls)
#
# writes into DIR
#   ca.pem, ca-key.pem          a CA of your own (kept when both exist: run again to renew the server's certificate
#                               without handing the services a new CA); ca-key.pem is mounted into no container
#   server.pem, server-key.pem  the nats service's certificate and key, signed by that CA, for the names the
#                               services dial: nats (the compose service), localhost and 127.0.0.1; more names in
#                               NATS_TLS_HOSTS (space-separated, e.g. NATS_TLS_HOSTS="nats.example.org 10.0.0.5")
# Keys are mode 0600 (the nats container reads its key as root), certificates 0644 (the services' user reads ca.pem).
# The server certificate is valid for 825 days (NATS_TLS_DAYS), the CA for 10 years.
set -eu

dir=${1:-${NATS_TLS_DIR:-$(dirname "$0")/nats-tls}}
days=${NATS_TLS_DAYS:-825}
hosts="nats localhost 127.0.0.1 ${NATS_TLS_HOSTS:-}"
command -v openssl >/dev/null || { echo "nats-tls-certs: openssl is needed" >&2; exit 1; }
mkdir -p "$dir"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ -f "$dir/ca.pem" ] && [ -f "$dir/ca-key.pem" ]; then
  echo "nats-tls-certs: keeping the CA in $dir/ca.pem"
else
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 -days 3650 \
    -subj "/CN=Temporality NATS CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
  echo "nats-tls-certs: made a CA: $dir/ca.pem"
fi

san=""
for host in $hosts; do
  case $host in
    *[!0-9.]*) entry="DNS:$host" ;;  # a name (an IPv6 address: give it as IP:... yourself, not supported here)
    *) entry="IP:$host" ;;
  esac
  san="${san:+$san,}$entry"
done
cat >"$work/ext" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid:always
EXT
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=nats" \
  -keyout "$work/server-key.pem" -out "$work/server.csr" 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
openssl x509 -req -in "$work/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
  -set_serial "0x$(openssl rand -hex 16)" -sha256 -days "$days" -extfile "$work/ext" \
  -out "$work/server.pem" 2>"$work/log" || { cat "$work/log" >&2; exit 1; }
mv "$work/server-key.pem" "$dir/server-key.pem"
mv "$work/server.pem" "$dir/server.pem"
chmod 600 "$dir/ca-key.pem" "$dir/server-key.pem"
chmod 644 "$dir/ca.pem" "$dir/server.pem"
echo "nats-tls-certs: made $dir/server.pem for $san"
