"""`triton-operator run`: the operator process (its arguments; the operator itself is `controller.operator`)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import uuid
from typing import TYPE_CHECKING

from .. import DEFAULT_OPERATOR_IMAGE, DEFAULT_TRITON_IMAGE, MINIMUM_TRITON_RELEASE

if TYPE_CHECKING:
    import asyncio

    from ..controller.operator import WebhookSettings
    from ..platform.kubeconfig import CredentialSource
    from ..platform.leader import ElectionSettings
    from ..render.kubernetes import Options
    from ..render.repository_key import RepositoryKeys


def block_unused_clients() -> None:
    """Makes `import kubernetes` fail in this process (a None entry in sys.modules raises ImportError).

    The operator talks to the API server with its own small client (`platform.kube`, `platform.kubeconfig`), but
    kopf imports `kubernetes.client` at `import kopf` whenever that package is importable (for isinstance checks on
    its model objects, which we never pass it), and its default login handlers try it too (we register our own).
    That import alone is ~32 MB of the operator's RSS (issue 17). The image does not ship the package; a
    development venv does (the tests use it), so the operator process blocks it itself.
    """
    if "kubernetes" not in sys.modules:
        sys.modules["kubernetes"] = None  # type: ignore[assignment]


def cmd_run(args: argparse.Namespace) -> int:
    block_unused_clients()  # before anything imports kopf
    # Here, not at the top: every command builds the parser, and `fetch` and `probe` start in every replica.
    import asyncio

    from ..platform.kubeconfig import ConfigError, load
    from ..render.kubernetes import Options
    from .main import CliError

    # First, before anything starts: a kubeconfig the operator cannot honour, or a bad flag, is one line.
    try:
        credentials = load(args.kubeconfig)
    except ConfigError as exc:
        raise CliError(str(exc)) from exc
    webhook = _webhook_settings(args)
    election = _election_settings(args)
    keys = _repository_keys(args.repository_key_file)
    _configure_logging(args.log_level, args.log_format)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per handled event is noise
    if not args.namespace and not args.all_namespaces:
        args.all_namespaces = True
    options = Options(operator_image=args.operator_image, default_triton_image=args.default_triton_image,
                      repository_keys=keys)
    from ..validate.admission import triton_release_warning

    old_triton = triton_release_warning(args.default_triton_image, "--default-triton-image")
    if old_triton is not None:
        logging.getLogger("triton_operator").warning("%s (every model and pool that sets no image runs it)", old_triton)
    if args.repository_key_file:
        logging.getLogger("triton_operator").info("Loaded repository master key file=%s fingerprint=%s",
                                                  args.repository_key_file, keys.fingerprint)
    else:
        logging.getLogger("triton_operator").warning(
            "Made a repository master key of this process alone (no --repository-key-file) fingerprint=%s: each "
            "start makes another, and every model's replicas then roll to new pods", keys.fingerprint)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        metrics_server = None
        if args.metrics_port:  # in this loop, bounded (servers.prometheus), not a thread per connection
            from ..servers.prometheus import serve_metrics

            metrics_server, _ = await serve_metrics(args.metrics_address, args.metrics_port)
            logging.getLogger("triton_operator").info("Started metrics endpoint port=%d", args.metrics_port)
        try:
            return await _operate(args, options, stop, webhook, election, credentials)
        finally:
            if metrics_server is not None:
                await metrics_server.cleanup()

    return asyncio.run(main())


def _configure_logging(level_name: str, log_format: str) -> None:
    """Text lines (the default), or one JSON object a line with the object's namespace and name (`controller.logs`)."""
    level = getattr(logging, level_name.upper())
    if log_format == "json":
        from ..controller.logs import log_as_json

        log_as_json(level)
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def _operate(args: argparse.Namespace, options: Options, stop: asyncio.Event, webhook: WebhookSettings | None,
                   election: ElectionSettings | None, credentials: CredentialSource) -> int:
    from ..controller.operator import run_operator

    return await run_operator(
        kubeconfig=args.kubeconfig,
        namespaces=args.namespace or [],
        clusterwide=args.all_namespaces,
        liveness=args.liveness,
        options=options,
        drift_interval=args.drift_interval,
        stop_flag=stop,
        webhook=webhook,
        election=election,
        credentials=credentials,
        max_upgrade_rollouts=args.max_upgrade_rollouts,
    )


def _repository_keys(path: str | None) -> RepositoryKeys:
    """The master key every model's repository key is derived from (`render.repository_key`): the file's bytes
    (surrounding whitespace dropped), or, without a file, random bytes of this process alone."""
    import secrets

    from ..render.repository_key import MIN_MASTER_BYTES, RepositoryKeys

    if not path:
        return RepositoryKeys(secrets.token_bytes(MIN_MASTER_BYTES))
    try:
        with open(path, "rb") as f:
            master = f.read(64 * 1024).strip()
    except OSError as exc:
        raise SystemExit(f"--repository-key-file: cannot read {path}: {exc.strerror or exc}") from exc
    if len(master) < MIN_MASTER_BYTES:
        raise SystemExit(f"--repository-key-file: {path} holds {len(master)} bytes; the master key needs at least "
                         f"{MIN_MASTER_BYTES} (e.g. `head -c 48 /dev/urandom | base64 > {path}`)")
    return RepositoryKeys(master)


def _election_settings(args: argparse.Namespace) -> ElectionSettings | None:
    if not args.leader_elect:
        return None
    from ..platform.leader import ElectionSettings

    namespace, _, name = args.leader_election_lease.partition("/")
    # One identity per process, as client-go's controllers make theirs (host name + "_" + a UUID): a leader's
    # container restarted by its kubelet is a new candidate, not the old holder renewing a Lease it never lost.
    identity = args.leader_election_identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    if not namespace or not name:
        raise SystemExit(f"--leader-election-lease: expected NAMESPACE/NAME, got {args.leader_election_lease!r}")
    if not 0 < args.leader_election_retry_seconds < args.leader_election_renew_seconds < args.leader_election_lease_seconds:
        raise SystemExit("--leader-election-*: need 0 < retry < renew < lease seconds (a leader must step down "
                         "before a follower may take over)")
    return ElectionSettings(namespace, name, identity, lease_seconds=args.leader_election_lease_seconds,
                            renew_seconds=args.leader_election_renew_seconds,
                            retry_seconds=args.leader_election_retry_seconds)


def _whole(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, 0 or more, got {text!r}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number over 0, got {text!r}")
    return int(text)


def _webhook_settings(args: argparse.Namespace) -> WebhookSettings | None:
    from ..render.webhook import WebhookTarget

    if args.webhook_service:
        ns, _, name = args.webhook_service.partition("/")
        if not ns or not name:
            raise SystemExit(f"--webhook-service: expected NAMESPACE/NAME, got {args.webhook_service!r}")
        target = WebhookTarget(service_namespace=ns, service_name=name, service_port=args.webhook_service_port)
    elif args.webhook_url:
        if not args.webhook_url.startswith("https://"):
            raise SystemExit(f"--webhook-url: the API server calls webhooks over https, got {args.webhook_url!r}")
        target = WebhookTarget(url=args.webhook_url)
    else:
        if args.custom_metrics:
            raise SystemExit("--custom-metrics: served on the webhook's TLS port, so it needs --webhook-service "
                             "(the Service the APIService names) or --webhook-url")
        return None
    if args.webhook_cert_dir:  # a missing or unreadable Secret mount: one line now, not a traceback once serving
        import ssl

        cert_dir = os.path.abspath(args.webhook_cert_dir)
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                os.path.join(cert_dir, "tls.crt"), os.path.join(cert_dir, "tls.key"))
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"--webhook-cert-dir: cannot load {cert_dir}/tls.crt and tls.key: "
                             f"{getattr(exc, 'strerror', None) or exc}") from exc
    from ..controller.operator import WebhookSettings

    return WebhookSettings(target, args.webhook_configuration, args.webhook_failure_policy, args.webhook_address,
                           args.webhook_port, args.webhook_cert_dir, args.custom_metrics, args.webhook_max_connections,
                           args.webhook_reviews_own_writes)


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = sub.add_parser("run", help="run the operator (watches TritonModels and gates replicas on warm-up)")
    scope = r.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch the whole cluster (the default)")
    r.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"), help="kubeconfig (default: in-cluster)")
    r.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness endpoint URL to serve")
    r.add_argument("--metrics-port", type=int, default=8081, help="Prometheus metrics port (0 disables)")
    r.add_argument("--metrics-address", default="0.0.0.0")  # noqa: S104 - Prometheus scrapes the pod from outside
    r.add_argument(
        "--operator-image",
        default=os.environ.get("TRITON_OPERATOR_IMAGE", DEFAULT_OPERATOR_IMAGE),
        help="image of the `fetch` init container (this operator's own image)",
    )
    r.add_argument(
        "--default-triton-image", metavar="IMAGE",
        default=os.environ.get("TRITON_OPERATOR_DEFAULT_TRITON_IMAGE", DEFAULT_TRITON_IMAGE),
        help="the tritonserver image of every TritonModel and TritonPool that sets no spec.server.image, e.g. a "
             "mirror's copy of NVIDIA's (the chart's `tritonImage`). Changing it rolls their replicas to new pods. "
             f"Default: {DEFAULT_TRITON_IMAGE}; a warning at start if it names an NGC release before "
             f"{MINIMUM_TRITON_RELEASE}",
    )
    r.add_argument("--repository-key-file", metavar="FILE",
                   help="the master key (at least 32 bytes; the chart mounts its Secret here) from which each model's "
                        "repository key is derived: replicas let only that key load, unload or list models through "
                        "Triton's repository API. Unset: a random key of this process alone, and every model's "
                        "replicas roll to new pods at each start")
    r.add_argument("--max-upgrade-rollouts", type=_whole, default=2, metavar="N",
                   help="at most N model Deployments roll at once because this operator renders another pod template "
                        "for a TritonModel nobody changed (an operator upgrade); the others keep their pods and wait, "
                        "with Progressing reason UpgradeRolloutWaiting; one of 2+ replicas rolls a replica at a time, "
                        "with no surge pod. A change of a model's own spec rolls at once. 0: no bound. Default: 2")
    r.add_argument("--drift-interval", type=float, default=60.0, help="seconds between drift-correcting reconciles")
    r.add_argument("--log-level", default="info")
    r.add_argument("--log-format", choices=("text", "json"), default="text", help="text lines, or one JSON object a "
                   "line with the object's namespace and name under `object` (kopf's JSON format)")
    w = r.add_argument_group("admission webhook", "served over TLS with a certificate the operator issues itself; "
                             "off unless --webhook-service or --webhook-url says where the API server finds it")
    where = w.add_mutually_exclusive_group()
    where.add_argument("--webhook-service", metavar="NAMESPACE/NAME",
                       help="the Service in front of this operator (in a cluster: the chart sets it)")
    where.add_argument("--webhook-url", metavar="https://HOST:PORT",
                       help="the URL the API server calls (an operator outside the cluster); the operator then "
                            "owns the whole ValidatingWebhookConfiguration and deletes it on exit")
    w.add_argument("--webhook-service-port", type=int, default=443, help="port of --webhook-service")
    w.add_argument("--webhook-address", default="0.0.0.0",  # noqa: S104 - the API server calls in from outside the pod
                   help="address the webhook listens on")
    w.add_argument("--webhook-port", type=int, default=9443, help="port the webhook listens on")
    w.add_argument("--webhook-reviews-own-writes", action="store_true",
                   help="the webhook configuration also reviews this operator's own Deployment and EndpointSlice "
                        "writes, failing closed (the chart's admissionPolicies.operator.reviewWrites): a new leader "
                        "waits for the webhook Service's first ready endpoint before it writes")
    w.add_argument("--webhook-max-connections", type=_positive, default=256,
                   help="connections the TLS port (webhook and custom metrics API) serves at once, TLS handshakes "
                        "included; more are refused as soon as they are accepted (each holds ~300 KiB)")
    w.add_argument("--webhook-configuration", default="triton-operator",
                   help="name of the ValidatingWebhookConfiguration")
    w.add_argument("--webhook-failure-policy", choices=("Fail", "Ignore"), default="Fail",
                   help="what the API server does when the webhook cannot be reached (docs/concepts/validation.md)")
    w.add_argument("--webhook-cert-dir", metavar="DIR",
                   help="serve tls.crt and tls.key from DIR (a mounted Secret every replica shares; reloaded when "
                        "it changes) instead of a self-issued certificate; the configuration's caBundle is then "
                        "left to whoever made the Secret (the chart)")
    w.add_argument("--custom-metrics", action="store_true",
                   help="also serve the custom metrics API (custom.metrics.k8s.io/v1beta2: Triton's queue time, "
                        "requests in flight and inference rate, for HPAs) on the webhook's port; the APIService "
                        "must point at --webhook-service (the chart's customMetrics.enabled)")
    e = r.add_argument_group("leader election", "with several replicas, exactly one reconciles and drives the "
                             "warm-up gates: the holder of a coordination.k8s.io Lease; every replica serves the webhook")
    e.add_argument("--leader-elect", action="store_true", help="take part in leader election (the chart sets it)")
    e.add_argument("--leader-election-lease", metavar="NAMESPACE/NAME", default="triton-system/triton-operator",
                   help="the Lease")
    e.add_argument("--leader-election-identity", help="this process's name in the Lease (default: $POD_NAME, else "
                   "the host name, then _ and 8 random hex digits)")
    e.add_argument("--leader-election-lease-seconds", type=float, default=15.0,
                   help="how long a follower waits on a Lease its holder stopped renewing")
    e.add_argument("--leader-election-renew-seconds", type=float, default=10.0,
                   help="how long the leader tries to renew before it steps down (less than the lease)")
    e.add_argument("--leader-election-retry-seconds", type=float, default=2.0, help="between two tries")
    r.set_defaults(func=cmd_run)
