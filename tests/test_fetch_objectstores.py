"""`fetch` from s3:// and gs:// against REAL servers on 127.0.0.1 (e2e/objectstores.py): versitygw, an S3 server
over a directory, and fake-gcs-server, Google Cloud Storage's APIs; each built from its pinned Go module. boto3 and
google-cloud-storage talk HTTP to them, configured only as users configure them (AWS_* variables, as the
credentials Secret sets them; STORAGE_EMULATOR_HOST, the storage library's own endpoint setting). Last,
spec.modelFiles.uri from each of them and from the https server of tests/https_server.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.objectstores import GCSServer, S3Server, environ
from tests.https_server import tgz
from triton_operator.agent.fetch import FetchError, fetch_uri

CLI = Path(sys.executable).parent / "triton-operator"
MODEL_PY = b"# model v1\n"


#: Every bucket layout the cases below read: a model directory with a sibling whose name starts the same,
#: folder markers (zero-byte keys ending in `/`, as consoles and some tools create), single objects.
OBJECTS = {
    "models/m/model.py": MODEL_PY,
    "models/m/": b"",
    "models/m/sub/": b"",
    "models/m/sub/weights.bin": b"\x00\x01",
    "models/m-old/model.py": b"# the sibling: must not be fetched\n",
    "single/model.py": b"# one object\n",
    "single/m.tar.gz": tgz({"model.py": b"# from the archive\n"}),
    "escape/../evil.py": b"# a key with .. in it\n",
    # Over the caps of the test below: 3 MiB in one object, an archive that unpacks to 64 MiB, 12 small objects.
    "big/weights.bin": b"\x01" * (3 << 20),
    "bomb/m.tar.gz": tgz({"model.py": b"ok\n", "zeros.bin": b"\0" * (64 << 20)}),
    **{f"many/f{i}.txt": b"x" for i in range(12)},
}


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with S3Server(tmp_path_factory.mktemp("s3")) as server:
        client = server.client()
        client.create_bucket(Bucket="models")
        for key, body in OBJECTS.items():
            if ".." not in key:  # versitygw stores keys as paths, and refuses to climb out of its bucket
                client.put_object(Bucket="models", Key=key, Body=body)
        client.create_bucket(Bucket="versioned")
        client.put_bucket_versioning(Bucket="versioned", VersioningConfiguration={"Status": "Enabled"})
        server.versions = [  # type: ignore[attr-defined]
            client.put_object(Bucket="versioned", Key="m.tar.gz", Body=tgz({"model.py": body}))["VersionId"]
            for body in (b"# v1\n", b"# v2\n")]
        with environ(server.env()):
            yield server


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSServer]:
    with GCSServer(tmp_path_factory.mktemp("gcs")) as server:
        client = server.client()
        bucket = client.create_bucket("models")
        for key, body in OBJECTS.items():
            bucket.blob(key).upload_from_string(body)
        versioned = client.create_bucket("versioned")
        versioned.versioning_enabled = True
        versioned.patch()
        blobs = [versioned.blob("model.py"), versioned.blob("model.py")]
        blobs[0].upload_from_string(b"# generation one\n")
        blobs[1].upload_from_string(b"# generation two\n")
        server.generations = [b.generation for b in blobs]  # type: ignore[attr-defined]
        with environ(server.env()):
            yield server


STORES = ["s3", "gs"]


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> Any:
    """Each case runs against both servers; the scheme is the fixture's param."""
    return request.getfixturevalue("s3" if request.param == "s3" else "gcs"), request.param


def test_a_prefix_is_a_directory_its_sibling_and_folder_markers_are_left_out(store: Any, tmp_path: Path) -> None:
    _, scheme = store
    fetch_uri("m", f"{scheme}://models/models/m", tmp_path)
    assert _tree(tmp_path) == {"m/1/model.py": MODEL_PY, "m/1/sub/weights.bin": b"\x00\x01"}
    fetch_uri("n", f"{scheme}://models/models/m/", tmp_path)  # the same with a trailing slash
    assert _tree(tmp_path / "n") == {"1/model.py": MODEL_PY, "1/sub/weights.bin": b"\x00\x01"}


def test_a_uri_naming_one_object_places_that_file_or_unpacks_that_archive(store: Any, tmp_path: Path) -> None:
    _, scheme = store
    fetch_uri("f", f"{scheme}://models/single/model.py", tmp_path)
    fetch_uri("a", f"{scheme}://models/single/m.tar.gz", tmp_path)
    assert _tree(tmp_path) == {"f/1/model.py": b"# one object\n", "a/1/model.py": b"# from the archive\n"}


def test_nothing_there_is_a_clear_error_and_leaves_nothing_behind(store: Any, tmp_path: Path) -> None:
    _, scheme = store
    for uri in (f"{scheme}://models/models/nope", f"{scheme}://models/models/m-", f"{scheme}://models/nope/"):
        with pytest.raises(FetchError, match="no objects under it") as exc:
            fetch_uri("m", uri, tmp_path)
        assert uri in str(exc.value)
    with pytest.raises(FetchError, match=r"no such bucket|not found"):
        fetch_uri("m", f"{scheme}://no-such-bucket/models/m", tmp_path)
    assert list(tmp_path.iterdir()) == [], "a failed fetch left files behind"


def test_an_object_key_that_climbs_out_is_refused(gcs: GCSServer, tmp_path: Path) -> None:
    """GCS keeps any key as it is, `..` included (S3 servers that map keys to paths refuse to store one)."""
    with pytest.raises(FetchError, match="would land outside the model directory"):
        fetch_uri("m", "gs://models/escape", tmp_path)
    assert not (tmp_path / "evil.py").exists() and list(tmp_path.iterdir()) == []


def test_an_s3_object_version_pins_exactly_that_version(s3: S3Server, tmp_path: Path) -> None:
    v1, v2 = s3.versions  # type: ignore[attr-defined]
    fetch_uri("one", "s3://versioned/m.tar.gz", tmp_path, object_version=v1)
    fetch_uri("two", "s3://versioned/m.tar.gz", tmp_path, object_version=v2)
    assert _tree(tmp_path) == {"one/1/model.py": b"# v1\n", "two/1/model.py": b"# v2\n"}


def test_a_gcs_generation_pins_exactly_that_generation(gcs: GCSServer, tmp_path: Path) -> None:
    g1, g2 = gcs.generations  # type: ignore[attr-defined]
    assert g1 != g2
    fetch_uri("one", "gs://versioned/model.py", tmp_path, object_version=str(g1))
    fetch_uri("two", "gs://versioned/model.py", tmp_path, object_version=str(g2))
    assert _tree(tmp_path) == {"one/1/model.py": b"# generation one\n", "two/1/model.py": b"# generation two\n"}


CAPPED: dict[str, tuple[dict[str, int], str]] = {  # uri (below the bucket) -> (the caps it exceeds, what is said)
    "big/weights.bin": ({"max_bytes": 1 << 20}, "more than 1.0 MiB to write into the model repository (the cap: "
                        "spec.server.fetch.maxBytes)"),
    "big": ({"max_bytes": 1 << 20}, "more than 1.0 MiB to write into the model repository"),
    "bomb/m.tar.gz": ({"max_bytes": 8 << 20}, "more than 8.0 MiB to write into the model repository"),
    "many": ({"max_files": 10}, "more than 10 files and directories (the cap: spec.server.fetch.maxFiles)"),
}


@pytest.mark.parametrize("key", sorted(CAPPED))
def test_what_exceeds_the_caps_is_refused_and_leaves_nothing(store: Any, tmp_path: Path, key: str) -> None:
    """An object, a prefix's objects, an archive's members: each charged as it is written (never held whole)."""
    from triton_operator.agent.fetch import Budget  # (issue 32)

    _, scheme = store
    caps, says = CAPPED[key]
    uri = f"{scheme}://models/{key}"
    with pytest.raises(FetchError) as exc:
        fetch_uri("m", uri, tmp_path, budget=Budget(**caps))
    assert str(exc.value).startswith(f"{uri}: {says}"), exc.value
    assert list(tmp_path.iterdir()) == [], "a refused fetch left files behind"
    fetch_uri("m", uri, tmp_path)  # within the default caps
    assert (tmp_path / "m" / "1").is_dir()


def _fetch_cli(tmp_path: Path, uri: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STORAGE_EMULATOR"))}
    return subprocess.run([str(CLI), "fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"),
                           "--uri", f"m={uri}"], env={**clean, **env}, capture_output=True, text=True, timeout=120,
                          check=False)


def test_the_fetch_command_with_the_secrets_variables_and_with_a_wrong_secret(s3: S3Server, tmp_path: Path) -> None:
    """As in the init container: the Secret's keys become AWS_* variables; a wrong one fails in one clear line."""
    ok = _fetch_cli(tmp_path / "ok", "s3://models/models/m", s3.env())
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ok" / "repo" / "m" / "1" / "model.py").read_bytes() == MODEL_PY
    for wrong in (s3.env(secret_key="not-the-secret"), s3.env(access_key="NOSUCHKEY")):  # noqa: S106 - wrong on purpose
        bad = _fetch_cli(tmp_path / "bad", "s3://models/models/m", wrong)
        assert bad.returncode == 1, bad.stderr
        last = bad.stderr.strip().splitlines()[-1]
        assert last.startswith("error: fetch failed: s3://models/models/m: access denied ("), bad.stderr
        assert "check the Secret named in credentialsSecret (keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)" in last
        assert "Traceback" not in bad.stderr
        assert not (tmp_path / "bad" / "repo" / "m").exists()
    unreachable = {**s3.env(), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}  # the discard port: nothing listens
    down = _fetch_cli(tmp_path / "down", "s3://models/models/m", unreachable)
    assert down.returncode == 1 and "cannot reach the S3 endpoint" in down.stderr, down.stderr


# ---------------------------------------------------------------- spec.modelFiles.uri from each real server


LABELS = b"cat\ndog\n"


def _rendered_fetch(model_files: dict[str, str], tmp_path: Path) -> tuple[Path, list[str]]:
    """A classification model whose labels come from `spec.modelFiles`: its rendered repository written where the
    init container reads it, and the `--uri` arguments of the fetch init container its Deployment renders."""
    from tests.triton_helpers import fetch_uris
    from triton_operator.api.v1alpha1 import TritonModel
    from triton_operator.files import write_repository
    from triton_operator.render.kubernetes import render_deployment
    from triton_operator.render.modelconfig import render_repository

    model = TritonModel.model_validate({
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "metadata": {"name": "m"},
        "spec": {"backend": "python", "maxBatchSize": 4,
                 "inputs": [{"name": "IN", "dataType": "FP32", "dims": [2]}],
                 "outputs": [{"name": "OUT", "dataType": "FP32", "dims": [2], "labelFilename": "labels.txt"}],
                 "instanceGroups": [{"kind": "CPU", "count": 1}], "source": {"inline": {"model.py": "# m\n"}},
                 "modelFiles": model_files}})
    rendered = render_repository([model])
    return write_repository(rendered, tmp_path / "configmap"), fetch_uris(render_deployment(model, rendered, "uid", "ns"))


@pytest.mark.parametrize("scheme", ["s3", "gs", "https"])
def test_model_files_from_each_server_land_beside_the_config(
        scheme: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.modelFiles.uri (`<model>/.`) over S3, GCS and https: the labels a `labelFilename` names land in the model
    directory beside config.pbtxt, as Triton reads them; the version directory keeps the rendered model.py."""
    from tests.https_server import serve
    from triton_operator.agent.fetch import run

    if scheme == "https":
        (tmp_path / "https").mkdir()
        gen = serve(tmp_path / "https")
        server = next(gen)
        request.addfinalizer(gen.close)
        monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
        server["/labels.tar.gz"] = tgz({"labels.txt": LABELS})
        uri = server.url("/labels.tar.gz")
    else:
        store = request.getfixturevalue("s3" if scheme == "s3" else "gcs")
        if scheme == "s3":
            store.client().put_object(Bucket="models", Key="labels/m/labels.txt", Body=LABELS)
        else:
            store.client().bucket("models").blob("labels/m/labels.txt").upload_from_string(LABELS)
        uri = f"{scheme}://models/labels/m"
    src, uris = _rendered_fetch({"uri": uri}, tmp_path)
    assert uris == [f"m/.={uri}"], uris
    assert run(src, tmp_path / "repo", uris) == 0
    tree = _tree(tmp_path / "repo")
    assert tree["m/labels.txt"] == LABELS, sorted(tree)
    assert tree["m/1/model.py"] == b"# m\n" and "m/config.pbtxt" in tree, sorted(tree)
    assert sorted(tree) == ["m/1/model.py", "m/config.pbtxt", "m/labels.txt"], "nothing else, no staging left"


# ---------------------------------------------------------------- no credentialsSecret: the default chains


#: Nothing on this machine may feed the chains but what a test gives: no shared files, no instance metadata (the
#: EC2 and GCE metadata servers are link-local addresses outside this project), no gcloud configuration.
HERMETIC = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "true", "CLOUDSDK_CONFIG": "/nonexistent"}
PUBLIC_READ = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],
    "Resource": ["arn:aws:s3:::public", "arn:aws:s3:::public/*"]}]}


@pytest.fixture(scope="module")
def public_s3(s3: S3Server) -> S3Server:
    """A bucket anyone may read (versitygw grants anonymous GET and List through a bucket policy)."""
    import json

    client = s3.client()
    client.create_bucket(Bucket="public")
    client.put_object(Bucket="public", Key="models/m/model.py", Body=MODEL_PY)
    client.put_bucket_policy(Bucket="public", Policy=json.dumps(PUBLIC_READ))
    return s3


def test_without_any_s3_credentials_a_public_bucket_is_read_anonymously(public_s3: S3Server, tmp_path: Path) -> None:
    """No credentialsSecret and nothing in the chain: requests go unsigned. Before, boto3 refused to send any
    (NoCredentialsError), so a public bucket could not be fetched without a Secret."""
    env = {**HERMETIC, "AWS_ENDPOINT_URL": public_s3.endpoint, "AWS_REGION": public_s3.region}
    ok = _fetch_cli(tmp_path / "ok", "s3://public/models/m", env)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "ok" / "repo" / "m" / "1" / "model.py").read_bytes() == MODEL_PY
    assert "Found no S3 credentials: requests go anonymous" in ok.stderr
    denied = _fetch_cli(tmp_path / "denied", "s3://models/models/m", env)
    assert denied.returncode == 1, denied.stderr
    last = denied.stderr.strip().splitlines()[-1]
    assert last.startswith("error: fetch failed: s3://models/models/m: access denied to an anonymous request ("), last
    assert "found no S3 credentials" in last and "the bucket is not public" in last
    assert "Traceback" not in denied.stderr


def test_s3_credentials_from_the_environment_and_a_shared_file_without_a_secret(s3: S3Server, tmp_path: Path) -> None:
    """What spec.server.env (or envFrom, a Secret of the user's) puts in the fetch step, and a mounted credentials
    file (AWS_SHARED_CREDENTIALS_FILE): boto3's chain finds each; the log says which."""
    env = {**HERMETIC, "AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key,
           "AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": s3.region}
    ok = _fetch_cli(tmp_path / "env", "s3://models/models/m", env)
    assert ok.returncode == 0 and "Found S3 credentials source=env" in ok.stderr, ok.stderr
    shared = tmp_path / "credentials"
    shared.write_text(f"[default]\naws_access_key_id = {s3.access_key}\naws_secret_access_key = {s3.secret_key}\n")
    env = {**HERMETIC, "AWS_SHARED_CREDENTIALS_FILE": str(shared), "AWS_ENDPOINT_URL": s3.endpoint,
           "AWS_REGION": s3.region}
    ok = _fetch_cli(tmp_path / "file", "s3://models/models/m", env)
    assert ok.returncode == 0 and "Found S3 credentials source=shared-credentials-file" in ok.stderr, ok.stderr
    assert (tmp_path / "file" / "repo" / "m" / "1" / "model.py").read_bytes() == MODEL_PY


def test_a_web_identity_token_is_taken_to_sts_and_its_failures_say_so(s3: S3Server, tmp_path: Path) -> None:
    """IRSA's variables (AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE): boto3's chain exchanges the token at STS before
    the first S3 request. versitygw has no STS (it answers AssumeRoleWithWebIdentity as an unknown S3 call), so this
    proves the path is taken and its failures are told apart, not that a token yields credentials."""
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJSUzI1NiJ9.e30.c2lnbmF0dXJl\n")
    irsa = {**HERMETIC, "AWS_ROLE_ARN": "arn:aws:iam::111122223333:role/model-reader",
            "AWS_WEB_IDENTITY_TOKEN_FILE": str(token), "AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_REGION": s3.region}
    down = _fetch_cli(tmp_path / "down", "s3://models/models/m", {**irsa, "AWS_ENDPOINT_URL_STS": "http://127.0.0.1:9"})
    assert down.returncode == 1, down.stderr
    assert "Found S3 credentials source=assume-role-with-web-identity" in down.stderr
    assert down.stderr.strip().splitlines()[-1] == (
        "error: fetch failed: s3://models/models/m: cannot reach the STS endpoint http://127.0.0.1:9/ to exchange the "
        "web identity token (AWS_WEB_IDENTITY_TOKEN_FILE) for credentials")
    refused = _fetch_cli(tmp_path / "refused", "s3://models/models/m", {**irsa, "AWS_ENDPOINT_URL_STS": s3.endpoint})
    assert refused.returncode == 1, refused.stderr
    assert "STS refused the web identity token (" in refused.stderr.strip().splitlines()[-1], refused.stderr
    assert "Traceback" not in down.stderr + refused.stderr


def test_without_google_credentials_the_chain_runs_and_a_bucket_is_read_anonymously(gcs: GCSServer, tmp_path: Path) -> None:
    """google-auth's default chain, as in a pod with neither a key file nor Workload Identity: the endpoint through
    API_ENDPOINT_OVERRIDE (STORAGE_EMULATOR_HOST would skip the chain), the GCE check off (its metadata server is
    not on this machine). The chain finds nothing and the fetch reads anonymously. fake-gcs-server checks no
    credentials, so a refused anonymous read cannot be shown here."""
    gcs.client().bucket("models").blob("anon/m/model.py").upload_from_string(MODEL_PY)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "STORAGE_EMULATOR", "GOOGLE_"))}
    env = {**clean, **HERMETIC, "API_ENDPOINT_OVERRIDE": gcs.endpoint}
    proc = subprocess.run([str(CLI), "fetch", "--from", str(tmp_path / "cm"), "--to", str(tmp_path / "repo"),
                           "--uri", "m=gs://models/anon/m"], env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Found no GCS credentials: requests go anonymous" in proc.stderr
    assert (tmp_path / "repo" / "m" / "1" / "model.py").read_bytes() == MODEL_PY
