"""The `triton-operator` command: render, validate, import, crd, and (from the controller) run, fetch and probe."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import DEFAULT_TRITON_IMAGE, __version__

if TYPE_CHECKING:
    from ..api.v1alpha1 import TritonModel
    from ..render.modelconfig import RenderedModel
    from ..validate import Loaded


class CliError(Exception):
    """An input or output problem, said in one line that names the file; the command exits 1."""


def _err(msg: str) -> None:
    """Errors, warnings and progress: stderr, so stdout carries only what a command outputs."""
    print(msg, file=sys.stderr, flush=True)


def _decode(path: Path, data: bytes) -> str:
    from ..files import InputError, decode

    try:
        return decode(path, data)
    except InputError as exc:
        raise CliError(str(exc)) from exc


def _read_text(path: Path) -> str:
    from ..files import InputError, read_text

    try:
        return read_text(path)
    except InputError as exc:
        raise CliError(str(exc)) from exc


def _write(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise CliError(f"{exc.filename or path}: cannot write: {exc.strerror or exc}") from exc


def _load_and_check(paths: Sequence[str]) -> Loaded | None:
    from ..files import InputError, load_paths
    from ..validate import check_documents

    missing = [p for p in paths if not Path(p).exists()]
    if missing:
        _err(f"error: no such file or directory: {', '.join(missing)}")
        return None
    try:
        docs = load_paths(paths)
    except InputError as exc:
        raise CliError(str(exc)) from exc
    loaded = check_documents(docs)
    if loaded.errors:
        _err(f"error: {len(loaded.errors)} problem(s) found:")
        for e in sorted(loaded.errors, key=lambda e: (e.model, e.path)):
            _err(f"  {e}")
        return None
    if not loaded.models:
        _err("error: no TritonModel documents found")
        return None
    return loaded


def _write_repository(rendered: Mapping[str, RenderedModel], out: Path) -> None:
    from ..files import write_repository

    try:
        write_repository(rendered, out)
    except OSError as exc:
        raise CliError(f"{exc.filename or out}: cannot write: {exc.strerror or exc}") from exc


def _objects(loaded: Loaded, namespace: str | None, operator_image: str | None, triton_image: str | None) -> str:
    """The Kubernetes objects the operator applies for each TritonModel, as a multi-document YAML stream."""
    import yaml

    from ..render.kubernetes import Options, RepositoryTooLarge, render_children
    from ..render.modelconfig import render_repository
    from ..render.pool import render_model_service, render_pool_children

    models = [m for _, m in loaded.models]
    rendered = render_repository(models)  # as the operator renders: no --cpu, replicas' /models
    defaults = Options()
    options = Options(operator_image=operator_image or defaults.operator_image,
                      default_triton_image=triton_image or defaults.default_triton_image)
    docs = []
    for _, pool in loaded.pools:
        uid = str(pool.metadata.model_extra.get("uid") or "") if pool.metadata.model_extra else ""
        for child in render_pool_children(pool, uid, namespace or pool.metadata.namespace or "default", options):
            if not uid:
                del child["metadata"]["ownerReferences"]
            docs.append(child)
    for m in models:
        uid = str(m.metadata.model_extra.get("uid") or "") if m.metadata.model_extra else ""
        ns = namespace or m.metadata.namespace or "default"
        try:
            # A pooled model runs on its pool's replicas: its own objects are its selectorless Service (the operator
            # writes its EndpointSlices as it loads it).
            children = [render_model_service(m, uid, ns)] if m.spec.pool else render_children(m, rendered, uid, ns, options)
        except RepositoryTooLarge as exc:
            raise CliError(f"TritonModel/{m.name}: {exc}") from exc
        for child in children:
            if not uid:  # the API server gives the TritonModel its uid: without one, no owner reference to show
                del child["metadata"]["ownerReferences"]
            docs.append(child)

    class Dumper(yaml.SafeDumper):
        def ignore_aliases(self, data: object) -> bool:
            return True  # every object written out in full, as kubectl shows it

    def text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        # A file of the repository ConfigMap as a block, readable in a review (PyYAML falls back where it cannot).
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)

    head = ("# The objects triton-operator applies for these TritonModels (triton-operator render --objects).\n"
            "# Not shown: the Secret each model's replicas read their repository key from, which the operator creates\n"
            "# from its master key; its name ends in the key's digest (here, without one: <model>-repository-key);\n"
            "# and the labels the operator records on each Deployment's metadata (the spec it was rendered from, an\n"
            "# upgrade rollout's start), never on its selector or pod template.\n")
    return head + yaml.dump_all(docs, Dumper=Dumper, sort_keys=False, width=120, explicit_start=True)


def cmd_render(args: argparse.Namespace) -> int:
    from ..render.modelconfig import REPOSITORY_ROOT, render_repository

    loaded = _load_and_check(args.paths)
    if loaded is None:
        return 1
    root = args.repository_root or REPOSITORY_ROOT
    rendered = render_repository([m for _, m in loaded.models], cpu_only=args.cpu, repository_root=root)
    if args.output:
        out = Path(args.output)
        _write_repository(rendered, out)
        _err(f"Wrote model repository with {len(rendered)} model(s) to {out}")
    if args.objects:
        if args.cpu or args.repository_root:
            raise CliError("--objects prints what the operator applies, which maps no GPU group to CPU and mounts the "
                           "repository at /models: drop --cpu and --repository-root")
        sys.stdout.write(_objects(loaded, args.namespace, args.operator_image, args.default_triton_image))
        return 0
    for r in rendered.values():
        print(f"# {r.name}/config.pbtxt (TritonModel {r.model.name}, digest {r.digest})")
        print(r.config_pbtxt, end="" if r.config_pbtxt.endswith("\n") else "\n")
    return 0


def _fetched_at_pod_start(model: TritonModel) -> str | None:
    """The first uri `model`'s files come from (a version's source, or spec.modelFiles), if any, as it may be
    printed (no query, fragment or userinfo)."""
    from ..uris import shown

    sources = [*model.spec.version_sources.values(), model.spec.model_files]
    return next((shown(s.uri) for s in sources if s is not None and s.uri), None)


def _skipped_at_pod_start(rendered: Mapping[str, RenderedModel]) -> dict[str, str]:
    """The models `validate` cannot load here, and why: files behind a uri arrive only at pod start (the fetch init
    container), so such a model, and an ensemble that runs it, cannot load here. Said, instead of Triton's "at least
    one version must be available"."""
    from ..render.modelconfig import step_closure

    fetched = {r.name: uri for r in rendered.values() if (uri := _fetched_at_pod_start(r.model))}
    skipped = {}
    for r in rendered.values():
        behind = [n for n in step_closure(r.name, rendered) if n in fetched]
        if behind:
            step = behind[0]
            skipped[r.name] = (f"its files come from {fetched[step]} at pod start" if step == r.name
                               else f"its step {step} gets its files from {fetched[step]} at pod start")
    return skipped


def _load_each(client: Any, order: Sequence[RenderedModel], width: int, timeout: float) -> int:
    """Loads each model of `order` into the local tritonserver and prints how it went; the number that failed."""
    from ..triton.client import load_model

    failed = 0
    for i, r in enumerate(order, 1):
        _err(f"[{i}/{len(order)}] Loading {r.name} (load and warm-up)…")
        res = load_model(client, r.name, timeout=timeout)
        if res.ready:
            warm = len(r.config.model_warmup)
            detail = f"loaded and warmed in {res.seconds:.2f}s"
            if warm:
                detail += f" ({warm} warm-up sample(s), {res.warmup_executions} execution(s))"
            print(f"{r.name:<{width}}  READY   {detail}", flush=True)
        else:
            failed += 1
            print(f"{r.name:<{width}}  FAILED  after {res.seconds:.2f}s: {res.reason}", flush=True)
    return failed


def cmd_validate(args: argparse.Namespace) -> int:
    from ..api.v1alpha1 import quantity_bytes
    from ..render.modelconfig import render_repository
    from ..triton.local import TRITON_VERSION, LocalTritonServer, TritonNotInstalled
    from ..validate.rules import RULES

    loaded = _load_and_check(args.paths)
    if loaded is None:
        return 1
    models = [m for _, m in loaded.models]
    _err(f"Validated {len(models)} TritonModel(s): schema and {len(RULES)} rules passed")
    gpu = [m.name for m in models if any(g.kind == "GPU" for g in m.spec.instance_groups or ())]
    if gpu and not args.cpu:
        _err(f"Note: {', '.join(gpu)} ask for KIND_GPU instances; pass --cpu to check them on a machine without GPUs")
    cache = max((quantity_bytes(m.spec.server.cache_size) for m in models if m.spec.response_cache), default=0)
    with tempfile.TemporaryDirectory(prefix="triton-validate-") as tmp:
        repo = Path(tmp) / "models"
        # The local server finds the repository here, not at a replica's /models (a strategy file's path says where).
        rendered = render_repository(models, cpu_only=args.cpu, repository_root=str(repo.resolve()))
        _write_repository(rendered, repo)
        skipped = _skipped_at_pod_start(rendered)
        width = max(len(name) for name in rendered)
        for name, why in sorted(skipped.items()):
            print(f"{name:<{width}}  SKIPPED {why}: not loaded here (its config passed the checks above)", flush=True)
        if len(skipped) == len(rendered):
            _err(f"No model loaded: all {len(rendered)} get their files at pod start; their configs passed the checks")
            return 0
        try:  # tritonclient's gRPC client comes with the `server` extra, as tritonserver does (not in the image)
            from ..triton.client import connect
        except (ImportError, RuntimeError) as exc:  # tritonclient says RuntimeError when grpc or numpy is missing
            _err(f"error: loading models needs the 'server' extra (pip install 'triton-operator[server]'): {exc}")
            return 2
        server = LocalTritonServer(model_repository=repo, cache_size=cache or None, log_path=Path(tmp) / "tritonserver.log")
        _err(f"Starting tritonserver {TRITON_VERSION} on {server.host}…")
        t0 = time.monotonic()
        try:
            server.start(timeout=args.timeout)
        except (TritonNotInstalled, RuntimeError, TimeoutError) as exc:
            _err(f"error: {exc}")
            return 2
        _err(f"Started tritonserver in {time.monotonic() - t0:.1f}s (gRPC port {server.grpc_port})")
        # steps before ensembles, so a step's own failure is reported against the step
        order = sorted((r for r in rendered.values() if r.name not in skipped),
                       key=lambda r: (r.model.spec.is_ensemble, r.model.name))
        failed = 0
        try:
            failed = _load_each(connect(server.grpc_url), order, width, args.load_timeout)
        finally:
            server.stop()
        if failed and args.show_log:
            _err("--- tritonserver log (tail) ---")
            _err(server.log_tail(80))
    if failed:
        _err(f"error: {failed} of {len(order)} model(s) failed to load in tritonserver")
        return 1
    if skipped:
        _err(f"All {len(order)} loaded model(s) READY in a real tritonserver {TRITON_VERSION}; "
             f"{len(skipped)} skipped (files fetched at pod start)")
    else:
        _err(f"All {len(order)} model(s) READY in a real tritonserver {TRITON_VERSION}")
    return 0


#: The largest file `import` reads: one the manifest can carry inline (a file's text in the repository ConfigMap,
#: which holds 1 MiB in all). A larger version or model file is left where it is, for a uri; it is not read at all.
IMPORT_FILE_MAX = 1 << 20
#: The most `import` reads in all: past it, files are left where they are, as larger ones are.
IMPORT_TOTAL_MAX = 64 << 20


class _Repository:
    """The model repository `import` reads: only what lies inside it (a symbolic link out of it is refused, not
    copied into the manifest), and only files small enough to inline."""

    def __init__(self, root: Path) -> None:
        self.root, self.real = root, root.resolve()
        self.budget = IMPORT_TOTAL_MAX

    def inside(self, path: Path) -> Path:
        """`path`, after checking that it (and any link on the way) stays in the repository."""
        real = path.resolve()
        if not real.is_relative_to(self.real):
            raise CliError(f"{path}: a symbolic link out of the model repository (to {real}): import copies the files "
                           f"it reads into the manifest, and reads none from outside {self.root}")
        return path

    def read(self, path: Path, limit: int = IMPORT_FILE_MAX) -> bytes | None:
        """The bytes of `path`, or None when it holds more than `limit` (or than what is left to read in all)."""
        self.inside(path)
        try:
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size > min(limit, self.budget):
                    return None
                data = f.read(limit + 1)  # the file may have grown since
        except OSError as exc:
            raise CliError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        if len(data) > min(limit, self.budget):
            return None
        self.budget -= len(data)
        return data

    def files(self, directory: Path) -> list[Path]:
        """The files under `directory`, each checked to lie in the repository (no directory link is followed)."""
        found = []
        for f in sorted(directory.rglob("*")):
            self.inside(f)
            if f.is_file() and "__pycache__" not in f.parts:
                found.append(f)
        return found


def _parse_configs(repo: _Repository, configs: Sequence[Path]) -> dict[Path, Any] | None:
    """Each model directory's config.pbtxt, parsed (named after its directory when it names no model); None when
    one does not parse, which is said."""
    from ..importer import parse_config

    parsed = {}
    for d in configs:
        data = repo.read(d / "config.pbtxt")
        if data is None:
            raise CliError(f"{d / 'config.pbtxt'}: over {IMPORT_FILE_MAX} bytes, more than a model's config can be "
                           "(the repository ConfigMap holds 1 MiB)")
        text = _decode(d / "config.pbtxt", data)
        try:
            cfg = parse_config(text)
        except Exception as exc:  # noqa: BLE001 - text_format raises several types
            _err(f"error: {d / 'config.pbtxt'}: {exc}")
            return None
        if not cfg.name:
            cfg.name = d.name
        parsed[d] = cfg
    return parsed


def _warmup_and_own_files(repo: _Repository, d: Path) -> tuple[dict[str, bytes | None], dict[str, bytes | None]]:
    """A model directory's warm-up files, and its own files (labels beside config.pbtxt, ...): everything but the
    config, warmup/ and the version directories. None for a file too large to inline: left where it is."""
    warm_dir = repo.inside(d / "warmup")
    warm = {f.name: repo.read(f) for f in sorted(map(repo.inside, warm_dir.iterdir())) if f.is_file()} \
        if warm_dir.is_dir() else {}
    own = [repo.inside(p) for p in d.iterdir()
           if p.name not in ("config.pbtxt", "warmup") and not (p.is_dir() and p.name.isdigit())]
    model_files = {
        str(f.relative_to(d)): repo.read(f)
        for p in sorted(own) for f in ([p] if p.is_file() else repo.files(p))
        if "__pycache__" not in f.parts
    }
    return warm, model_files


def cmd_import(args: argparse.Namespace) -> int:
    import yaml

    from ..importer import import_config, k8s_name
    from ..validate import Document, FieldError, check_documents

    root = Path(args.repository)
    if not root.is_dir():
        _err(f"error: {root} is not a directory")
        return 1
    repo = _Repository(root)
    configs = sorted(repo.inside(p) for p in root.iterdir() if (p / "config.pbtxt").is_file())
    if not configs:
        _err(f"error: no <model>/config.pbtxt under {root}")
        return 1
    parsed = _parse_configs(repo, configs)
    if parsed is None:
        return 1
    names = {cfg.name: k8s_name(cfg.name) for cfg in parsed.values()}
    version_dirs = {
        d: sorted((repo.inside(v) for v in d.iterdir() if v.is_dir() and v.name.isdigit()), key=lambda v: int(v.name))
        for d in parsed
    }
    served = {cfg.name: [int(v.name) for v in version_dirs[d]] for d, cfg in parsed.items()}
    docs = []
    problems: list[FieldError] = []
    for d, cfg in parsed.items():
        # every version directory, each with its own files (a lone 1/ becomes spec.source, as before)
        # (None for a file too large to inline: left where it is, for a uri)
        by_version = {int(vdir.name): {str(f.relative_to(vdir)): repo.read(f) for f in repo.files(vdir)}
                      for vdir in version_dirs[d]}
        latest = by_version[max(by_version)] if by_version else {}
        warm, model_files = _warmup_and_own_files(repo, d)
        res = import_config(cfg, latest, warm, names, versions=served, version_files=by_version or None,
                            model_files=model_files or None)
        ident = f"TritonModel/{res.manifest['metadata']['name']}"
        problems.extend(FieldError(ident, p.path, p.message, "import") for p in res.problems)
        for w in res.warnings:
            _err(f"warning: {w}")
        if args.namespace:
            res.manifest["metadata"]["namespace"] = args.namespace
        docs.append(res.manifest)
    # The same rules as render and the webhook: a repository Triton would refuse is not turned into YAML.
    said = {(e.model, e.path) for e in problems}
    checked = check_documents([Document(f"{root}#{i}", doc) for i, doc in enumerate(docs)])
    problems.extend(e for e in checked.errors if (e.model, e.path) not in said)
    if problems:
        problems = sorted(set(problems), key=lambda e: (e.model, e.path))
        _err(f"error: {len(problems)} problem(s) found:")
        for e in problems:
            _err(f"  {e}")
        return 1
    text = yaml.safe_dump_all(docs, sort_keys=False, width=120)
    if args.output:
        _write(Path(args.output), text.encode())
        _err(f"Wrote {len(docs)} TritonModel(s) to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


def cmd_crd(args: argparse.Namespace) -> int:
    from ..api.crd import chart_template, crd_yaml, pool_crd

    doc = pool_crd() if args.kind == "TritonPool" else None
    if args.chart_template:
        sys.stdout.write(chart_template(doc))
    else:
        sys.stdout.write(crd_yaml(doc))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    from ..agent.fetch import Budget, FetchError, pairs, run
    from ..uris import redact

    try:
        budget = Budget(args.max_bytes, args.max_files, args.timeout)
        return run(Path(args.src), Path(args.dst), args.uri or [], pairs(args.sha256 or [], "--sha256"),
                   pairs(args.object_version or [], "--object-version"), budget)
    except (FetchError, OSError) as exc:
        # A uri's query (a presigned URL's signature) or userinfo never reaches the log or the status, whoever
        # wrote the message (fetch, urllib, boto3, google-cloud-storage).
        message = redact(f"error: fetch failed: {exc}")
        _err(message)
        # The container's termination message: the kubelet puts it in the pod's status, where the operator reads
        # it (Degraded, SourceFetchFailed). Only into a file the kubelet mounted: outside a pod there is none.
        termination = Path(os.environ.get("TERMINATION_MESSAGE_PATH", "/dev/termination-log"))
        with contextlib.suppress(OSError):
            if termination.is_file():
                termination.write_bytes(message.encode()[:3999].decode(errors="ignore").encode() + b"\n")  # ≤ 4000 bytes
        return 1


def cmd_fetch_server(args: argparse.Namespace) -> int:
    import logging

    from ..agent.fetch_server import Limits, serve
    from ..agent.probe import address
    from ..api.pod import REPOSITORY_KEY_ENV

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        listen = address(args.listen, "0.0.0.0")  # noqa: S104 (the operator asks at the pod's IP)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    key = os.environ.get(REPOSITORY_KEY_ENV) or None
    if key is None:
        _err(f"warning: no {REPOSITORY_KEY_ENV} in the environment: every request is refused")
    try:
        server = serve(listen, Path(args.repository), Limits(args.max_bytes, args.max_files, args.timeout), key)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from exc
    server.serve_forever()
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from ..agent.probe import address, serve
    from ..api.pod import REPOSITORY_KEY_ENV

    try:
        listen = address(args.listen, "0.0.0.0")  # noqa: S104 (the kubelet probes the pod's IP)
        target = address(args.target, "127.0.0.1")
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    if args.hold <= 0 or args.head_start < 0 or args.head_start >= args.hold:
        raise CliError("--hold must be over 0 and over --head-start, which must be 0 or more")
    if args.gate_settle < 0 or args.gate_settle >= args.hold:
        raise CliError("--gate-settle must be 0 or more, and under --hold")
    if args.max_connections < 8:
        raise CliError("--max-connections must be 8 or more")
    if args.check_interval <= 0 or args.fail_threshold < 0 or args.hang_seconds <= 0:
        raise CliError("--check-interval and --hang-seconds must be over 0, and --fail-threshold 0 (off) or more")
    if args.confirm_every < 0 or args.confirm_timeout <= 0:
        raise CliError("--confirm-every must be 0 (off) or more, and --confirm-timeout over 0")
    try:
        return serve(listen, target, args.hold, args.head_start, args.gate_settle, models=tuple(args.model or ()),
                     check_interval=args.check_interval, fail_threshold=args.fail_threshold,
                     hang_seconds=args.hang_seconds, repository=args.repository, every=args.every_model,
                     confirm_every=args.confirm_every, confirm_timeout=args.confirm_timeout,
                     key=os.environ.get(REPOSITORY_KEY_ENV) or None, max_connections=args.max_connections)
    except OSError as exc:
        raise CliError(f"cannot listen on {args.listen}: {exc.strerror or exc}") from exc


def cmd_docs(args: argparse.Namespace) -> int:
    from ..api.reference import pool_reference_markdown, reference_markdown, update

    if not args.update:
        sys.stdout.write(reference_markdown() + "\n" + pool_reference_markdown())
        return 0
    for name in args.update:
        path = Path(name)
        try:
            text = update(_read_text(path))
        except ValueError as exc:
            _err(f"error: {path} has no generated-reference markers ({exc})")
            return 1
        _write(path, text.encode())
        _err(f"Updated the generated references in {path}")
    return 0


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a positive whole number, got {text!r}")
    return int(text)


def _add_render(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("render", help="render TritonModels into a Triton model repository and print each config.pbtxt")
    r.add_argument("paths", nargs="+", metavar="FILE|DIR")
    r.add_argument("-o", "--output", help="write the model repository here")
    r.add_argument("--cpu", action="store_true", help="map GPU instance groups to CPU")
    r.add_argument(
        "--repository-root",
        metavar="DIR",
        help="where the server will find the repository: a custom batching strategy file's TRITON_BATCH_STRATEGY_PATH "
        "starts here (default: /models, where replicas mount it; give the -o directory's absolute path to load the "
        "output in a tritonserver of your own)",
    )
    r.add_argument(
        "--objects",
        action="store_true",
        help="print the Kubernetes objects the operator would apply for each TritonModel (ConfigMap, Deployment, "
        "Service, and a PodDisruptionBudget or HorizontalPodAutoscaler when the spec asks) as a multi-document YAML "
        "stream, instead of the config.pbtxt files: the pods a change makes, for review",
    )
    r.add_argument("-n", "--namespace", help="with --objects: the namespace (default: each model's, else default)")
    r.add_argument("--operator-image", metavar="IMAGE",
                   help="with --objects: the operator's image, which the fetch and probe containers run "
                   "(default: this version's; the chart sets the one it installs)")
    r.add_argument("--default-triton-image", metavar="IMAGE",
                   help="with --objects: the image of a model or pool that sets no spec.server.image, as the "
                   f"operator's `run --default-triton-image` (default: {DEFAULT_TRITON_IMAGE})")
    r.set_defaults(func=cmd_render)


def _add_validate_import_crd_docs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    v = sub.add_parser("validate", help="render, then load every model (and run its warm-up) in a real local tritonserver")
    v.add_argument("paths", nargs="+", metavar="FILE|DIR")
    v.add_argument("--cpu", action="store_true", help="map GPU instance groups to CPU, for machines without GPUs")
    v.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for tritonserver to start")
    v.add_argument("--load-timeout", type=float, default=300.0, help="seconds one model may take to load and warm up")
    v.add_argument("--show-log", action="store_true", help="print the tritonserver log tail when a model fails")
    v.set_defaults(func=cmd_validate)

    i = sub.add_parser("import", help="turn an existing Triton model repository into TritonModel YAML")
    i.add_argument("repository", metavar="MODEL_REPOSITORY")
    i.add_argument("-o", "--output", help="write the YAML here instead of stdout")
    i.add_argument("-n", "--namespace", help="set metadata.namespace")
    i.set_defaults(func=cmd_import)

    c = sub.add_parser("crd", help="print the TritonModel (or TritonPool) CustomResourceDefinition")
    c.add_argument("--kind", choices=("TritonModel", "TritonPool"), default="TritonModel",
                   help="which CRD (default TritonModel)")
    c.add_argument("--chart-template", action="store_true",
                   help="print it as the Helm chart's template (charts/triton-operator/templates/crds.yaml, "
                   "crds-tritonpools.yaml)")
    c.set_defaults(func=cmd_crd)

    d = sub.add_parser("docs", help="print the TritonModel and TritonPool field references (Markdown)")
    d.add_argument("--update", metavar="FILE", action="append",
                   help="replace each generated reference FILE marks between its markers (repeatable: "
                        "docs/reference/tritonmodel.md, docs/reference/tritonpool.md)")
    d.set_defaults(func=cmd_docs)


def _add_fetch(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fetch` and `fetch-server`: the pod's programs (`agent`), with their defaults and the pod contract's port."""
    from ..agent.fetch import BLOCK as FETCH_BLOCK
    from ..agent.fetch import DEFAULT_MAX_BYTES as DEFAULT_FETCH_MAX_BYTES
    from ..agent.fetch import DEFAULT_MAX_FILES as DEFAULT_FETCH_MAX_FILES
    from ..agent.fetch import DEFAULT_TIMEOUT_SECONDS as DEFAULT_FETCH_TIMEOUT
    from ..api.pod import FETCH_SERVER_PORT

    # The pod's programs get no `help=`: argparse then leaves them out of the commands `--help` lists (POD_COMMANDS
    # names them apart, in the epilog); each keeps a description of its own for `triton-operator fetch --help`.
    f = sub.add_parser("fetch", description="(init container) assemble the model repository from the ConfigMap and uris")
    f.add_argument("--from", dest="src", required=True, help="mounted ConfigMap directory")
    f.add_argument("--to", dest="dst", required=True, help="model repository directory to fill")
    f.add_argument("--uri", action="append", metavar="MODEL[/VERSION]=URI",
                   help="fetch a model's version files (into MODEL/1/, or MODEL/VERSION/; MODEL/.=URI: into MODEL/)")
    f.add_argument("--sha256", action="append", metavar="MODEL=HEX", help="the SHA-256 a model's https:// download must have")
    f.add_argument("--object-version", action="append", metavar="MODEL=VERSION",
                   help="fetch this version of a model's s3:// (VersionId) or gs:// (generation) object")
    f.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_FETCH_MAX_BYTES, metavar="N",
                   help="refuse to write more than N bytes into the repository, downloads and unpacked archives "
                        f"alike, counting a {FETCH_BLOCK}-byte block per file and directory (default "
                        f"{DEFAULT_FETCH_MAX_BYTES})")
    f.add_argument("--max-files", type=_positive_int, default=DEFAULT_FETCH_MAX_FILES, metavar="N",
                   help=f"refuse to create more than N files and directories (default {DEFAULT_FETCH_MAX_FILES})")
    f.add_argument("--timeout", type=_positive_int, default=DEFAULT_FETCH_TIMEOUT, metavar="SECONDS",
                   help=f"give up when the whole fetch takes longer (default {DEFAULT_FETCH_TIMEOUT})")
    f.set_defaults(func=cmd_fetch)

    fs = sub.add_parser("fetch-server", description="(pool replica container) fetch uri models into the repository "
                        "volume when the operator asks")
    fs.add_argument("--listen", default=f":{FETCH_SERVER_PORT}", metavar="[HOST:]PORT",
                    help=f"where to answer (default :{FETCH_SERVER_PORT})")
    fs.add_argument("--repository", required=True, metavar="DIR", help="the repository volume (tritonserver's)")
    fs.add_argument("--max-bytes", type=_positive_int, default=DEFAULT_FETCH_MAX_BYTES, metavar="N",
                    help="what one model's fetch may write (as fetch's --max-bytes)")
    fs.add_argument("--max-files", type=_positive_int, default=DEFAULT_FETCH_MAX_FILES, metavar="N",
                    help="what one model's fetch may create (as fetch's --max-files)")
    fs.add_argument("--timeout", type=_positive_int, default=DEFAULT_FETCH_TIMEOUT, metavar="SECONDS",
                    help="how long one model's fetch may take (as fetch's --timeout)")
    fs.set_defaults(func=cmd_fetch_server)


def _add_probe(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`probe`: the probe sidecar (`agent.probe`), with its defaults, and the pod contract's ports."""
    from ..agent import probe
    from ..agent.probe_server import MAX_CONNECTIONS
    from ..api.pod import GATE_PATH, HTTP_PORT, PROBE_PORT, STATUS_PATH

    pr = sub.add_parser("probe", description="(replica container) answer the kubelet's readiness probe as soon as "
                        "tritonserver is up")
    pr.add_argument("--listen", default=f":{PROBE_PORT}", metavar="[HOST:]PORT",
                    help=f"where to answer (default :{PROBE_PORT})")
    pr.add_argument("--target", default=f"127.0.0.1:{HTTP_PORT}", metavar="[HOST:]PORT",
                    help=f"tritonserver's HTTP port (default 127.0.0.1:{HTTP_PORT})")
    pr.add_argument("--hold", type=float, default=probe.HOLD_SECONDS,
                    help="seconds to hold a probe while tritonserver is not up (under the probe's timeoutSeconds)")
    pr.add_argument("--gate-settle", type=float, default=probe.GATE_SETTLE_SECONDS,
                    help=f"seconds after the operator's POST {GATE_PATH} (it has set the pod's readiness gate) before "
                    "probes pass, so that the kubelet has synced the gate first")
    pr.add_argument("--head-start", type=float, default=probe.HEAD_START_SECONDS,
                    help="without that notice, seconds the port must have been open before the probe passes")
    pr.add_argument("--model", action="append", metavar="NAME",
                    help="a Triton model the replica serves (repeat: the model and every ensemble step); the probe "
                    "then fails while one is not loaded, fails every request, or tritonserver does not answer")
    pr.add_argument("--check-interval", type=float, default=probe.CHECK_INTERVAL, metavar="SECONDS",
                    help=f"how often the models' statistics are read (default {probe.CHECK_INTERVAL:g})")
    pr.add_argument("--fail-threshold", type=int, default=probe.FAIL_THRESHOLD, metavar="N",
                    help="a model is broken after N failed requests with no success between them (default "
                    f"{probe.FAIL_THRESHOLD}; 0: never by its failed requests)")
    pr.add_argument("--confirm-every", type=float, default=probe.CONFIRM_EVERY, metavar="SECONDS",
                    help="a model past --fail-threshold is broken only when a request of the probe's own (its warm-up "
                    f"sample) fails too; at most one such request per model this often (default {probe.CONFIRM_EVERY:g}; "
                    "0: the failures alone decide)")
    pr.add_argument("--confirm-timeout", type=float, default=probe.CONFIRM_TIMEOUT, metavar="SECONDS",
                    help=f"the probe's own request's deadline: no answer by then is no verdict (default "
                    f"{probe.CONFIRM_TIMEOUT:g})")
    pr.add_argument("--hang-seconds", type=float, default=probe.HANG_SECONDS, metavar="SECONDS",
                    help=f"tritonserver is broken when it has not answered for this long (default {probe.HANG_SECONDS:g})")
    pr.add_argument("--repository", metavar="DIR",
                    help="watch only the Python stubs of models under this directory (tritonserver's repository)")
    pr.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS, metavar="N",
                    help="connections held at once; past it, a newcomer evicts the unfinished one with least claim "
                    f"(default {MAX_CONNECTIONS})")
    pr.add_argument("--every-model", action="store_true",
                    help=f"(a pool replica) watch every model tritonserver serves, for GET {STATUS_PATH} alone: the readiness "
                    "probe says tritonserver is up, nothing per model")
    pr.set_defaults(func=cmd_probe)


#: The commands a replica pod runs (the operator renders them into its containers), not a user: runnable, but listed
#: apart from the user's commands in `--help`.
POD_COMMANDS = ("fetch", "fetch-server", "probe")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="triton-operator", description="Declarative NVIDIA Triton models on Kubernetes.",
        epilog=f"run inside a replica pod, not by hand: {', '.join(POD_COMMANDS)} (`triton-operator COMMAND --help`)")
    p.add_argument("--version", action="version", version=f"triton-operator {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    _add_render(sub)
    _add_validate_import_crd_docs(sub)
    _add_fetch(sub)
    _add_probe(sub)

    from .run import add_commands  # `run` imports the controller (kopf) only when it runs

    add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        _err(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
