"""gunicorn settings, from Flightdeck's settings (FLIGHTDECK_* environment variables).

Workers run an event loop (controlplane.worker: uvicorn's parser on uvloop) serving wsgi.asgi:
concurrent inference requests in one process wait on it, without a thread each, for the dynamic
batcher; the console and the API run in a thread pool. Each worker embeds its own engine; SIGTERM
stops admitting at once and drains it before the worker exits.
"""

import gc
import logging.config
import os
import shutil
import subprocess
import sys

from gunicorn.glogging import Logger

from controlplane.balance import connections_folder, forget
from controlplane.config import load_settings
from controlplane.grpcfront.port import check_port_free
from controlplane.logconfig import logging_config

# NOTE: before anything is created: every file the master, the prepare child and the workers write
# (database, archives, logs, secrets) is then private to this OS user, whatever the shell's umask.
os.umask(0o077)
_settings = load_settings()
_prometheus_dir = _settings.home.resolve() / "prometheus"
# NOTE: must be set before any worker imports prometheus_client (see controlplane/metrics.py).
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_prometheus_dir)

wsgi_app = "wsgi:asgi"
bind = f"{_settings.host}:{_settings.port}"
workers = _settings.worker_count  # NOTE: one per core by default: measured 2.2x the requests/s of one on 2 cores
worker_class = "controlplane.worker.FlightdeckWorker"  # the Flask threads: FLIGHTDECK_THREADS, in wsgi.asgi
graceful_timeout = max(1, round(_settings.drain_grace_s))
timeout = 120
keepalive = 5
# NOTE: the worker's heartbeat file: on tmpfs a memory write, not a journalled metadata update (gunicorn's advice).
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
accesslog = None  # one structured line per request comes from the app itself
errorlog = "-"
loglevel = _settings.log_level.lower()
proc_name = "flightdeck"
# gunicorn's control socket (gunicornc) defaults to one path per OS user (~/.gunicorn/gunicorn.ctl), shared by every
# gunicorn of that user on the host: stopping one removed another's. One per data directory instead; none when
# that path is too long for a unix socket (about 107 bytes).
_control_socket = _settings.home.resolve() / "gunicorn.ctl"
if len(os.fsencode(_control_socket)) < 100:
    control_socket = str(_control_socket)
    control_socket_mode = 0o600
else:
    control_socket_disable = True


class FlightdeckLogger(Logger):
    """gunicorn's logger under Flightdeck's one logging configuration: its lines in the app's format.

    NOTE: not `logconfig_dict`: with that set, gunicorn formats an access line for every request,
    which the app's own request log already covers.
    """

    def setup(self, cfg):
        super().setup(cfg)
        logging.config.dictConfig(logging_config(_settings))  # after gunicorn's handlers, replacing them


logger_class = FlightdeckLogger


def on_starting(server):
    """Prepare once, before any worker: metrics directory wiped, then `python -m controlplane prepare`.

    NOTE: preparing loads ONNX Runtime (demo golden samples, registry checks); doing that in the
    master would leave ORT's state in every forked worker, which then crashed (SIGSEGV) at exit.
    A child process keeps the master free of it.
    """
    check_port_free(_settings)  # NOTE: the workers bind it with SO_REUSEPORT, which would share it silently
    shutil.rmtree(_prometheus_dir, ignore_errors=True)
    _prometheus_dir.mkdir(parents=True)
    shutil.rmtree(connections_folder(_settings), ignore_errors=True)  # a killed server's workers' counts
    shutil.rmtree(_settings.measurements_dir, ignore_errors=True)  # each start times its loads afresh
    prepared = subprocess.run([sys.executable, "-m", "controlplane", "prepare"], check=False)
    if prepared.returncode != 0:
        server.log.error("could not prepare the data directory (exit status %d): see above", prepared.returncode)
        sys.exit(prepared.returncode)  # NOTE: SystemExit: gunicorn stops without a traceback of its own


def when_ready(server):
    # NOTE: only where the file is: on several nodes sharing a database, one wrote it (the one whose insert won).
    password_file = _settings.home / "initial-admin-password"
    where = (
        f"the first admin's password is in {password_file}"
        if password_file.exists()
        else "sign in with an existing user (no first-admin password was written on this node)"
    )
    server.log.info(
        "Flightdeck is running at http://%s:%s/ (node %s; %s; Ctrl-C to stop); the console asks for a login, %s",
        _settings.host,
        _settings.port,
        _settings.node_name,
        f"inference over gRPC on port {_settings.grpc_port}" if _settings.grpc_port else "no gRPC",
        where,
    )


def post_worker_init(worker):
    """Freeze the worker's start-up heap, then say what it serves. (SIGTERM: controlplane.worker.DrainingServer.)

    NOTE: the modules, the app and the loaded versions never become garbage, yet a full collection scanned
    them all. Under load the first one came a few seconds in, in each worker: 100-110 ms holding the GIL,
    in which every request the worker held waited (textcls seq 128 at c=32: all 32 in flight, p99 220 ms
    against 148 in the next window). Frozen, a full collection scans only what came after.
    """
    gc.collect()  # NOTE: garbage left by start-up first, or it would be kept for ever
    gc.freeze()
    engine = worker.wsgi.services.engine
    served = ", ".join(f"{v.spec.name} {v.spec.version} ({v.slot})" for v in engine.loaded()) or "nothing deployed"
    state = "ready" if engine.ready() else "started, not ready"
    worker.log.info(
        "worker %s %s: %s; start-up heap frozen (%d objects)", worker.pid, state, served, gc.get_freeze_count()
    )


def worker_exit(server, worker):
    """Finish everything the engine accepted, within the grace period, then stop the scheduler."""
    services = getattr(getattr(worker, "wsgi", None), "services", None)
    if services is not None:
        drained = services.shutdown(_settings.drain_grace_s)
        worker.log.info(
            "worker %s drained: %s", worker.pid, "all requests finished" if drained else "grace period ran out"
        )


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
    forget(connections_folder(_settings), worker.pid)  # a killed worker's count would hold the others back
