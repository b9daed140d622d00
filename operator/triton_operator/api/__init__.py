"""The TritonModel and TritonPool API: pydantic models (`v1alpha1`, `pool`), the single source of the CRD, and the
replica pod's contract (`pod`).

The API group is named here, and this package imports nothing: `pod` names its annotations in the group, and the
programs that run in a replica pod (`triton_operator.agent`) read `pod` without loading pydantic.
"""

GROUP = "serving.triton-operator.dev"
