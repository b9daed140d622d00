"""The TritonModel API: pydantic models, the single source of the CRD."""

from .v1alpha1 import (
    API_VERSION,
    DIGEST_PARAMETER,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    WARMED_CONDITION,
    TritonModel,
    TritonModelSpec,
    TritonModelStatus,
)

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
