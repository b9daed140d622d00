# The triton-operator image: runs the operator (`triton-operator run`, the default) and the
# `fetch` init container of every Triton replica (`triton-operator fetch ...`).
#
#   docker build -t ghcr.io/triton-operator/triton-operator:0.1.0 .
#
# Runs as the non-root user 65532 with a read-only root filesystem: nothing is written at run
# time outside /tmp (an emptyDir in the chart) and the volumes the fetch step writes to.

FROM python:3.11.14-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/

# A virtualenv with this repository (built as a wheel) and its dependencies (s3:// and gs://
# sources for `fetch` included). The virtualenv has no pip: nothing installs at run time.
RUN python -m venv --without-pip /opt/venv \
 && python -m pip --python /opt/venv/bin/python install --no-cache-dir "/src[s3,gcs]"


FROM python:3.11.14-slim-bookworm

LABEL org.opencontainers.image.title="triton-operator" \
      org.opencontainers.image.description="Kubernetes operator for NVIDIA Triton Inference Server models" \
      org.opencontainers.image.licenses="Apache-2.0"

# The base image's own pip, setuptools and wheel are not needed at run time.
RUN python -m pip uninstall --no-cache-dir -y setuptools wheel pip

COPY --from=builder /opt/venv /opt/venv

ENV PATH="/opt/venv/bin:${PATH}" \
    VIRTUAL_ENV=/opt/venv \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp

WORKDIR /tmp
USER 65532:65532

# 8080: kopf liveness (/healthz); 8081: Prometheus metrics (/metrics).
EXPOSE 8080 8081

ENTRYPOINT ["triton-operator"]
CMD ["run"]
