"""Where a release lives in an OCI registry: read by tools/release.py, which pushes there, and by the README's check
(tests/test_readme.py), which must not import release.py's build machinery (e2e/images.py, the cluster harness)."""

#: Where the operator image goes in a registry (beside `charts/`, where `helm push` puts the chart).
IMAGE_REPOSITORY = "triton-operator"
#: Where `helm push` puts the chart: `oci://REGISTRY/charts/triton-operator`.
CHART_REPOSITORY = "charts"
