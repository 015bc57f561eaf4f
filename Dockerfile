# perftracker worker / sink image: `perftracker worker`, `perftracker sink`, `perftracker grafana push`.
# Build from the repository root:  docker build -t ghcr.io/perftracker/perftracker:0.1.0 .
# Stage 1 builds wheels (perftracker with the `server` extra: workers, sink, Grafana tooling,
# and their dependencies); stage 2 installs them into a slim runtime with no build tools and
# runs as an unprivileged user. Training images need only `pip install perftracker-ml`. No HEALTHCHECK: one
# image runs three roles, so compose and Kubernetes probe each role (docs/deploy.md).
#
# Base image: python 3.11 (the version CI tests) slim bookworm, pinned by tag and digest.
# To move to a newer patch release, set the tag and its digest together.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY collectors/ collectors/
COPY schemas/ schemas/
COPY streams/ streams/
COPY sinks/ sinks/
COPY grafana/ grafana/
COPY deploy/ deploy/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[server]"

FROM ${PYTHON_IMAGE} AS runtime
ARG PERFTRACKER_VERSION=0.1.0
LABEL org.opencontainers.image.title="perftracker" \
      org.opencontainers.image.description="perftracker stream workers, store sink and Grafana push" \
      org.opencontainers.image.version="${PERFTRACKER_VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PERFTRACKER_DATA_DIR=/var/lib/perftracker
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "perftracker-ml[server]==${PERFTRACKER_VERSION}" \
    && groupadd --system --gid 10001 perftracker \
    && useradd --system --uid 10001 --gid perftracker --no-create-home --shell /usr/sbin/nologin perftracker \
    && install -d -o perftracker -g perftracker -m 0750 /var/lib/perftracker
WORKDIR /var/lib/perftracker
USER 10001:10001
ENTRYPOINT ["perftracker"]
CMD ["--help"]
