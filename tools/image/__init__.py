"""Daemonless image builds: ``make image`` and the chroot tooling the image tests run in.

No Docker engine runs here, so buildah and podman come from a Debian root filesystem made
with ``debootstrap`` and used through ``chroot`` (:mod:`tools.image.rootfs`,
:mod:`tools.image.chroot`); :mod:`tools.image.build` builds the repository's ``Dockerfile``
with them and writes an OCI archive under ``dist/``.
"""
