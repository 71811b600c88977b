# asyncrl on CPU-only torch: the `asyncrl` command as entrypoint, run by a non-root user.
#
#   docker build -t asyncrl:0.1.0 --build-arg TORCH_INDEX_URL=<PyTorch's CPU wheel index> .
#   docker run --rm asyncrl:0.1.0 --help
#   docker run --rm asyncrl:0.1.0 worker --connect tcp://trainer:5555 --env CartPole-v1
#
# TORCH_INDEX_URL: the pip index of PyTorch's CPU-only wheels (docs/deploy.md says
# where to find it). Left empty, pip's own configuration decides, as scripts/setup.sh
# lets it; the build then stops if that gave torch a CUDA build.
# EXTRAS: the package's optional extras; "service,metrics,ray" for the KubeRay image (the
# ray extra is ray[default]: the dashboard and job submission KubeRay's RayJob uses).
# Probes: `asyncrl worker` and `asyncrl env-worker` serve /livez and /readyz on
# ASYNCRL_PROBE_PORT (8080 here); examples/service.py serves them on its --port.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
ARG EXTRAS="service,metrics"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# KubeRay's default probes of Ray pods call wget; nothing else needs a system package.
# (Debian's current wget: a pinned version would vanish from the archive.)
# hadolint ignore=DL3008
RUN case ",${EXTRAS}," in *,ray,*) \
        apt-get update && apt-get install -y --no-install-recommends wget \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac \
    && groupadd --gid 10001 asyncrl \
    && useradd --create-home --uid 10001 --gid 10001 asyncrl

WORKDIR /app

# torch first, pinned to the CPU build (as scripts/setup.sh does): the package's
# range (torch>=2.4,<2.14) is then satisfied and pulls nothing more.
# (hadolint cannot see the pin through the build argument.)
# hadolint ignore=DL3013
RUN pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md ./
COPY asyncrl ./asyncrl
COPY transports ./transports
COPY examples ./examples
COPY deploy/check_cpu_only.py ./deploy/check_cpu_only.py
# hadolint ignore=DL3013
RUN pip install ".[${EXTRAS}]" && python deploy/check_cpu_only.py

USER 10001:10001
ENV ASYNCRL_PROBE_PORT=8080 \
    ASYNCRL_PROBE_HOST=0.0.0.0
EXPOSE 5555 8080

# The same /livez a Kubernetes liveness probe asks, with the standard library only
# (no curl in a slim image; `asyncrl` itself would import torch for each check).
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('ASYNCRL_PROBE_PORT', '8080') + '/livez', timeout=5)"]

ENTRYPOINT ["asyncrl"]
CMD ["--help"]
