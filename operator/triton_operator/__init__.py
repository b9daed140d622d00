"""triton-operator: declarative NVIDIA Triton Inference Server models on Kubernetes."""

#: The one place the version is written: pyproject.toml reads it (`[tool.setuptools.dynamic]`), so the wheel's metadata,
#: the image tag below and the API client's user agent follow it. Helm cannot compute Chart.yaml, so the chart's
#: `version` and `appVersion` are written there too, by `make set-version` (tools/set_version.py), and
#: tests/test_version.py fails while they differ.
__version__ = "0.2.0"

#: Where the operator's image is published. The chart's values.yaml names the same repository (image.repository).
OPERATOR_IMAGE_REPOSITORY = "ghcr.io/triton-operator/triton-operator"
#: This release's own image: the operator's `fetch` init containers and `probe` sidecars run it unless `run
#: --operator-image` (the chart's TRITON_OPERATOR_IMAGE) names another.
DEFAULT_OPERATOR_IMAGE = f"{OPERATOR_IMAGE_REPOSITORY}:{__version__}"

#: What a TritonModel or TritonPool that names no spec.server.image runs, unless the operator's admin chose another
#: (`run --default-triton-image`, the chart's `tritonImage`): NGC's release that fixed NVIDIA's May 2026 Triton
#: bulletin (5828: CVE-2026-24207, an unauthenticated authentication bypass, and its companions) and, before it, the
#: August 2025 one (the shared-memory remote-code-execution chain, CVE-2025-23319/-23320/-23334, and the chunked-body
#: stack overflow, CVE-2025-23310/-23311). docs/security.md, "Which Triton to run".
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.03-py3"
#: The oldest NGC release (YY.MM) the operator supports: the one with every fix above (admission warns of older ones).
MINIMUM_TRITON_RELEASE = "26.03"
#: The CRD's default spec.server.image in 0.1.x (Triton 2.51, before every fix above). The API server stored it in
#: each object it defaulted, so such objects keep it (an upgrade of the operator moves no model to another Triton), and
#: a pooled model that carries it is not refused for it (its pool's image is what runs).
LEGACY_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
