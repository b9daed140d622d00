# The triton-operator image: runs the operator (`triton-operator run`, the default) and the
# `fetch` init container of every Triton replica (`triton-operator fetch ...`).
#
#   docker build -t ghcr.io/triton-operator/triton-operator:<version> .   (the version: operator/triton_operator/__init__.py)
#
# Runs as the non-root user 65532 with a read-only root filesystem: nothing is written at run
# time outside /tmp (an emptyDir in the chart) and the volumes the fetch step writes to.
#
# Build arguments (the defaults build from PyPI on the official Python image):
#   BASE          the image both stages start from: any Debian-like image with python3.11 and its
#                 venv module (the e2e tests use a Debian bookworm base of their own, see e2e/images.py).
#   PIP_NO_INDEX  1 = install offline, from the files in ./wheels only: those requirements.lock pins (e.g.
#                 `pip download --no-deps --require-hashes -r requirements.lock`) and wheels of the build
#                 requirements (`pip wheel setuptools wheel`).

ARG BASE=python:3.11.14-slim-bookworm

FROM ${BASE} AS builder

ARG PIP_NO_INDEX=0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_NO_INDEX=${PIP_NO_INDEX} \
    PIP_FIND_LINKS=/wheels \
    PYTHONDONTWRITEBYTECODE=1

# ./wheels is optional: the glob copies it when present and nothing otherwise.
COPY requirements.lock wheel[s] /wheels/
# Two virtualenvs: /opt/pip holds the pip that installs, /opt/venv (no pip) is what the image runs.
# The dependencies (s3:// and gs:// sources for `fetch` included) go in a layer of their own: a
# source change does not reinstall them. Exactly the lock, every file's hash checked, and nothing it
# does not pin (--no-deps): tritonclient's numpy, ml-dtypes and python-rapidjson serve its client,
# which the operator never loads (see requirements.lock).
RUN python -m venv /opt/pip \
 && python -m venv --without-pip /opt/venv \
 && /opt/pip/bin/pip --python /opt/venv/bin/python install --no-cache-dir --no-deps --require-hashes \
      -r /wheels/requirements.lock

# This repository, built as a wheel and installed beside them; --root /app keeps its files apart so
# that the image copies them as a layer of their own.
COPY pyproject.toml /src/
COPY operator/ /src/operator/
RUN /opt/pip/bin/pip --python /opt/venv/bin/python install --no-cache-dir --no-deps --root /app /src

FROM ${BASE}

LABEL org.opencontainers.image.title="triton-operator" \
      org.opencontainers.image.description="Kubernetes operator for NVIDIA Triton Inference Server models" \
      org.opencontainers.image.licenses="Apache-2.0"

# The base image's own pip, setuptools and wheel (if it has them) are not needed at run time. The run-time
# user gets a passwd entry: libraries ask who they are (getpass.getuser(), which kopf's identity uses, fails
# with "uid not found" without one).
RUN if python -m pip --version >/dev/null 2>&1; then python -m pip uninstall --no-cache-dir -y setuptools wheel pip; fi \
 && echo "nonroot:x:65532:65532:nonroot:/tmp:/usr/sbin/nologin" >> /etc/passwd \
 && echo "nonroot:x:65532:" >> /etc/group

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

# Last, so that a source change rebuilds only the last layer (files copied in stay root's, read-only).
COPY --from=builder /opt/venv /opt/venv
COPY --from=builder /app/ /
