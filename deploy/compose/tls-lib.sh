# shellcheck shell=sh
# The openssl steps deploy/compose/nats-tls-certs.sh and postgres-tls-certs.sh share: sourced, not run.
#   tls_ca DIR "CA NAME"                       ca.pem + ca-key.pem in DIR, kept when both exist
#   tls_issue DIR FILE CN USAGE [SAN [KEYMODE]]  FILE.pem + FILE-key.pem signed by DIR's CA; USAGE: serverAuth or
#                                              clientAuth; SAN: the space-separated host names and IPv4 addresses;
#                                              KEYMODE: the key's mode (default 600)
# They need $work (a private temporary directory, removed by the caller) and a umask of 077.

# prints the openssl log and fails: `... 2>"$work/log" || tls_failed`
tls_failed() {
  cat "$work/log" >&2
  exit 1
}

tls_ca() {
  if [ -f "$1/ca.pem" ] && [ -f "$1/ca-key.pem" ]; then
    echo "$tls_script: keeping the CA in $1/ca.pem"
    return 0
  fi
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 -days 3650 \
    -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -keyout "$1/ca-key.pem" -out "$1/ca.pem" 2>"$work/log" || tls_failed
  chmod 600 "$1/ca-key.pem"
  chmod 644 "$1/ca.pem"
  echo "$tls_script: made a CA: $1/ca.pem"
}

tls_issue() {
  san=""
  for host in ${5:-}; do
    case $host in
      *[!0-9.]*) entry="DNS:$host" ;;  # a name (an IPv6 address: give it as IP:... yourself, not supported here)
      *) entry="IP:$host" ;;
    esac
    san="${san:+$san,}$entry"
  done
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$4"
    [ -z "$san" ] || echo "subjectAltName=$san"
    echo "subjectKeyIdentifier=hash"
    echo "authorityKeyIdentifier=keyid:always"
  } >"$work/ext"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$3" \
    -keyout "$work/$2-key.pem" -out "$work/$2.csr" 2>"$work/log" || tls_failed
  openssl x509 -req -in "$work/$2.csr" -CA "$1/ca.pem" -CAkey "$1/ca-key.pem" \
    -set_serial "0x$(openssl rand -hex 16)" -sha256 -days "$days" -extfile "$work/ext" \
    -out "$work/$2.pem" 2>"$work/log" || tls_failed
  chmod 644 "$work/$2.pem"
  chmod "${6:-600}" "$work/$2-key.pem"
  # the new pair replaces the old one file by file (a reader never sees a half-written file)
  mv "$work/$2-key.pem" "$1/$2-key.pem"
  mv "$work/$2.pem" "$1/$2.pem"
  echo "$tls_script: made $1/$2.pem (CN=$3${san:+, $san})"
}
