# syntax=docker/dockerfile:1
# One image for every agentledger service; the command chooses the service:
#   docker run IMAGE                                              -> admission (default)
#   docker run IMAGE python -m agentledger.services.relay         -> the relay
#   docker run IMAGE agentledger migrate                          -> apply migrations
# Services: ingress, planner, admission, relay, executor, reconciler, crm.

# ---------------------------------------------------------------- build: wheel into a venv
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/agentledger
WORKDIR /src
# Dependencies first, from the metadata alone, so a source change reuses this layer.
COPY pyproject.toml README.md ./
RUN mkdir -p libs/agentledger && touch libs/agentledger/__init__.py \
 && /opt/agentledger/bin/pip install . \
 && /opt/agentledger/bin/pip uninstall -y agentledger \
 && rm -rf build libs
# libs/agentledger/services is a link to ../../services: COPY keeps the link, and the
# services directory it points to is copied beside it, so the wheel holds both.
COPY libs ./libs
COPY services ./services
RUN /opt/agentledger/bin/pip wheel --no-deps -w /wheels . \
 && /opt/agentledger/bin/pip install --no-deps /wheels/agentledger-*.whl \
 && /opt/agentledger/bin/python -c "import agentledger.services.relay.app, agentledger.services.crm.app"

# ---------------------------------------------------------------- runtime
FROM python:3.11-slim
# A fixed numeric uid/gid so Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 agentledger \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin agentledger
COPY --from=build /opt/agentledger /opt/agentledger
# Migrations are not package data: the runner reads them from this directory.
COPY migrations /app/migrations
ENV PATH=/opt/agentledger/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    AGENTLEDGER_MIGRATIONS_DIR=/app/migrations
WORKDIR /app
USER 10001:10001
# ingress 8080, crm 8090 (they bind 127.0.0.1 unless *_HOST=0.0.0.0 is set, as deploy/ does)
EXPOSE 8080 8090
# SIGTERM is what every service handles for a graceful stop (drain, confirm, release).
STOPSIGNAL SIGTERM
CMD ["python", "-m", "agentledger.services.admission"]
