# syntax=docker/dockerfile:1.7
# The one image of mcp-epoch: the epoch service (`serve`, the default command) and the
# operator (`operator ...`) both run it; the Helm chart picks the command per Deployment.
#
#   docker build -t mcp-epoch:0.1.0 .
#
# Versions are pinned: the base image by its full Python and Debian version, every Python
# dependency of the service, operator and mcp extras by a constraints file (kept below, in
# sync with the versions the test suite runs against).

FROM python:3.11.14-slim-trixie AS build
WORKDIR /src
COPY <<CONSTRAINTS /src/constraints.txt
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.19.post1
cffi==2.1.1
click==8.5.1
cryptography==50.0.2
fastapi==0.165.0
frozenlist==1.8.0
h11==0.16.0
httpcore==1.0.9
httpcore2==2.16.2
httptools==0.9.0
httpx==0.28.1
httpx2==2.16.2
idna==3.20
iso8601==2.1.0
jsonpatch==1.48
jsonpointer==3.12
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
kopf==1.45.2
mcp==2.3.0
mcp-types==2.3.0
multidict==7.2.1
opentelemetry-api==1.45.2
prometheus_client==0.26.0
propcache==0.5.4
psycopg==3.3.9
psycopg-binary==3.3.9
pycparser==3.12
pydantic==2.14.4
pydantic_core==2.50.5
pydantic-settings==2.16.3
PyJWT==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.4
referencing==0.37.0
rpds-py==2026.9.1
SQLAlchemy==2.1.9
sse-starlette==3.7.0
starlette==1.10.0
truststore==0.10.5
typing_extensions==4.16.0
typing-inspection==0.4.5
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
yarl==1.25.1
CONSTRAINTS
COPY pyproject.toml README.md ./
COPY mcp_epoch ./mcp_epoch
COPY epochsvc ./epochsvc
COPY operator ./operator
# Wheels for the project and every dependency; only these reach the final image.
RUN --mount=type=cache,target=/root/.cache/pip \
    python -m pip wheel --wheel-dir /wheels --constraint constraints.txt \
        ".[service,mcp,operator]"

FROM python:3.11.14-slim-trixie
LABEL org.opencontainers.image.title="mcp-epoch" \
      org.opencontainers.image.description="Epoch-safe Last-Event-ID resumption for MCP servers on Kubernetes" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
# Installed from the wheels of the build stage only (no network, no compilers, no caches).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links=/wheels \
        "mcp-epoch[service,mcp,operator]==0.1.0" \
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
