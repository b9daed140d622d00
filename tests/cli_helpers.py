"""The `triton-operator` command line run in this process (`cli`), and the ModelConfigs it writes compared: parsed from a
repository (`configs_under`), normalized to what Triton would serve (`normalized`), and diffed (`diff`)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from triton_operator.api.pod import DIGEST_PARAMETER
from triton_operator.cli.main import main
from triton_operator.importer import parse_config


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`triton-operator ARGV` in this process: (exit code, stdout, stderr)."""
    capsys.readouterr()
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def configs_under(root: Path) -> dict[str, pb.ModelConfig]:
    """Every <model>/config.pbtxt under a repository, parsed, by directory name."""
    return {p.parent.name: parse_config(p.read_text()) for p in sorted(root.glob("*/config.pbtxt"))}


def without_digest(cfg: pb.ModelConfig) -> pb.ModelConfig:
    out = pb.ModelConfig()
    out.CopyFrom(cfg)
    if DIGEST_PARAMETER in out.parameters:
        del out.parameters[DIGEST_PARAMETER]
    return out


def diff(a: pb.ModelConfig, b: pb.ModelConfig, a_name: str, b_name: str) -> str:
    return "".join(
        difflib.unified_diff(
            text_format.MessageToString(a).splitlines(keepends=True),
            text_format.MessageToString(b).splitlines(keepends=True),
            a_name,
            b_name,
        )
    )


def clear_path(cfg: pb.ModelConfig, path: str) -> None:
    """Clear one field named by an importer warning path such as `output[0].label_filename`."""
    msg = cfg
    parts = path.split(".")
    for part in parts[:-1]:
        m = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", part)
        assert m, path
        msg = getattr(msg, m.group(1))
        if m.group(2) is not None:
            msg = msg[int(m.group(2))]
    msg.ClearField(parts[-1])


def normalized(cfg: pb.ModelConfig, dropped: list[str] = ()) -> pb.ModelConfig:
    """`cfg` without our digest, the fields import reported as dropped, instance group names (Triton
    names groups itself), and with the defaults Triton fills in at load made explicit (instance
    count 0 -> 1, sequence idle 0 -> 1 s: what `get_model_config` returns either way)."""
    out = without_digest(cfg)
    for path in dropped:
        clear_path(out, path)
    for g in out.instance_group:
        g.ClearField("name")
        g.count = g.count or 1
    if out.HasField("sequence_batching"):
        sb = out.sequence_batching
        sb.max_sequence_idle_microseconds = sb.max_sequence_idle_microseconds or 1_000_000
    return out
