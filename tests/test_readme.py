"""README.md, read in two minutes: at most about 200 lines, and every figure in it generated from bench/results or
dated with the commit it was measured at. Its install path for a cluster of one's own names what `make release-push`
pushes, what the chart reads and the example it applies, and the Kubernetes versions it states are the tested and
required ones. The docs' figures about the invalid corpus and the CRDs' CEL rules are counted, not trusted (`make docs`
writes them: tests/corpus_counts.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests import corpus_counts
from tests.corpus_counts import MARK, README, ROOT, AdmissionSplit, counts, pages, update


def test_the_pages_corpus_and_cel_counts_are_current() -> None:
    values = counts()
    marked = set()
    for page in pages():
        text = page.read_text()
        marked |= {m["key"] for m in MARK.finditer(text)}
        assert update(text, values) == text, f"{page.relative_to(ROOT)}'s corpus counts are stale: run `make docs`"
    assert marked == set(values), "the pages should mark every corpus and CEL count somewhere"


def test_the_cel_rules_are_counted_wherever_the_schema_has_them(tmp_path: Path) -> None:
    crd = {"spec": {"versions": [{"schema": {"x-kubernetes-validations": [{"rule": "a"}], "properties": {
        "spec": {"x-kubernetes-validations": [{"rule": "b"}, {"rule": "c"}], "items": [{"type": "object"}]}}}}]}}
    path = tmp_path / "crd.yaml"
    path.write_text(yaml.safe_dump(crd))
    assert corpus_counts.cel_rules(path) == 3


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
    # The floor is tested: `make test-k8s-oldest` builds it from e2e/toolchain/kube-X.Y/go.mod, and the README names
    # the release that module pins.
    oldest_mod = ROOT / "e2e" / "toolchain" / f"kube-{minor.group(1)}" / "go.mod"
    assert oldest_mod.is_file(), f"the chart's floor {minor.group(1)} has no toolchain module {oldest_mod}"
    oldest = re.search(r"^\s*(?:require\s+)?k8s\.io/kubernetes v(\d+\.\d+\.\d+)", oldest_mod.read_text(), re.M)
    assert oldest and oldest.group(1).startswith(f"{minor.group(1)}.") and "test-k8s-oldest` runs" in section
    assert f"on {oldest.group(1)}" in section
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(rf"^K8S_OLDEST \?= {re.escape(minor.group(1))}$", makefile, re.M)


# ---------------------------------------------------------------- every figure of the README has a source

#: A figure: a number with a unit of time, size, share, rate or ratio.
FIGURE = re.compile(r"(?<![\w.])\d[\d,.]*\s?(?:ms|s|min|h|KiB|MiB|GiB|KB|MB|GB|Ki|Mi|Gi|%|req/s|x)(?![\w/])")
#: The source a figure measured by hand carries on its line: the date and the commit it was measured at.
DATED = re.compile(r"\((?P<date>\d{4}-\d{2}-\d{2}), commit (?P<commit>[0-9a-f]{7,40})\)")


def unsourced_figures(text: str) -> list[str]:
    """The lines of a README that hold a figure neither generated (a `<!-- bench:… -->` or `<!-- corpus:… -->` marker,
    written by `make docs`) nor dated (`(2026-11-28, commit e610140)` on its line). Code blocks and spans are
    commands and examples, not figures."""
    from bench.readme import SPAN

    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = SPAN.sub("", MARK.sub("", text))
    text = re.sub(r"<!--.*?-->", "", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    return [line for line in text.splitlines() if FIGURE.search(line) and not DATED.search(line)]


def test_every_figure_in_the_readme_is_generated_or_dated() -> None:
    lines = unsourced_figures(README.read_text())
    assert not lines, ("a figure in README.md has no source: generate it from bench/results (`<!-- bench:NAME::… "
                       "-->…<!-- /bench -->`, `make docs`) or tag its line with when it was measured, "
                       "`(YYYY-MM-DD, commit abc1234)`:\n" + "\n".join(lines))


def test_a_dated_figure_names_a_commit_of_this_repository() -> None:
    tags = list(DATED.finditer(README.read_text()))
    assert tags, "the README's test-run figure should carry its date and commit"
    for tag in tags:
        found = subprocess.run(["git", "cat-file", "-e", f"{tag['commit']}^{{commit}}"], cwd=ROOT, capture_output=True)
        assert found.returncode == 0, f"README.md dates a figure with commit {tag['commit']}, which this repository lacks"


def test_a_figure_without_a_source_is_found_and_a_sourced_one_is_not() -> None:
    assert unsourced_figures("make test took 21 min on two cores\n") == ["make test took 21 min on two cores"]
    assert unsourced_figures("the probe holds 24 MB, 3.5x less and 40% of it\n")
    assert not unsourced_figures("make test took 21 min (2026-11-28, commit e610140)\n")
    assert not unsourced_figures("joined <!-- bench:gate::rows::x::ours -->427 ms<!-- /bench --> after READY\n")
    assert not unsourced_figures("```\nsleep 5s\n```\n`--timeout=15m`, [p95](docs/x-5s.md), p95, 1.35.4, 2 replicas\n")


def test_the_readme_is_read_in_two_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 200, f"README.md has {lines} lines: move the reference material to docs/ (at most about 200)"


def test_the_first_model_and_pool_are_the_examples_they_point_to() -> None:
    """The README's first TritonModel and first pool are shortened copies of examples/add-sub.yaml and
    examples/pool.yaml: what they show must not drift from the examples that are tested for real."""
    first_model, first_pool = re.findall(r"^```yaml\n(.*?)^```$", README.read_text(), re.S | re.M)
    model = yaml.safe_load(first_model)
    example = yaml.safe_load((ROOT / "examples" / "add-sub.yaml").read_text())
    shown = ("backend", "maxBatchSize", "batcher", "inputs", "outputs", "instanceGroups")
    assert {k: model["spec"][k] for k in shown} == {k: example["spec"][k] for k in shown}
    pool, pooled = yaml.safe_load_all(first_pool)
    examples = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(
        (ROOT / "examples" / "pool.yaml").read_text())}
    assert pool["spec"] == {k: examples["TritonPool", "shared"]["spec"][k] for k in pool["spec"]}
    assert pooled["spec"] == {k: examples["TritonModel", pooled["metadata"]["name"]]["spec"][k] for k in pooled["spec"]}
