#!/usr/bin/env bash
# System packages the test suite needs beyond Python, installed with apt when missing (needs
# root or sudo): PostgreSQL's server (the storage tests run a real one on loopback) and
# iproute2 (the end-to-end test makes the pod address range local with `ip route`, the image
# tests give containers network namespaces, and the robustness run partitions the epoch service
# from PostgreSQL in namespaces of its own); iptables (the image tests' stand-in for kube-proxy
# writes its Service rules with iptables-restore in the node's namespace, and the partition
# drops packets with it inside its namespace);
# debootstrap (`make image` makes its cached Debian root filesystems with it); valgrind (the
# guard benchmark counts instructions per call under callgrind, and its smoke test runs it).
set -euo pipefail
have_pg() { command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
missing=()
have_pg || missing+=(postgresql)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables-restore >/dev/null 2>&1 || [ -x /usr/sbin/iptables-restore ] || missing+=(iptables)
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || missing+=(debootstrap)
command -v callgrind_control >/dev/null 2>&1 || missing+=(valgrind)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (needed by the test suite)..." >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
