#!/usr/bin/env bash
# System packages the test suite needs beyond Python: PostgreSQL's server (the storage tests
# run a real one on loopback). Installs them with apt when missing; needs root or sudo.
set -euo pipefail
have_pg() { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
if ! have_pg; then
  echo "installing PostgreSQL (needed by the storage tests)..." >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq postgresql >/dev/null
fi
