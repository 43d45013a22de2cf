"""Loopback Kubernetes control plane built from Go modules (see README.md)."""
