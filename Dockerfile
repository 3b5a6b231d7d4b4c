# syntax=docker/dockerfile:1
# Flightdeck in a container: `docker build -t flightdeck .` then `docker compose up` (compose.yaml).
# Stage 1 builds Flightdeck's wheel and every dependency's; stage 2 installs them into a slim image
# with no compiler, no pip cache and no source tree, and runs as an unprivileged user.
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
WORKDIR /src
COPY pyproject.toml README.md wsgi.py gunicorn.conf.py ./
COPY controlplane/ controlplane/
COPY serving/ serving/
COPY alerts/ alerts/
COPY dashboards/ dashboards/
COPY runbooks/ runbooks/
COPY migrations/ migrations/
# NOTE: controlplane/gunicorn.conf.py is a link to ../gunicorn.conf.py; COPY keeps it a link, and the
# wheel gets the file's content. EXTRAS `cpu,postgres`: ONNX Runtime for the CPU and the PostgreSQL driver;
# `--build-arg EXTRAS=gpu,postgres` for onnxruntime-gpu (deploy/kubernetes/overlays/gpu).
ARG EXTRAS=cpu,postgres
# The documentation site, served under /docs: built here into controlplane/docs_site/ (package data), so the
# wheel carries it. Its reference pages are generated from the code, hence the install with the docs extra.
COPY mkdocs.yml SECURITY.md ARCHITECTURE.md ./
COPY docs/ docs/
COPY docsbuild/ docsbuild/
# DL3013 asks for pinned versions; "." is this source tree, its dependencies bounded in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[cpu,docs]" \
    && NO_MKDOCS_2_WARNING=1 python -m mkdocs build --strict --quiet \
    && pip wheel --no-cache-dir --wheel-dir /wheels ".[${EXTRAS}]"

FROM python:${PYTHON_VERSION}-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    FLIGHTDECK_HOME=/var/lib/flightdeck \
    FLIGHTDECK_HOST=0.0.0.0 \
    FLIGHTDECK_PORT=8000 \
    FLIGHTDECK_GRPC_PORT=8001 \
    FLIGHTDECK_DRAIN_GRACE_S=30
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl \
    && groupadd --system --gid 10001 flightdeck \
    && useradd --system --uid 10001 --gid flightdeck --home-dir /var/lib/flightdeck --create-home --shell /usr/sbin/nologin flightdeck
USER 10001:10001
WORKDIR /var/lib/flightdeck
# The database (SQLite unless FLIGHTDECK_DATABASE_URL names PostgreSQL), the registry, logs and secrets.
VOLUME ["/var/lib/flightdeck"]
# HTTP (console, APIs, /v2 REST, /metrics) and the inference protocol over gRPC (tritonclient.grpc, grpc.health.v1).
EXPOSE 8000 8001
# gunicorn's master drains on SIGTERM: workers stop admitting, finish what they accepted within
# FLIGHTDECK_DRAIN_GRACE_S, then exit. Give the container longer than that to stop, e.g.
# `docker run --stop-timeout 45` or compose's `stop_grace_period: 45s`, or the drain is cut short.
STOPSIGNAL SIGTERM
# Healthy means ready: 200 from /v2/health/ready (503 while starting, draining, or a model has no slot serving).
HEALTHCHECK --interval=10s --timeout=3s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/v2/health/ready' % os.environ.get('FLIGHTDECK_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["flightdeck"]
CMD ["serve"]
