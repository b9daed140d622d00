"""triton-operator: declarative NVIDIA Triton Inference Server models on Kubernetes."""

__version__ = "0.1.0"

#: What a TritonModel or TritonPool that names no spec.server.image runs, unless the operator's admin chose another
#: (`run --default-triton-image`, the chart's `tritonImage`): NGC's release that fixed NVIDIA's May 2026 Triton
#: bulletin (5828: CVE-2026-24207, an unauthenticated authentication bypass, and its companions) and, before it, the
#: August 2025 one (the shared-memory remote-code-execution chain, CVE-2025-23319/-23320/-23334, and the chunked-body
#: stack overflow, CVE-2025-23310/-23311). README "Which Triton to run".
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:26.03-py3"
#: The oldest NGC release (YY.MM) the operator supports: the one with every fix above (admission warns of older ones).
MINIMUM_TRITON_RELEASE = "26.03"
#: The CRD's default spec.server.image in 0.1.x (Triton 2.51, before every fix above). The API server stored it in
#: each object it defaulted, so such objects keep it (an upgrade of the operator moves no model to another Triton), and
#: a pooled model that carries it is not refused for it (its pool's image is what runs).
LEGACY_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:24.10-py3"
