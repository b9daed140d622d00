"""The repository key (issue 32): replicas restrict Triton's model repository API to a key per model, held in a
Secret the operator creates (never reads) and derived from the operator's master key; only the operator sends it.

Pure checks of what is rendered and planned, the validation that keeps server.args and env off the restriction, the
operator's client (the key goes on repository calls only, checked against a real HTTP server) and `run
--repository-key-file`. Triton's own refusal without the key: tests/test_reload_live.py; on the real node, through a
model's Service: e2e/test_repository_api.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from triton_operator.api.kinds import OWNED
from triton_operator.api.pod import ANNOTATION_POD_DIGEST, KEY_HEADER
from triton_operator.api.v1alpha1 import TritonModel
from triton_operator.plan.planner import World, carried_out, plan
from triton_operator.render.kubernetes import Options, render_children, render_key_secret
from triton_operator.render.modelconfig import render_repository
from triton_operator.render.repository_key import RepositoryKeys, secret_name
from triton_operator.triton.rest import TritonClient, TritonError
from triton_operator.validate.admission import review

NS, UID = "team-a", "00000000-0000-0000-0000-0000000000c1"
KEYS = RepositoryKeys(b"m" * 32)
OPTIONS = Options(repository_keys=KEYS)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _body(**server: Any) -> dict[str, Any]:
    return {"apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel",
            "metadata": {"name": "m", "namespace": NS, "uid": UID, "generation": 1},
            "spec": {"backend": "python", "source": {"inline": {"model.py": "pass\n"}},
                     **({"server": server} if server else {})}}


def _children(options: Options = OPTIONS, **server: Any) -> dict[str, dict[str, Any]]:
    model = TritonModel.model_validate(_body(**server))
    return {c["kind"]: c for c in render_children(model, render_repository([model]), UID, NS, options)}


# -- what replicas get -------------------------------------------------------------------------------------------


def test_tritonserver_restricts_the_repository_api_to_the_key_in_its_env_from_the_models_secret() -> None:
    deployment = _children()["Deployment"]
    triton = deployment["spec"]["template"]["spec"]["containers"][0]
    key = KEYS.key(NS, "m", UID)
    secret = secret_name("m", key)
    restricted = "model-repository,shared-memory,logging,trace:triton-operator-key=$(TRITON_OPERATOR_REPOSITORY_KEY)"
    assert f"--http-restricted-api={restricted}" in triton["args"]
    assert f"--grpc-restricted-protocol={restricted}" in triton["args"]
    assert {"name": "TRITON_OPERATOR_REPOSITORY_KEY",
            "valueFrom": {"secretKeyRef": {"name": secret, "key": "key"}}} in triton["env"]
    # The key itself is nowhere in the Deployment (pod args, env, annotations): whoever reads pods does not learn it.
    assert key not in json.dumps(deployment)
    # The probe beside it holds the same key, from the same Secret: its /status and /gate answer only the operator
    # (issue 39).
    (probe,) = deployment["spec"]["template"]["spec"]["containers"][1:]
    assert probe["name"] == "probe" and probe["env"] == [
        {"name": "TRITON_OPERATOR_REPOSITORY_KEY", "valueFrom": {"secretKeyRef": {"name": secret, "key": "key"}}}]


def test_the_secret_is_immutable_named_by_its_content_and_owned_by_the_model() -> None:
    model = TritonModel.model_validate(_body())
    secret = render_key_secret(model, UID, NS, OPTIONS)
    assert secret is not None
    key = KEYS.key(NS, "m", UID)
    assert secret["metadata"]["name"] == secret_name("m", key) and secret["metadata"]["name"].startswith(
        "m-repository-key-")
    assert secret["immutable"] is True and secret["type"] == "Opaque" and secret["stringData"] == {"key": key}
    assert OWNED.items() <= secret["metadata"]["labels"].items()
    (owner,) = secret["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("TritonModel", "m", UID)
    assert render_key_secret(model, UID, NS, Options()) is None, "no master key, no Secret to make"


def test_each_model_has_a_key_of_its_own_and_the_master_key_stays_hidden() -> None:
    key = KEYS.key(NS, "m", UID)
    assert len(key) == 64 and key == RepositoryKeys(b"m" * 32).key(NS, "m", UID), "derived, so any replica of the "
    others = {KEYS.key("team-b", "m", UID), KEYS.key(NS, "n", UID), KEYS.key(NS, "m", "another-uid"),
              RepositoryKeys(b"n" * 32).key(NS, "m", UID)}
    assert key not in others and len(others) == 4
    assert "mmmm" not in repr(KEYS) and "mmmm" not in repr(OPTIONS)
    with pytest.raises(ValueError, match="at least 32"):
        RepositoryKeys(b"short")


def test_a_new_master_key_renames_the_secret_and_rolls_new_pods() -> None:
    old, new = _children(), _children(Options(repository_keys=RepositoryKeys(b"n" * 32)))
    ann = [d["Deployment"]["spec"]["template"]["metadata"]["annotations"][ANNOTATION_POD_DIGEST] for d in (old, new)]
    assert ann[0] != ann[1], "the same pod digest: an in-place reload would keep replicas holding the old key"


# -- the plan: create, never apply -------------------------------------------------------------------------------


def _world(**kw: Any) -> World:
    body = kw.pop("body", None) or _body()
    return World(body=body, models={"m": body}, children=kw.pop("children", {}), pods=kw.pop("pods", []), now=T0,
                 options=kw.pop("options", OPTIONS), **kw)


def test_unrestricted_apis_opens_the_categories_named_and_says_so_in_status_events_and_admission() -> None:
    """issue 39 H1: Triton's admin APIs are restricted by default; `spec.server.unrestrictedApis` opens some by name
    (never the repository API), and the model says so: AdminApisRestricted=False, a Warning Event, an admission
    warning. A model that opens none carries no such condition."""
    args = _children(unrestrictedApis=["shared-memory", "trace"])["Deployment"]["spec"]["template"]["spec"][
        "containers"][0]["args"]
    restricted = "model-repository,logging:triton-operator-key=$(TRITON_OPERATOR_REPOSITORY_KEY)"
    assert f"--http-restricted-api={restricted}" in args and f"--grpc-restricted-protocol={restricted}" in args, args

    opened = plan(_world(body=_body(unrestrictedApis=["shared-memory"])))
    assert opened.status is not None
    cond = next(c for c in opened.status.conditions or () if c.type == "AdminApisRestricted")
    assert (cond.status, cond.reason) == ("False", "OpenedInSpec") and "shared-memory" in cond.message, cond
    assert any(e.type == "Warning" and e.reason == "OpenedInSpec" for e in opened.events), opened.events
    closed = plan(_world())
    assert closed.status is not None and all(c.type != "AdminApisRestricted" for c in closed.status.conditions or ())

    fixed = "nvcr.io/nvidia/tritonserver:26.03-py3"
    assert review(_body(unrestrictedApis=["logging"], image=fixed), None, {}).warnings == [
        "spec.server.unrestrictedApis: Triton's logging API answers every client of the replicas, without the "
        "operator's key"]
    assert review(_body(image=fixed), None, {}).warnings == []
    refused = review(_body(unrestrictedApis=["model-repository"]), None, {})
    assert not refused.allowed and any(e.path.startswith("spec.server.unrestrictedApis") for e in refused.errors), \
        refused.errors


def test_the_first_reconcile_creates_the_secret_before_the_deployment_names_it_and_never_applies_it() -> None:
    first = plan(_world())
    (secret,) = first.create
    assert secret["kind"] == "Secret" and not [a for a in first.apply if a.obj["kind"] == "Secret"]
    deployment = next(a.obj for a in first.apply if a.obj["kind"] == "Deployment")
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    assert any((e.get("valueFrom") or {}).get("secretKeyRef", {}).get("name") == secret["metadata"]["name"] for e in env)
    # Carried out, the live Deployment names it: planning again creates nothing (a second reconcile writes nothing).
    after = carried_out(_world(), first)
    assert not plan(after).create and plan(after).writes_nothing, plan(after)
    assert not plan(_world(options=Options())).create, "without a master key, nothing to create"


def _waiting(secret: str) -> dict[str, Any]:
    return {"metadata": {"name": "m-abc", "namespace": NS, "labels": {"serving.triton-operator.dev/model": "m"}},
            "status": {"containerStatuses": [{"name": "tritonserver", "state": {"waiting": {
                "reason": "CreateContainerConfigError", "message": f'secret "{secret}" not found'}}}]}}


def test_a_secret_deleted_by_hand_is_created_again_when_a_replica_cannot_start_without_it() -> None:
    settled = carried_out(_world(), plan(_world()))
    name = secret_name("m", KEYS.key(NS, "m", UID))
    assert not plan(settled).create
    assert [s["metadata"]["name"] for s in plan(dataclasses.replace(settled, pods=[_waiting(name)])).create] == [name]
    assert not plan(dataclasses.replace(settled, pods=[_waiting("someone-elses")])).create


# -- validation: the user's spec cannot lift the restriction -----------------------------------------------------


@pytest.mark.parametrize("args", [
    ["--http-restricted-api=model-repository:k=v"],
    ["--log-verbose=1", "--grpc-restricted-protocol=model-repository:k=v"],
    ["--http-restricted=model-repository:k=v"],  # Triton (getopt_long) reads a prefix as the flag (verified on 2.51)
    ["--grpc-restricted-p", "model-repository:k=v"],
    ["--http-restricted-api", "health:k=v"],
], ids=["http", "grpc", "http-prefix", "grpc-prefix-separate-value", "another-category"])
def test_server_args_may_not_set_the_restriction(args: list[str]) -> None:
    body = _body(args=args)
    verdict = review(body, None, {})
    assert not verdict.allowed
    index = next(i for i, a in enumerate(args) if a.startswith(("--http-r", "--grpc-re")))
    assert any(e.path == f"spec.server.args[{index}]" and "restricts Triton's model repository API" in e.message
               for e in verdict.errors), verdict.errors


def test_server_args_that_only_look_alike_are_allowed() -> None:
    assert review(_body(args=["--http-port=8000", "--grpc-root-cert=/c", "--log-verbose=1"]), None, {}).allowed


def test_env_may_not_set_the_key_variable() -> None:
    verdict = review(_body(env=[{"name": "TRITON_OPERATOR_REPOSITORY_KEY", "value": "known"}]), None, {})
    assert not verdict.allowed
    assert any(e.path == "spec.server.env[0].name" for e in verdict.errors), verdict.errors


def test_the_crd_refuses_them_too() -> None:
    from triton_operator.api.crd import crd

    rules = json.dumps(crd())
    assert "!a.startsWith('--http-r') && !a.startsWith('--grpc-re')" in rules
    assert "'TRITON_OPERATOR_REPOSITORY_KEY'" in rules


# -- the operator's client: the key on repository calls, and only there ------------------------------------------


def test_the_client_sends_the_key_on_repository_calls_only() -> None:
    seen: list[tuple[str, str | None]] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get(KEY_HEADER)))
        if request.path.endswith("/ready"):
            return web.Response(status=200)
        if request.path == "/v2/repository/index":
            return web.json_response([])
        if request.path.endswith("/stats"):
            return web.json_response({"model_stats": []})
        return web.json_response({})

    async def run() -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with TritonClient(f"127.0.0.1:{port}", "the-key") as client:
                await client.is_model_ready("m")
                await client.statistics("m")
                await client.repository_index()
            async with TritonClient(f"127.0.0.1:{port}") as client:
                await client.repository_index()
        finally:
            await runner.cleanup()

    asyncio.run(run())
    assert seen == [("/v2/models/m/ready", None), ("/v2/models/m/stats", None), ("/v2/repository/index", "the-key"),
                    ("/v2/repository/index", None)]
    assert issubclass(TritonError, Exception)


# -- run --repository-key-file ---------------------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "triton_operator.cli.main", "run", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_missing_or_short_key_file_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "c",
                                  "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                                  "users": [{"name": "u", "user": {"token": "t"}}],
                                  "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    missing = tmp_path / "nope"
    short = tmp_path / "short"
    short.write_text("too short\n")
    for path, says in ((missing, "cannot read"), (short, "holds 9 bytes")):
        proc = _run("--kubeconfig", str(config), "--metrics-port", "0", "--repository-key-file", str(path))
        assert proc.returncode != 0, proc
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--repository-key-file" in lines[0] and str(path) in lines[0] and says in lines[0], (
            proc.stderr)


def test_a_model_without_an_image_runs_the_operators_default_triton_image(tmp_path: Path) -> None:
    """issue 39 item 3: an unset spec.server.image renders as the operator's --default-triton-image (Options), whose
    own default is the minimum supported release; `render --objects --default-triton-image` shows the same."""
    from triton_operator import DEFAULT_TRITON_IMAGE, MINIMUM_TRITON_RELEASE

    def image(children: dict[str, dict[str, Any]]) -> str:
        containers = children["Deployment"]["spec"]["template"]["spec"]["containers"]
        return str(next(c["image"] for c in containers if c["name"] == "tritonserver"))

    assert DEFAULT_TRITON_IMAGE.endswith(f":{MINIMUM_TRITON_RELEASE}-py3")
    assert image(_children()) == DEFAULT_TRITON_IMAGE
    mirror = "registry.example/mirror/tritonserver:26.03-py3"
    assert image(_children(Options(default_triton_image=mirror))) == mirror
    assert image(_children(Options(default_triton_image=mirror), image="registry.example/own:1")) == (
        "registry.example/own:1")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(json.dumps(_body()))
    proc = subprocess.run([sys.executable, "-m", "triton_operator.cli.main", "render", "--objects",
                           "--default-triton-image", mirror, str(manifest)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert f"image: {mirror}" in proc.stdout and DEFAULT_TRITON_IMAGE not in proc.stdout, proc.stdout


def test_admission_warns_of_a_triton_release_before_the_minimum_supported_one() -> None:
    """issue 39 item 3: an NGC tritonserver before 26.03 (the minimum supported release, which fixed CVE-2026-24207) is
    allowed with a warning naming the release and the advisories it lacks (before 25.07, the August 2025 ones too);
    26.03 and later, no image (the operator's default), and images not named by an NGC release tag get none."""
    for old, also in (("nvcr.io/nvidia/tritonserver:24.10-py3", True),
                      ("registry.example/mirror/tritonserver:25.06-py3-sdk", True),
                      ("nvcr.io/nvidia/tritonserver:25.07-py3", False), ("nvcr.io/nvidia/tritonserver:26.02-py3", False)):
        (warning,) = review(_body(image=old), None, {}).warnings
        assert warning.startswith("spec.server.image: Triton 2") and "predates 26.03" in warning, warning
        assert "CVE-2026-24207" in warning and ("CVE-2025-23310" in warning and "CVE-2025-23319" in warning) == also, (
            warning)
        assert review(_body(image=old), None, {}).allowed
    for fine in ("nvcr.io/nvidia/tritonserver:26.03-py3", "nvcr.io/nvidia/tritonserver:26.10-py3",
                 "registry.example/triton:latest", None):
        assert review(_body(image=fine) if fine else _body(), None, {}).warnings == [], fine
