"""Every input error of the `triton-operator` commands is one line naming the file, with a non-zero exit:
no Python traceback for a file that is not UTF-8, not readable, or not YAML."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from triton_operator.cli.main import main

CONSOLE_SCRIPT = Path(sys.executable).parent / "triton-operator"
NOT_UTF8 = b"apiVersion: serving.triton-operator.dev/v1alpha1\nkind: TritonModel\nmetadata: {name: caf\xe9}\n"
UTF16 = "kind: TritonModel\n".encode("utf-16")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False)


def _one_line_naming(proc: subprocess.CompletedProcess[str], path: Path, *says: str) -> None:
    explain = f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode != 0, explain
    assert "Traceback" not in proc.stderr, explain
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, explain
    assert str(path) in lines[0] and lines[0].startswith("error: "), explain
    for s in says:
        assert s in lines[0], explain


@pytest.mark.parametrize("command", ["render", "validate"])
def test_a_file_that_is_not_utf8(command: str, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    _one_line_naming(_run(command, str(bad)), bad, "not UTF-8", "0xe9", "line 3")


def test_a_utf16_file_in_a_directory(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    bad = tmp_path / "specs" / "wide.yaml"
    bad.write_bytes(UTF16)
    _one_line_naming(_run("render", str(tmp_path / "specs"), "-o", str(tmp_path / "out")), bad, "not UTF-8")
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "secret.yaml"
    bad.write_text("kind: TritonModel\n")
    bad.chmod(0)
    _one_line_naming(_run("render", str(bad)), bad, "cannot read")


def test_yaml_that_does_not_parse_is_one_line_with_its_position(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: TritonModel\nspec: [unclosed\n")
    proc = _run("render", str(broken))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    [problem] = [ln for ln in proc.stderr.splitlines() if "not valid YAML" in ln]
    assert str(broken) in problem and "line 3" in problem, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 2, "the count, then the one problem"


def test_import_of_a_config_that_is_not_utf8(tmp_path: Path) -> None:
    config = tmp_path / "repo" / "m" / "config.pbtxt"
    config.parent.mkdir(parents=True)
    config.write_bytes(b'name: "m"\nbackend: "python"\n# r\xe9sum\xe9\n')
    _one_line_naming(_run("import", str(tmp_path / "repo")), config, "not UTF-8")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_import_of_an_unreadable_version_file(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    (model / "1" / "model.py").write_text("pass\n")
    (model / "1" / "model.py").chmod(0)
    _one_line_naming(_run("import", str(tmp_path / "repo")), model / "1" / "model.py", "cannot read")


def test_docs_update_of_a_file_that_is_not_utf8_or_missing(tmp_path: Path) -> None:
    bad = tmp_path / "README.md"
    bad.write_bytes(b"# caf\xe9\n")
    _one_line_naming(_run("docs", "--update", str(bad)), bad, "not UTF-8")
    _one_line_naming(_run("docs", "--update", str(tmp_path / "missing.md")), tmp_path / "missing.md", "cannot read")


def test_an_output_path_that_cannot_be_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not input, but the same promise: `-o` onto a regular file is one line naming it."""
    blocker = tmp_path / "out"
    blocker.write_text("a file, not a directory\n")
    examples = Path(__file__).resolve().parent.parent / "examples" / "add-sub.yaml"
    _one_line_naming(_run("render", str(examples), "-o", str(blocker)), blocker, "cannot write")


def test_in_process_the_same(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(NOT_UTF8)
    assert main(["render", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(bad) in err


# -- `run`: its kubeconfig and certificate directory are refused at start, in one line (issue 28)


def test_run_with_a_kubeconfig_that_is_missing_malformed_or_a_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    _one_line_naming(_run("run", "--kubeconfig", str(missing)), missing, "no such file")
    broken = tmp_path / "broken"
    broken.write_text("clusters: [unclosed\n")
    _one_line_naming(_run("run", "--kubeconfig", str(broken)), broken, "not valid YAML", "line 2")
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"current-context: caf\xe9\n")
    _one_line_naming(_run("run", "--kubeconfig", str(latin1)), latin1, "not UTF-8")
    _one_line_naming(_run("run", "--kubeconfig", str(tmp_path)), tmp_path, "not a file")


def test_run_with_a_kubeconfig_field_it_does_not_honour(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {auth-provider: {name: oidc, config: {idp-issuer-url: 'https://issuer'}}}}]\n")
    proc = _run("run", "--kubeconfig", str(config), "--metrics-port", "0")
    _one_line_naming(proc, config, "users[0].user.auth-provider (oidc) is not supported",
                     "use an exec credential plugin such as kubelogin")


def test_run_with_a_webhook_certificate_directory_that_cannot_be_loaded(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("current-context: c\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
                      "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n")
    (tmp_path / "certs").mkdir()
    for certs in (tmp_path / "missing", tmp_path / "certs"):
        proc = _run("run", "--kubeconfig", str(config), "--metrics-port", "0", "--webhook-url", "https://127.0.0.1:9443",
                    "--webhook-cert-dir", str(certs))
        explain = f"exit {proc.returncode}\n--- stderr ---\n{proc.stderr}"
        assert proc.returncode != 0 and "Traceback" not in proc.stderr, explain
        assert proc.stderr.strip().splitlines() == [f"--webhook-cert-dir: cannot load {certs}/tls.crt and tls.key: "
                                                     "No such file or directory"], explain


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_run_with_an_unreadable_kubeconfig(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("current-context: c\n")
    config.chmod(0)
    _one_line_naming(_run("run", "--kubeconfig", str(config)), config, "cannot read")


# -- YAML as written: a duplicate key, deep nesting and alias bombs are refused with the line; nothing is coerced


MODEL = """apiVersion: serving.triton-operator.dev/v1alpha1
kind: TritonModel
metadata:
  name: m
spec:
  backend: python
  maxBatchSize: 4
  inputs: [{name: INPUT, dataType: FP32, dims: [4]}]
  outputs: [{name: OUTPUT, dataType: FP32, dims: [4]}]
  instanceGroups: [{kind: CPU, count: 1}]
  source: {inline: {model.py: "# m"}}
"""


def _refused(proc: subprocess.CompletedProcess[str], where: Path | str, *says: str) -> str:
    """The count line, then one problem line naming the file (or the object); no traceback."""
    explain = f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, explain
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0] == "error: 1 problem(s) found:", explain
    assert str(where) in lines[1], explain
    for s in says:
        assert s in lines[1], explain
    return lines[1]


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    """It used to take the last value silently."""
    f = tmp_path / "twice.yaml"
    f.write_text(MODEL + "  maxBatchSize: 8\n")
    _refused(_run("render", str(f)), f, "line 12", "duplicate key 'maxBatchSize' (first at line 7)")


def test_nesting_thousands_of_levels_deep_is_refused_with_the_line(tmp_path: Path) -> None:
    """It used to end in a RecursionError traceback."""
    f = tmp_path / "deep.yaml"
    f.write_text(MODEL.replace("  backend: python\n", "  backend: python\n  parameters: {x: " + "[" * 5000 + "]" * 5000 + "}\n"))
    _refused(_run("render", str(f)), f, "line 7", "nested more than 100 levels deep")


@pytest.mark.parametrize(("aliases", "says"), [
    ("".join(f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'x'] * 10)}]\n" for i in range(8)),
     "expand it to more than 100000 values"),
    ("      loop: &loop [x, *loop]\n", "holds itself"),
])
def test_aliases_that_expand_past_the_limit_or_into_themselves_are_refused(tmp_path: Path, aliases: str,
                                                                           says: str) -> None:
    f = tmp_path / "aliases.yaml"
    f.write_text(MODEL + "  server:\n    affinity:\n" + aliases)
    _refused(_run("render", str(f)), f, says)


@pytest.mark.parametrize(("written", "path", "got"), [
    ("maxBatchSize: '8'", "spec.maxBatchSize", "got str '8'"),
    ("maxBatchSize: true", "spec.maxBatchSize", "got bool True"),
    ("decoupled: 'true'", "spec.decoupled", "got str 'true'"),
])
def test_strings_and_booleans_are_not_taken_for_numbers(tmp_path: Path, written: str, path: str, got: str) -> None:
    """`"8"` used to be read as 8 and `true` as 1; the API server refuses both."""
    f = tmp_path / "typed.yaml"
    key = written.split(":", maxsplit=1)[0]
    f.write_text("\n".join(ln for ln in MODEL.splitlines() if not ln.startswith(f"  {key}:")) + f"\n  {written}\n")
    line = _refused(_run("render", str(f)), "TritonModel/m", f"{path}: ", got)
    assert "Input should be a valid" in line


def test_a_date_is_the_string_it_was_written_as(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As the API server reads YAML: no datetime, which no JSON holds."""
    f = tmp_path / "dated.yaml"
    f.write_text(MODEL + "  parameters: {since: 2024-01-31}\n")
    assert main(["render", str(f)]) == 0, capsys.readouterr().err
    assert 'string_value: "2024-01-31"' in capsys.readouterr().out


def test_a_tag_that_makes_no_json_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "tagged.yaml"
    f.write_text(MODEL + "  parameters: {blob: !!binary aGk=}\n")
    _refused(_run("render", str(f)), f, "line 12", "makes no JSON value")


def test_run_with_a_kubeconfig_key_given_twice(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("current-context: a\ncurrent-context: b\n")
    _one_line_naming(_run("run", "--kubeconfig", str(config)), config, "duplicate key 'current-context'", "line 2")
