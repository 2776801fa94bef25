# syntax=docker/dockerfile:1
# One target per service; each image holds only that service's workspace member and what it depends on
# (the shared libs and their third-party packages), and runs its console script:
#
#   docker build --target trigger-gateway   -t temporality-trigger-gateway .
#   docker build --target run-executor      -t temporality-run-executor .
#   docker build --target human-interaction -t temporality-human-interaction .
#   docker build --target agent-collab      -t temporality-agent-collab .
#   docker build --target journal           -t temporality-journal .
#
# and one for the operator's commands, the `temporality` CLI (`temporality dlq ...`, `nats-authorization`,
# `timers-migrate`; not `up`, which needs every service), no service in it:
#
#   docker build --target tools             -t temporality-tools .
#
# docker-compose.yml builds all of them (`docker compose build`; tools under its profile: `--profile tools`);
# always pass --target (without it, docker builds the last stage). The service targets are the services of
# temporality_protocol.catalog.SERVICES (tests/test_deploy_files.py checks it).

# --------------------------------------------------------------------------- uv: the lock file and every manifest
FROM python:3.11-slim AS uv

RUN pip install --no-cache-dir uv==0.13.9

# Copy mode: the cache mount is another filesystem. The slim image's Python is the one to use.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3.11

WORKDIR /app

# Only the lock file and the manifests, so the dependency layers below survive code changes. uv needs
# every workspace member's pyproject.toml to read the workspace (tests/test_deploy_files.py checks
# each one is listed), even those a service does not install.
COPY pyproject.toml uv.lock ./
COPY libs/protocol/pyproject.toml libs/protocol/pyproject.toml
COPY libs/bus/pyproject.toml libs/bus/pyproject.toml
COPY libs/service/pyproject.toml libs/service/pyproject.toml
COPY libs/embedded/pyproject.toml libs/embedded/pyproject.toml
COPY libs/testing/pyproject.toml libs/testing/pyproject.toml
COPY services/trigger-gateway/pyproject.toml services/trigger-gateway/pyproject.toml
COPY services/run-executor/pyproject.toml services/run-executor/pyproject.toml
COPY services/human-interaction/pyproject.toml services/human-interaction/pyproject.toml
COPY services/agent-collab/pyproject.toml services/agent-collab/pyproject.toml
COPY services/journal/pyproject.toml services/journal/pyproject.toml

# --------------------------------------------------------------------------- build-<service>: its venv
# Each: the service's third-party dependencies first (--no-install-workspace), then the shared libs and
# the service's own source, installed as wheels (--no-editable) so the image needs only the venv.

FROM uv AS build-trigger-gateway
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-trigger-gateway --no-install-workspace
COPY libs libs
COPY services/trigger-gateway services/trigger-gateway
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-trigger-gateway --no-editable

FROM uv AS build-run-executor
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-run-executor --no-install-workspace
COPY libs libs
COPY services/run-executor services/run-executor
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-run-executor --no-editable

FROM uv AS build-human-interaction
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-human-interaction --no-install-workspace
COPY libs libs
COPY services/human-interaction services/human-interaction
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-human-interaction --no-editable

FROM uv AS build-agent-collab
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-agent-collab --no-install-workspace
COPY libs libs
COPY services/agent-collab services/agent-collab
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-agent-collab --no-editable

FROM uv AS build-journal
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-journal --no-install-workspace
COPY libs libs
COPY services/journal services/journal
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-journal --no-editable

# The operator's CLI: temporality-embedded (the `temporality` console script) and the libs it needs, no service.
FROM uv AS build-tools
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-embedded --no-install-workspace
COPY libs libs
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --no-dev --package temporality-embedded --no-editable

# --------------------------------------------------------------------------- runtime: what every service image shares
FROM python:3.11-slim AS runtime

RUN groupadd --system --gid 10001 temporality \
    && useradd --system --uid 10001 --gid temporality --home-dir /app --shell /usr/sbin/nologin temporality \
    && install -d -o temporality -g temporality /app /app/config /app/.temporality

ENV PATH="/app/.venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Relative defaults (config/*.yaml, .temporality/journal.db) resolve under /app; mount config at /app/config.
WORKDIR /app
USER 10001:10001

# --------------------------------------------------------------------------- the service targets
# HTTP services bind 127.0.0.1 unless their *_HOST says otherwise (compose and the chart set 0.0.0.0).

FROM runtime AS trigger-gateway
COPY --from=build-trigger-gateway --chown=root:root /app/.venv /app/.venv
EXPOSE 8080
CMD ["temporality-trigger-gateway"]

FROM runtime AS run-executor
COPY --from=build-run-executor --chown=root:root /app/.venv /app/.venv
CMD ["temporality-run-executor"]

FROM runtime AS human-interaction
COPY --from=build-human-interaction --chown=root:root /app/.venv /app/.venv
EXPOSE 8081
CMD ["temporality-human-interaction"]

FROM runtime AS agent-collab
COPY --from=build-agent-collab --chown=root:root /app/.venv /app/.venv
CMD ["temporality-agent-collab"]

FROM runtime AS journal
COPY --from=build-journal --chown=root:root /app/.venv /app/.venv
EXPOSE 8082
CMD ["temporality-journal"]

# The operator's toolbox (docker-compose.yml's `tools` service, the chart's `tools.enabled`): run a command in it,
# e.g. `temporality dlq list` (docs/operations.md, "Dead letters"). It serves nothing; CMD prints the commands.
FROM runtime AS tools
COPY --from=build-tools --chown=root:root /app/.venv /app/.venv
CMD ["temporality", "--help"]
