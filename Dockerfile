# syntax=docker/dockerfile:1.7
# The one image of mcp-epoch: the epoch service (`serve`, the default command) and the
# operator (`operator ...`) both run it; the Helm chart picks the command per Deployment.
#
#   docker build --build-arg VERSION=<the version in pyproject.toml> .
#   make image    # the same, daemonless, into dist/mcp-epoch-<version>.oci.tar
#
# Versions are pinned: the base image by its full Python and Debian version, and every Python
# dependency by uv.lock, the repository's one lock file (the development set-up installs from
# it too), exported with its hashes and installed with pip's --require-hashes.

FROM python:3.11.14-slim-trixie AS build
# uv only turns uv.lock into a hashed requirements list (offline); pip does the installing.
# Its version is the one uv.lock itself records (a test checks they agree).
ARG UV_VERSION=0.13.9
# The release version, passed by `make image` and the release workflow; it must be the one in
# pyproject.toml, the single source, so an image can never carry a label it was not built as.
ARG VERSION
WORKDIR /src
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip install --root-user-action=ignore "uv==${UV_VERSION}"
COPY pyproject.toml uv.lock README.md ./
COPY mcp_epoch ./mcp_epoch
COPY epochsvc ./epochsvc
COPY operator ./operator
RUN python -c 'import sys, tomllib; v = tomllib.load(open("pyproject.toml", "rb"))["project"]["version"]; \
sys.exit(None if sys.argv[1] == v else f"--build-arg VERSION={sys.argv[1]!r} but pyproject.toml says {v!r}")' "${VERSION}"
# Wheels for the project and every locked dependency; only these reach the final image.
RUN --mount=type=cache,target=/root/.cache/pip \
    uv export --frozen --no-dev --no-emit-project --no-header \
        --extra service --extra mcp --extra operator --output-file requirements.txt \
 && python -m pip wheel --wheel-dir /wheels --require-hashes --no-deps -r requirements.txt \
 && python -m pip wheel --wheel-dir /wheels --no-deps .

FROM python:3.11.14-slim-trixie
ARG VERSION
LABEL org.opencontainers.image.title="mcp-epoch" \
      org.opencontainers.image.description="Epoch-safe Last-Event-ID resumption for MCP servers on Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
# Installed from the wheels of the build stage only (no network, no compilers, no caches).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels \
        "mcp-epoch[service,mcp,operator]==${VERSION}" \
 && groupadd --system --gid 10001 mcp-epoch \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin mcp-epoch \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/mcp-epoch
# The SQLite ledger's directory (a PersistentVolumeClaim in the chart).
VOLUME ["/var/lib/mcp-epoch"]
ENV EPOCHSVC_DATABASE_URL=sqlite:////var/lib/mcp-epoch/ledger.db
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080 9443
ENTRYPOINT ["mcp-epoch"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
