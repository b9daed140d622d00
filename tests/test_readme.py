"""The README's figures about the invalid corpus are the corpus's own: counted from it, not trusted (`make docs` writes
them: tests/corpus_counts.py). Its install path for a cluster of one's own names what `make release-push` pushes, what
the chart reads and the example it applies, and the Kubernetes versions it states are the tested and required ones."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests import corpus_counts
from tests.corpus_counts import MARK, README, AdmissionSplit, counts, update


def test_the_readmes_corpus_counts_are_current() -> None:
    readme = README.read_text()
    values = counts()
    assert {m["key"] for m in MARK.finditer(readme)} == set(values), "README.md should mark every corpus count"
    assert update(readme, values) == readme, "README.md's corpus counts are stale: run `make docs`"


def test_a_stale_count_is_written_again_and_an_unknown_one_refused() -> None:
    text = "holds <!-- corpus:specs -->98<!-- /corpus --> specs, <!-- corpus:triton -->1<!-- /corpus --> real"
    assert update(text, {"specs": 99, "triton": 56}) == (
        "holds <!-- corpus:specs -->99<!-- /corpus --> specs, <!-- corpus:triton -->56<!-- /corpus --> real")
    with pytest.raises(ValueError, match="no value: rules"):
        update("<!-- corpus:rules -->3<!-- /corpus -->", {"specs": 99})


def test_a_split_measured_on_another_corpus_is_refused_naming_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    live = corpus_counts.ADMISSION_SPLIT
    monkeypatch.setattr(corpus_counts, "ADMISSION_SPLIT", AdmissionSplit(
        specs=live.specs - 1, schema_cel=live.schema_cel, webhook=live.webhook - 1, measured="then"))
    with pytest.raises(ValueError, match=r"measure it again .*e2e/test_admission\.py"):
        counts()


# ---------------------------------------------------------------- the install path for a cluster of one's own

INSTALL = "## Install on your own cluster\n"
ROOT = README.parent


def install_section() -> str:
    text = README.read_text()
    assert text.count(INSTALL) == 1, "README.md should have one section 'Install on your own cluster'"
    return text.split(INSTALL, 1)[1].split("\n## ", 1)[0]


def install_commands() -> str:
    block = re.search(r"^```\n(.*?)^```$", install_section(), re.S | re.M)
    assert block, "the install section should start with its commands in a code block"
    return block.group(1)


def test_the_install_commands_name_what_make_release_push_pushes() -> None:
    """The registry paths, the version and the values the README's helm line uses are the ones tools/release.py pushes
    and the chart reads: a rename of either breaks the README's install, so it fails here."""
    from tools import registry_layout
    from triton_operator import __version__

    commands = install_commands()
    steps = [line.split("#")[0].strip() for line in commands.splitlines() if line and not line.startswith(" ")]
    assert len(steps) < 10, f"the README promises a working model in under ten commands, not {len(steps)}"
    registry = re.search(r"make release-push REGISTRY=(\S+)", commands)
    assert re.search(r"^make release\s", commands, re.M), "the install should build the release it pushes"
    chart = yaml.safe_load((ROOT / "charts" / "triton-operator" / "Chart.yaml").read_text())
    helm = re.search(r"helm install (\S+) (\S+) --version (\S+)", commands)
    assert registry and helm
    name, ref, version = helm.groups()
    assert ref == f"oci://{registry.group(1)}/{registry_layout.CHART_REPOSITORY}/{chart['name']}"
    assert version == __version__ == chart["version"], "the README's install names another version: update it"
    assert f"--set image.repository={registry.group(1)}/{registry_layout.IMAGE_REPOSITORY} " in commands
    values = yaml.safe_load((ROOT / "charts" / "triton-operator" / "values.yaml").read_text())
    for key in re.findall(r"--set ([\w.]+)=", commands):
        section, _, leaf = key.partition(".")
        assert leaf in values[section], f"the README sets {key}, which values.yaml does not have"
    # The chart names its Deployment after the release when the release's name contains the chart's (_helpers.tpl).
    assert chart["name"] in name and f"deployment/{name}" in commands


def test_the_install_sample_request_fits_the_example_it_applies() -> None:
    """The model applied, waited for, port-forwarded and asked is one model; its request has the example's inputs,
    with the batch dimension, and the answer written beside it is what the model computes."""
    from triton_operator.api.pod import HTTP_PORT

    commands = install_commands()
    path = re.search(r"kubectl apply -f (\S+)", commands)
    assert path
    model = yaml.safe_load((ROOT / path.group(1)).read_text())
    name = model["metadata"]["name"]
    assert f"tritonmodel/{name} --for=condition=Ready" in commands
    assert f"svc/{name} {HTTP_PORT}:{HTTP_PORT}" in commands
    assert all(g["kind"] == "CPU" for g in model["spec"]["instanceGroups"]), "the README says: no GPU needed"
    call = re.search(rf"curl -s localhost:{HTTP_PORT}/v2/models/{name}/infer -d '(.*?)'(.*)", commands, re.S)
    assert call
    request = json.loads(call.group(1))
    batch = [1] if model["spec"]["maxBatchSize"] > 0 else []
    assert [(t["name"], t["datatype"], t["shape"]) for t in request["inputs"]] == [
        (i["name"], i["dataType"], batch + i["dims"]) for i in model["spec"]["inputs"]]
    a, b = (t["data"] for t in request["inputs"])
    added, subtracted = (",".join(str(round(x)) for x in xs) for xs in (
        [x + y for x, y in zip(a, b, strict=True)], [x - y for x, y in zip(a, b, strict=True)]))
    assert f"OUTPUT0 {added}; OUTPUT1 {subtracted}" in call.group(2)


def test_the_supported_versions_are_the_tested_and_required_ones() -> None:
    """The Kubernetes release the README says every test runs is the one the cluster's binaries are built from, and
    the floor it gives is the chart's kubeVersion."""
    section = install_section()
    go_mod = (ROOT / "e2e" / "toolchain" / "kube" / "go.mod").read_text()
    tested = re.search(r"^\s*k8s\.io/kubernetes v(\d+\.\d+\.\d+)", go_mod, re.M)
    assert tested and f"every test runs {tested.group(1)}" in section
    floor = yaml.safe_load((ROOT / "charts" / "triton-operator" / "Chart.yaml").read_text())["kubeVersion"]
    minor = re.fullmatch(r">=(\d+\.\d+)\.0-0", floor)
    assert minor and f"The chart requires {minor.group(1)} " in section
