"""A model's source: what identifies its files (and so rolls replicas when it changes), content pins
(`sha256` for https, `objectVersion` for S3 and GCS) that `fetch` enforces, and the warm-up files a
`uri` model needs in `warmupFiles`.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.https_server import HttpsServer, serve, tgz
from triton_operator.agent.fetch import FetchError, fetch_uri, run
from triton_operator.api.pod import ANNOTATION_DIGEST
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.cli.main import main
from triton_operator.render.kubernetes import render_children, render_deployment
from triton_operator.render.modelconfig import render_repository
from triton_operator.validate import Document, check_documents

UID = "00000000-0000-0000-0000-000000000001"


def _body(source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "serving.triton-operator.dev/v1alpha1",
        "kind": "TritonModel",
        "metadata": {"name": "m"},
        "spec": {
            "backend": "python",
            "inputs": [{"name": "INPUT", "dataType": "FP32", "dims": [4]}],
            "outputs": [{"name": "OUTPUT", "dataType": "FP32", "dims": [4]}],
            "instanceGroups": [{"kind": "CPU", "count": 1}],
            "source": source,
            **spec,
        },
    }


def _errors(body: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e.path, e.message) for e in check_documents([Document("m.yaml#0", body)]).errors]


def _digest(source: dict[str, Any]) -> str:
    return render_repository([TritonModel.model_validate(_body(source))])["m"].digest


def _template_digest(source: dict[str, Any]) -> str:
    model = TritonModel.model_validate(_body(source))
    [dep] = [c for c in render_children(model, render_repository([model]), UID, "ns") if c["kind"] == "Deployment"]
    return dep["spec"]["template"]["metadata"]["annotations"][ANNOTATION_DIGEST]


# ---------------------------------------------------------------- the source's identity is in the digest


def test_a_uri_change_changes_the_digest_and_the_pod_template() -> None:
    a = {"uri": "https://models.example.com/m-v1.tar.gz"}
    b = {"uri": "https://models.example.com/m-v2.tar.gz"}
    assert _digest(a) != _digest(b)
    assert _template_digest(a) != _template_digest(b), "the Deployment must roll to the new files"


@pytest.mark.parametrize(("a", "b"), [
    ({"uri": "https://h/m.tar.gz", "sha256": "a" * 64}, {"uri": "https://h/m.tar.gz", "sha256": "b" * 64}),
    ({"uri": "https://h/m.tar.gz"}, {"uri": "https://h/m.tar.gz", "sha256": "b" * 64}),
    ({"uri": "s3://b/m.tar.gz", "objectVersion": "v1"}, {"uri": "s3://b/m.tar.gz", "objectVersion": "v2"}),
    ({"uri": "gs://b/m.tar.gz", "objectVersion": "1700000000000001"}, {"uri": "gs://b/m.tar.gz", "objectVersion": "1700000000000002"}),
])
def test_a_pin_change_changes_the_digest(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert _digest(a) != _digest(b)


def test_credentials_are_not_the_files_identity() -> None:
    assert _digest({"uri": "s3://b/m/", "credentialsSecret": "one"}) == _digest({"uri": "s3://b/m/", "credentialsSecret": "two"})


# ---------------------------------------------------------------- pins: where they apply


@pytest.mark.parametrize(("source", "path", "says"), [
    ({"uri": "s3://b/m/", "sha256": "a" * 64}, "spec.source.sha256", "https://"),
    ({"uri": "pvc://claim/m", "sha256": "a" * 64}, "spec.source.sha256", "https://"),
    ({"uri": "https://h/m.tar.gz", "objectVersion": "3"}, "spec.source.objectVersion", "s3:// or gs://"),
    ({"uri": "s3://b/models/", "objectVersion": "v1"}, "spec.source.uri", "one object"),
    ({"uri": "gs://b/m.tar.gz", "objectVersion": "latest"}, "spec.source.objectVersion", "generation"),
    ({"inline": {"model.py": "pass\n"}, "sha256": "a" * 64}, "spec.source.sha256", "https://"),
])
def test_a_pin_that_cannot_apply_is_refused_naming_it(source: dict[str, Any], path: str, says: str) -> None:
    errors = _errors(_body(source))
    assert any(p == path and says in msg for p, msg in errors), errors


def test_a_malformed_sha256_is_refused_by_the_schema() -> None:
    errors = _errors(_body({"uri": "https://h/m.tar.gz", "sha256": "not-hex"}))
    assert any(p == "spec.source.sha256" for p, _ in errors), errors


@pytest.mark.parametrize("source", [
    {"uri": "https://h/m.tar.gz", "sha256": "0" * 64},
    {"uri": "s3://b/models/m.tar.gz", "objectVersion": "3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY"},
    {"uri": "gs://b/models/model.py", "objectVersion": "1700000000000001"},
])
def test_pins_where_they_apply_are_accepted(source: dict[str, Any]) -> None:
    assert _errors(_body(source)) == []


# ---------------------------------------------------------------- warm-up data of a uri model


def test_a_uri_model_reading_warmup_data_not_in_warmup_files_is_refused_naming_it() -> None:
    """fetch writes a uri model's files to <model>/1/; Triton reads warm-up data from <model>/warmup/."""
    body = _body({"uri": "s3://bucket/models/m/"}, modelWarmup=[
        {"name": "sample", "inputs": {"INPUT": {"dataType": "FP32", "dims": [4], "inputDataFile": "input.bin"}}}])
    errors = _errors(body)
    assert any(p == "spec.modelWarmup[0].inputs[INPUT].inputDataFile" and "warmupFiles" in msg
               for p, msg in errors), errors
    body["spec"]["source"]["warmupFiles"] = {"input.bin": base64.b64encode(bytes(16)).decode()}
    assert _errors(body) == []


# ---------------------------------------------------------------- fetch enforces the pins


@pytest.fixture
def served(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[HttpsServer]:
    """A real HTTPS server on 127.0.0.1 (tests/https_server.py), its test CA trusted through SSL_CERT_FILE."""
    gen = serve(tmp_path_factory.mktemp("https"))
    server = next(gen)
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    yield server
    gen.close()


def test_fetch_checks_the_sha256_of_an_https_archive(served: HttpsServer, tmp_path: Path) -> None:
    archive = tgz({"model.py": b"print('v1')\n"})
    served["/m.tar.gz"] = archive
    url = served.url("/m.tar.gz")
    good = hashlib.sha256(archive).hexdigest()
    fetch_uri("m", url, tmp_path / "ok", sha256=good)
    assert (tmp_path / "ok" / "m" / "1" / "model.py").read_bytes() == b"print('v1')\n"

    served["/m.tar.gz"] = tgz({"model.py": b"print('v2, replaced behind the same URL')\n"})
    with pytest.raises(FetchError, match=f"sha256 mismatch.*expected {good}") as exc:
        fetch_uri("m", url, tmp_path / "changed", sha256=good)
    assert url in str(exc.value)
    assert not (tmp_path / "changed" / "m" / "1" / "model.py").exists(), "nothing unverified is unpacked"


def test_fetch_command_fails_clearly_on_a_sha256_mismatch(served: HttpsServer, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    served["/model.py"] = b"print('hello')\n"
    url = served.url("/model.py")
    rc = main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"),
               "--uri", f"m={url}", "--sha256", f"m={'0' * 64}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"error: fetch failed: sha256 mismatch for {url}: expected {'0' * 64}, got " in err
    rc = main(["fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"),
               "--uri", f"m={url}", "--sha256", f"m={hashlib.sha256(b'print(chr(104))').hexdigest()}"])
    assert rc == 1
    ok = hashlib.sha256(b"print('hello')\n").hexdigest()
    assert run(tmp_path / "cm", tmp_path / "repo", [f"m={url}"], sha256={"m": ok}) == 0
    assert (tmp_path / "repo" / "m" / "1" / "model.py").read_bytes() == b"print('hello')\n"


def test_rendered_fetch_arguments_carry_the_pins() -> None:
    model = TritonModel.model_validate(_body({"uri": "https://h/m.tar.gz", "sha256": "c" * 64}))
    [dep] = [c for c in render_children(model, render_repository([model]), UID, "ns") if c["kind"] == "Deployment"]
    [fetch] = dep["spec"]["template"]["spec"]["initContainers"]
    assert fetch["args"][-4:] == ["--uri", "m=https://h/m.tar.gz", "--sha256", f"m={'c' * 64}"]
    model = TritonModel.model_validate(_body({"uri": "s3://b/m.tar.gz", "objectVersion": "v7"}))
    [dep] = [c for c in render_children(model, render_repository([model]), UID, "ns") if c["kind"] == "Deployment"]
    [fetch] = dep["spec"]["template"]["spec"]["initContainers"]
    assert fetch["args"][-4:] == ["--uri", "m=s3://b/m.tar.gz", "--object-version", "m=v7"]


def test_every_uri_source_is_fetched_where_it_lands_and_grants_its_claims_and_secrets() -> None:
    """`TritonModel.uri_sources`: what the fetch step is given (versions in order, then the model directory's own
    files) and what the review of the operator's writes lets the replica use; an inline source is neither."""
    from triton_operator.validate.operator_writes import model_grants

    body = _body({"inline": {"model.py": "x"}})
    del body["spec"]["source"]
    body["spec"]["versions"] = [{"version": 2, "source": {"uri": "pvc://weights/m/2"}},
                                {"version": 1, "source": {"uri": "s3://b/m1.tar.gz", "credentialsSecret": "s3-creds"}},
                                {"version": 3, "source": {"inline": {"model.py": "y"}}}]
    body["spec"]["modelFiles"] = {"uri": "pvc://labels/m"}
    model = TritonModel.model_validate(body)
    assert [key for key, _ in model.uri_sources] == ["m/1", "m/2", "m/."]
    [dep] = [c for c in render_children(model, render_repository([model]), UID, "ns") if c["kind"] == "Deployment"]
    [fetch] = dep["spec"]["template"]["spec"]["initContainers"]
    uris = [a for i, a in enumerate(fetch["args"]) if i and fetch["args"][i - 1] == "--uri"]
    assert uris == ["m/1=s3://b/m1.tar.gz", "m/2=pvc://weights/m/2", "m/.=pvc://labels/m"]
    grants = model_grants(model, [], "key-secret", "image")
    assert grants.claims == frozenset({"weights", "labels"})
    assert "s3-creds" in grants.secrets


EXAMPLE_SOURCES = Path(__file__).resolve().parents[1] / "examples" / "sources"


def _example_deployment(name: str) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """examples/sources/<name>.yaml's documents by kind (after the operator's own checks), and the Deployment it
    renders for its TritonModel."""
    import yaml

    docs = {d["kind"]: d for d in yaml.safe_load_all((EXAMPLE_SOURCES / f"{name}.yaml").read_text()) if d}
    loaded = check_documents([Document(f"{name}.yaml#{i}", d) for i, d in enumerate(docs.values())])
    assert not loaded.errors, [(e.path, e.message) for e in loaded.errors]
    [(_, model)] = loaded.models
    return docs, render_deployment(model, render_repository([model]), UID, "ns")


def test_the_s3_example_gives_fetch_its_secret_by_reference() -> None:
    docs, dep = _example_deployment("s3")
    secret = docs["Secret"]["metadata"]["name"]
    [fetch] = dep["spec"]["template"]["spec"]["initContainers"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in fetch["env"] if "secretKeyRef" in e.get("valueFrom", {})}
    assert set(docs["Secret"]["stringData"]) <= set(refs), (sorted(docs["Secret"]["stringData"]), sorted(refs))
    assert {r["name"] for r in refs.values()} == {secret}
    assert not refs["AWS_ACCESS_KEY_ID"]["optional"] and refs["AWS_REGION"]["optional"]
    assert fetch["args"][-2:] == ["--uri", "add-sub-s3=s3://models/add-sub"]


def test_the_pvc_example_mounts_its_claim_read_only_into_fetch_alone() -> None:
    docs, dep = _example_deployment("pvc")
    claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
    pod = dep["spec"]["template"]["spec"]
    [vol] = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert vol["persistentVolumeClaim"] == {"claimName": claim, "readOnly": True}
    [fetch] = pod["initContainers"]
    assert {"name": vol["name"], "mountPath": f"/sources/pvc/{claim}", "readOnly": True} in fetch["volumeMounts"]
    assert all(m["name"] != vol["name"] for c in pod["containers"] for m in c.get("volumeMounts", []))


# ---------------------------------------------------------------- credentials in a uri, bounds (issue 32)


@pytest.mark.parametrize("where", ["source", "modelFiles", "versions"])
def test_a_uri_with_userinfo_is_refused_naming_the_field_and_not_the_password(where: str) -> None:
    uri = "https://user:SECRET@example.com/m.tar.gz"
    if where == "source":
        body, path = _body({"uri": uri}), "spec.source.uri"
    elif where == "modelFiles":
        body, path = _body({"inline": {"model.py": "pass\n"}}, modelFiles={"uri": uri}), "spec.modelFiles.uri"
    else:
        body = _body({"inline": {"model.py": "pass\n"}})
        del body["spec"]["source"]
        body["spec"]["versions"] = [{"version": 1, "source": {"uri": uri}}]
        path = "spec.versions[0].source.uri"
    errors = _errors(body)
    assert [p for p, _ in errors] == [path], errors
    assert "carries credentials (user:password@)" in errors[0][1] and "SECRET" not in errors[0][1], errors


def test_a_presigned_query_is_accepted_and_never_printed_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A presigned URL is a legitimate source; its query is a credential, so the CLI shows it redacted."""
    import yaml

    body = _body({"uri": "https://example.com/m.tar.gz?X-Amz-Signature=SECRET&X-Amz-Expires=600"})
    assert _errors(body) == []
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(body))
    assert main(["validate", str(tmp_path / "m.yaml")]) == 0
    out = capsys.readouterr()
    assert "its files come from https://example.com/m.tar.gz?<redacted> at pod start" in out.out, out
    assert "SECRET" not in out.out + out.err


def test_fetch_may_not_write_more_than_the_repository_volume_holds() -> None:
    body = _body({"uri": "s3://b/m/"}, server={"repositorySizeLimit": "1Gi", "fetch": {"maxBytes": "2Gi"}})
    errors = _errors(body)
    assert [p for p, _ in errors] == ["spec.server.fetch.maxBytes"], errors
    assert "may not exceed repositorySizeLimit (1Gi)" in errors[0][1], errors
    assert _errors(_body({"uri": "s3://b/m/"}, server={"repositorySizeLimit": "1Gi", "fetch": {"maxBytes": "1Gi"}})) == []
    assert _errors(_body({"uri": "s3://b/m/"}, server={"repositorySizeLimit": "1Gi"})) == []


def test_the_status_quotes_fetchs_message_without_a_query_even_from_an_older_fetch() -> None:
    """The operator redacts what it quotes, whoever wrote it (a fetch image from before issue 32, a crash's log)."""
    from triton_operator.plan.status import replica_state

    def pod(message: str) -> dict[str, Any]:
        return {"metadata": {"name": "m-1"}, "status": {"initContainerStatuses": [{
            "name": "fetch", "state": {"terminated": {"exitCode": 1, "message": message}}}]}}

    said = replica_state(pod("error: fetch failed: https://u:PASS@h/m.tar.gz?sig=SECRET: HTTP 403 Forbidden\n"))
    assert said["reason"] == "SourceFetchFailed"
    assert said["message"] == "fetch: https://<redacted>@h/m.tar.gz?<redacted>: HTTP 403 Forbidden"
    tail = "Fetching model files model=m version=1 uri=s3://b/k?versionId=SECRET\nTraceback (most recent call last):"
    assert "SECRET" not in replica_state(pod(tail))["message"]
