"""The TritonModel API: pydantic models, the single source of the CRD."""

from .pod import DIGEST_PARAMETER, WARMED_CONDITION
from .v1alpha1 import API_VERSION, GROUP, KIND, PLURAL, VERSION, TritonModel, TritonModelSpec, TritonModelStatus

__all__ = [
    "API_VERSION",
    "DIGEST_PARAMETER",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "WARMED_CONDITION",
    "TritonModel",
    "TritonModelSpec",
    "TritonModelStatus",
]
