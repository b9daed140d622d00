"""triton-operator: declarative NVIDIA Triton Inference Server models on Kubernetes."""

__version__ = "0.1.0"
