"""gunicorn settings, from Flightdeck's settings (FLIGHTDECK_* environment variables).

Workers are threaded (gthread): concurrent requests in one process are what the dynamic batcher
batches. Each worker embeds its own engine; SIGTERM drains it before the worker exits.
"""

import logging.config
import os
import shutil
import signal
import subprocess
import sys

from gunicorn.glogging import Logger

from controlplane.config import load_settings
from controlplane.logconfig import logging_config

# NOTE: before anything is created: every file the master, the prepare child and the workers write
# (database, archives, logs, secrets) is then private to this OS user, whatever the shell's umask.
os.umask(0o077)
_settings = load_settings()
_prometheus_dir = _settings.home.resolve() / "prometheus"
# NOTE: must be set before any worker imports prometheus_client (see controlplane/metrics.py).
os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(_prometheus_dir)

wsgi_app = "wsgi:app"
bind = f"{_settings.host}:{_settings.port}"
workers = _settings.worker_count  # NOTE: one per core by default: measured 2.2x the requests/s of one on 2 cores
threads = _settings.http_threads
worker_class = "gthread"
graceful_timeout = max(1, round(_settings.drain_grace_s))
timeout = 120
keepalive = 5
# NOTE: a gthread worker touches its heartbeat file on every event-loop turn (each request); on tmpfs that
# is a memory write, on a disk file system a journalled metadata update (gunicorn's own advice).
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
accesslog = None  # one structured line per request comes from the app itself
errorlog = "-"
loglevel = _settings.log_level.lower()
proc_name = "flightdeck"


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
    shutil.rmtree(_prometheus_dir, ignore_errors=True)
    _prometheus_dir.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "controlplane", "prepare"], check=True)


def when_ready(server):
    server.log.info(
        "Flightdeck is running at http://%s:%s/ (Ctrl-C to stop); the console asks for a login, "
        "the first admin's password is in %s",
        _settings.host,
        _settings.port,
        _settings.home / "initial-admin-password",
    )


def post_worker_init(worker):
    """On SIGTERM, stop admitting at once (ready turns false), then let gunicorn finish in-flight requests."""
    services = worker.wsgi.extensions["flightdeck"]
    previous = signal.getsignal(signal.SIGTERM)

    def drain_then_exit(signum, frame):
        services.engine.begin_drain()
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, drain_then_exit)
    engine = services.engine
    served = ", ".join(f"{v.spec.name} {v.spec.version} ({v.slot})" for v in engine.loaded()) or "nothing deployed"
    worker.log.info("worker %s %s: %s", worker.pid, "ready" if engine.ready() else "started, not ready", served)


def worker_exit(server, worker):
    """Finish everything the engine accepted, within the grace period, then stop the scheduler."""
    services = getattr(worker, "wsgi", None) and worker.wsgi.extensions.get("flightdeck")
    if services is not None:
        drained = services.shutdown(_settings.drain_grace_s)
        worker.log.info(
            "worker %s drained: %s", worker.pid, "all requests finished" if drained else "grace period ran out"
        )


def child_exit(server, worker):
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
