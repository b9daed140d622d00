"""What `triton-operator --help` shows a user, and `run --log-format json`: the user's commands listed, the pod's
programs (`fetch`, `fetch-server`, `probe`) named apart and still runnable; and the operator's log records as one
JSON object a line, each naming the object it is about (kopf's JSON format, `controller/logs.py`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from triton_operator.cli.main import POD_COMMANDS, build_parser
from triton_operator.controller.logs import log_as_json, object_of

USER_COMMANDS = ("render", "validate", "import", "crd", "docs", "run")


def test_help_lists_the_users_commands_and_names_the_pods_apart(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    listing, _, epilog = text.partition("run inside a replica pod")
    listed = [line.split()[0] for line in listing.split("commands:", 1)[1].splitlines()[2:] if line.startswith("    ")
              and not line.startswith("     ")]
    assert listed == list(USER_COMMANDS)
    assert all(c not in listing.split("commands:", 1)[1] for c in ("fetch", "probe"))
    assert all(c in epilog for c in POD_COMMANDS)


@pytest.mark.parametrize("command", POD_COMMANDS)
def test_a_pod_command_stays_runnable_with_its_own_help(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args([command, "--help"])
    assert exit_.value.code == 0
    assert f"usage: triton-operator {command}" in capsys.readouterr().out
    args = {"fetch": ["--from", "a", "--to", "b"], "fetch-server": ["--repository", "r"], "probe": []}[command]
    assert callable(build_parser().parse_args([command, *args]).func)


def test_run_takes_a_log_format_of_text_or_json() -> None:
    assert build_parser().parse_args(["run"]).log_format == "text"
    assert build_parser().parse_args(["run", "--log-format", "json"]).log_format == "json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--log-format", "yaml"])


def test_the_object_a_message_names_is_read_from_its_pairs() -> None:
    assert object_of("Applied Deployment namespace=team-a name=add-sub owner=TritonModel/add-sub") == {
        "namespace": "team-a", "name": "add-sub"}
    assert object_of("Healed replica pod=team-a/add-sub-5f9c-x2 models=add-sub seconds=3.10") == {
        "kind": "Pod", "namespace": "team-a", "name": "add-sub-5f9c-x2"}
    assert object_of("Unloaded model from pool replica namespace=ml pool=shared pod=shared-pool-0 model=m") == {
        "kind": "TritonPool", "namespace": "ml", "name": "shared"}
    assert object_of("Started metrics endpoint port=8081") is None


@pytest.fixture
def root_logging() -> Iterator[None]:
    root, quiet = logging.getLogger(), logging.getLogger("asyncio")
    handlers, level, quiet_handlers, propagate = root.handlers[:], root.level, quiet.handlers[:], quiet.propagate
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    quiet.handlers[:] = quiet_handlers
    quiet.propagate = propagate


@pytest.mark.usefixtures("root_logging")
def test_json_logs_are_one_object_a_line_with_the_objects_namespace_and_name(capsys: pytest.CaptureFixture[str]) -> None:
    log_as_json(logging.INFO)
    ours = logging.getLogger("triton_operator.reconcile")
    ours.info("Applied %s namespace=%s name=%s owner=TritonModel/%s", "Deployment", "team-a", "add-sub", "add-sub")
    ours.warning("Deleting replica pod=%s/%s why=%r", "team-a", "add-sub-7d-x", "broken\nagain")
    ours.debug("below the level: not written")
    logging.getLogger("kopf.objects").info("Handler succeeded", extra={"k8s_ref": {
        "apiVersion": "serving.triton-operator.dev/v1alpha1", "kind": "TritonModel", "name": "m", "namespace": "ns",
        "uid": "u-1"}})
    logging.getLogger("triton_operator").info("Started metrics endpoint port=%d", 8081)
    logging.getLogger("asyncio").error("Task exception was never retrieved")  # as the text format writes it too
    lines = capsys.readouterr().err.splitlines()
    records = [json.loads(line) for line in lines]  # every line is one object: a newline in a value is escaped
    assert len(records) == 5
    applied, deleting, kopfs, started, asyncio_error = records
    assert applied["message"] == "Applied Deployment namespace=team-a name=add-sub owner=TritonModel/add-sub"
    assert applied["object"] == {"namespace": "team-a", "name": "add-sub"} and applied["severity"] == "info"
    assert deleting["object"] == {"kind": "Pod", "namespace": "team-a", "name": "add-sub-7d-x"}
    assert deleting["severity"] == "warn"
    assert kopfs["object"]["namespace"] == "ns" and kopfs["object"]["name"] == "m"
    assert "object" not in started and started["message"] == "Started metrics endpoint port=8081" and "timestamp" in started
    assert asyncio_error["severity"] == "error"
