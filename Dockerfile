# syntax=docker/dockerfile:1
# One image for the five services; each container runs its own console script:
#   temporality-trigger-gateway | temporality-run-executor | temporality-human-interaction
#   temporality-agent-collab    | temporality-journal
# e.g. `docker run --rm temporality temporality-journal` (docker-compose.yml and the Helm chart set the command).

# --------------------------------------------------------------------------- build: resolve and install with uv
FROM python:3.11-slim AS build

RUN pip install --no-cache-dir uv==0.13.9

# Copy mode: the cache mount is another filesystem. The slim image's Python is the one to use.
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PYTHON=/usr/local/bin/python3.11

WORKDIR /app

# Dependencies first (only the lock file and the manifests), so a code change reuses this layer.
# Every workspace member's pyproject.toml is listed here (tests/test_deploy_files.py checks it).
COPY pyproject.toml uv.lock ./
COPY libs/protocol/pyproject.toml libs/protocol/pyproject.toml
COPY libs/bus/pyproject.toml libs/bus/pyproject.toml
COPY libs/embedded/pyproject.toml libs/embedded/pyproject.toml
COPY libs/testing/pyproject.toml libs/testing/pyproject.toml
COPY services/trigger-gateway/pyproject.toml services/trigger-gateway/pyproject.toml
COPY services/run-executor/pyproject.toml services/run-executor/pyproject.toml
COPY services/human-interaction/pyproject.toml services/human-interaction/pyproject.toml
COPY services/agent-collab/pyproject.toml services/agent-collab/pyproject.toml
COPY services/journal/pyproject.toml services/journal/pyproject.toml
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --all-packages --no-dev --no-install-workspace

# Then the workspace itself, installed as wheels (not editable) so the runtime stage needs only the venv.
COPY libs libs
COPY services services
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --frozen --all-packages --no-dev --no-editable

# --------------------------------------------------------------------------- runtime: the venv, a non-root user
FROM python:3.11-slim AS runtime

RUN groupadd --system --gid 10001 temporality \
    && useradd --system --uid 10001 --gid temporality --home-dir /app --shell /usr/sbin/nologin temporality \
    && install -d -o temporality -g temporality /app /app/config /app/.temporality

COPY --from=build --chown=root:root /app/.venv /app/.venv

ENV PATH="/app/.venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# Relative defaults (config/*.yaml, .temporality/journal.db) resolve under /app; mount config at /app/config.
WORKDIR /app
USER 10001:10001

# trigger-gateway 8080, human-interaction 8081, journal 8082 (each binds 127.0.0.1 unless *_HOST says otherwise).
EXPOSE 8080 8081 8082
CMD ["temporality-trigger-gateway"]
