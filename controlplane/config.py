"""Typed, layered settings: defaults -> optional TOML file -> FLIGHTDECK_* environment -> overrides.

Every setting is declared once below with its type, default and meaning; the README's table is
printed from these declarations (`python -m controlplane config --markdown`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.settings import BatchingSettings, RuntimeSettings, parallelism

if TYPE_CHECKING:
    from controlplane.history.retention import RetentionPolicy
    from controlplane.rollout.service import RolloutSettings

PREFIX = "FLIGHTDECK_"
DEV_SECRET = "dev-insecure-secret"  # the old built-in default: public, so refused like any known value
MIN_SECRET_LENGTH = 32
# Values seen in READMEs, tutorials and compose files; a secret anyone can guess signs anyone's cookie.
WEAK_SECRETS = frozenset(
    {
        DEV_SECRET,
        "changeme",
        "change-me",
        "change_me",
        "secret",
        "secret-key",
        "secret_key",
        "password",
        "development",
        "dev",
        "test",
        "flightdeck",
        "insecure",
        "default",
        "your-secret-key",
        "supersecret",
    }
)
MASK = "********"
_URL_PASSWORD = re.compile(r"^(?P<head>[A-Za-z][\w+.-]*://[^:/@]*):[^@]*@")


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def _setting(default: Any, doc: str, *, secret: bool = False) -> Any:
    return field(default=default, metadata={"doc": doc, "secret": secret})


def mask_url(url: str) -> str:
    """Return a database URL with its password replaced by ***, for printing and logs."""
    return _URL_PASSWORD.sub(r"\g<head>:***@", url)


def _weak_secret(value: str) -> str | None:
    """Return why `value` is unusable as a signing secret, or None."""
    lowered = value.strip().casefold()
    if lowered in WEAK_SECRETS or any(lowered.startswith(w) for w in (DEV_SECRET, "changeme", "change-me")):
        return "is a published example value"
    if len(value) < MIN_SECRET_LENGTH:
        return f"is shorter than {MIN_SECRET_LENGTH} characters"
    if len(set(value)) < 8:
        return "repeats too few distinct characters"
    return None


@dataclass(frozen=True)
class Settings:
    """All of Flightdeck's settings. Environment names are FLIGHTDECK_ + the upper-cased field name."""

    home: Path = _setting(Path(".flightdeck"), "Data directory holding the database, the model registry and logs.")
    env: str = _setting("development", "development or production.")
    secret_key: str = _setting(
        "",
        "Secret for signing session cookies, at least 32 characters (known example values are refused in every "
        "mode). Empty: a random one is generated at the first start into HOME/session-secret (mode 0600) and "
        "shared by every process using that HOME; set it when nodes do not share HOME.",
        secret=True,
    )
    database_url: str = _setting(
        "",
        "SQLAlchemy URL; empty means SQLite at HOME/flightdeck.db. postgresql+psycopg://... works too "
        "(its password is masked wherever the URL is printed).",
        secret=True,
    )
    host: str = _setting("127.0.0.1", "Address gunicorn binds.")
    port: int = _setting(8000, "Port gunicorn binds.")
    workers: int = _setting(
        0,
        "gunicorn worker processes (0: one per CPU core, at most 4). Each holds its own engine and its own copy "
        "of every model; one process's Python work (HTTP, JSON) cannot use a second core (see README, benchmarks).",
    )
    threads: int = _setting(
        0, "Request threads per worker (0: enough to hold every queue full plus running batches, see README)."
    )
    log_level: str = _setting("INFO", "Python log level.")
    demo_models: bool = _setting(
        True, "On a first start (empty registry, nothing deployed), push the demo models (textcls, mlp) and deploy v1."
    )
    load_models: str = _setting(
        "", "Per-node filter: comma-separated deployed models this node serves (empty: every deployed model)."
    )
    device: str = _setting("auto", "auto (CUDA when usable), cpu, or cuda.")
    gpu_device_id: int = _setting(0, "CUDA device index.")
    gpu_mem_limit_mb: int = _setting(0, "CUDA provider memory limit per session in MiB (0: no limit).")
    ort_intra_op_threads: int = _setting(0, "ONNX Runtime intra-op threads (0: auto, cores / batch instances on CPU).")
    ort_inter_op_threads: int = _setting(1, "ONNX Runtime inter-op threads.")
    ort_allow_spinning: bool = _setting(False, "Let idle ONNX Runtime threads spin (costs CPU the HTTP threads need).")
    ort_graph_optimization: str = _setting("all", "Graph optimisation level: disable, basic, extended, all.")
    ort_cpu_mem_arena: bool = _setting(True, "Use ONNX Runtime's CPU memory arena.")
    ort_mem_pattern: bool = _setting(True, "Use ONNX Runtime's memory pattern planning.")
    ort_arena_extend_strategy: str = _setting("kNextPowerOfTwo", "Arena growth: kNextPowerOfTwo or kSameAsRequested.")
    batching: bool = _setting(True, "Dynamic batching on or off (off: every request runs alone).")
    max_batch_size: int = _setting(32, "Largest batch the batcher forms (a model's own hint can lower it).")
    max_queue_delay_ms: float = _setting(2.0, "Longest a request waits for a batch to fill while the engine is busy.")
    max_queue_size: int = _setting(128, "Samples queued per loaded version before requests are refused with 429.")
    default_timeout_ms: float = _setting(
        10_000.0, "Default request deadline; a client's 'timeout' parameter may only shorten it."
    )
    batch_instances: int = _setting(0, "Executor threads per loaded version (0: auto, min(cores, 4) on CPU, 2 on GPU).")
    warmup_max_sequence: int = _setting(128, "Longest sequence bucket used for warm-up.")
    max_request_bytes: int = _setting(16 * 1024 * 1024, "Largest inference request body; larger ones get 413.")
    drain_grace_s: float = _setting(30.0, "On SIGTERM, how long accepted requests may take to finish.")
    log_sample_rate: float = _setting(
        0.01, "Share of successful, fast requests logged (errors and slow ones always are)."
    )
    slow_request_ms: float = _setting(1000.0, "Requests slower than this are always logged.")
    scheduler: bool = _setting(True, "Run scheduled jobs (one leader process runs the cluster-wide ones).")
    lease_ttl_s: float = _setting(15.0, "How long the scheduler leader's lease lasts without renewal.")
    history_interval_s: float = _setting(10.0, "How often each serving process writes a history row per slot.")
    history_raw_retention_h: float = _setting(6.0, "Hours raw history rows are kept before 1-minute rollup.")
    history_minute_retention_d: float = _setting(7.0, "Days 1-minute rows are kept before 1-hour rollup.")
    history_hour_retention_d: float = _setting(90.0, "Days 1-hour rows are kept before deletion.")
    retention_interval_s: float = _setting(60.0, "How often the scheduler leader applies history retention.")
    max_archive_bytes: int = _setting(
        1024**3, "Largest model archive (tar.gz) a push accepts; a larger upload gets 413 and nothing is kept."
    )
    max_archive_files: int = _setting(64, "Most files and folders one model archive may hold.")
    max_unpacked_bytes: int = _setting(
        4 * 1024**3, "Most bytes a model archive may unpack to, all files together (checked before unpacking)."
    )
    inference_auth: bool = _setting(
        False, "Require an API token (any role) on every /v2 request except /v2/health/*; refusals get 401."
    )
    auth_reads: bool = _setting(
        True,
        "Require a viewer (token or console login) for management reads (GET /api/*, except /api/session and "
        "/api/openapi.json). Writes always need an operator or admin. false opens the reads to anyone who can "
        "reach the port (the console's pages always need a login).",
    )
    cookie_secure: str = _setting(
        "auto",
        "Secure flag on the session cookie: auto (when the request came over HTTPS, as gunicorn sees it behind "
        "FORWARDED_ALLOW_IPS), always, or never. Use always whenever the console is reached over HTTPS.",
    )
    session_hours: float = _setting(
        12.0, "How long a console login lasts (from the moment of login); then the console asks again."
    )
    login_max_failures: int = _setting(
        5, "Failed logins per name and client address before further attempts are refused (429) for a while."
    )
    login_lockout_s: float = _setting(
        30.0, "First refusal period after LOGIN_MAX_FAILURES; doubles with each further failure, up to 64 times."
    )
    public_url: str = _setting(
        "", "The console's address as people reach it, for links in alerts (empty: http://HOST:PORT)."
    )
    alert_interval_s: float = _setting(15.0, "How often the scheduler leader evaluates alert rules.")
    outbox_interval_s: float = _setting(5.0, "How often the scheduler leader delivers due alert notifications.")
    outbox_backoff_s: float = _setting(30.0, "First retry delay of a failed notification; doubles up to an hour.")
    alert_repeat_h: float = _setting(4.0, "Hours before a still-firing, unacknowledged alert is sent again.")
    alert_rules_dir: str = _setting("", "Folder of alert rule YAML files (empty: the shipped alerts/rules).")
    reconcile_poll_ms: float = _setting(
        25.0,
        "How often a process looks for desired state others wrote when nothing woke it: every poll on PostgreSQL; "
        "on SQLite only for 0.2 s after an inotify wake-up, or always where inotify is missing (a change-counter read).",
    )
    rollout_tick_s: float = _setting(1.0, "How often the scheduler leader advances rollouts (steps, analysis).")
    rollout_pause_s: float = _setting(60.0, "Default time a canary step takes traffic before it is analysed.")
    scale_down_delay_s: float = _setting(600.0, "How long the previous stable version stays loaded after a rollout.")
    rollback_window_s: float = _setting(
        604800.0, "A version stable this recently comes back on rollback without analysis."
    )

    @property
    def sqlalchemy_url(self) -> str:
        """Return the database URL, defaulting to SQLite under the data directory."""
        return self.database_url or f"sqlite:///{(self.home / 'flightdeck.db').resolve()}"

    @property
    def log_dir(self) -> Path:
        return self.home / "logs"

    @property
    def retention(self) -> RetentionPolicy:
        """Return how long each history resolution is kept."""
        # Imported here: gunicorn.conf.py reads the settings and must not pull in the ORM.
        from controlplane.history.retention import RetentionPolicy  # noqa: F811

        return RetentionPolicy(
            raw=timedelta(hours=self.history_raw_retention_h),
            minute=timedelta(days=self.history_minute_retention_d),
            hour=timedelta(days=self.history_hour_retention_d),
        )

    @property
    def rollout(self) -> RolloutSettings:
        """Return the rollout timing knobs."""
        from controlplane.rollout.service import RolloutSettings  # noqa: F811 (kept out of gunicorn.conf's imports)

        return RolloutSettings(
            default_pause_s=self.rollout_pause_s,
            scale_down_delay_s=self.scale_down_delay_s,
            rollback_window_s=self.rollback_window_s,
        )

    @property
    def console_url(self) -> str:
        """Return the base URL for links people follow from chat."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def served_models(self) -> frozenset[str]:
        """Return the models FLIGHTDECK_LOAD_MODELS names for this node (empty: every deployed model)."""
        return frozenset(name.strip() for name in self.load_models.split(",") if name.strip())

    @property
    def worker_count(self) -> int:
        """Return gunicorn's worker count: explicit, or one per core up to 4 (memory grows with each)."""
        return self.workers or min(os.cpu_count() or 1, 4)

    @property
    def http_threads(self) -> int:
        """Return gunicorn's threads per worker: explicit, or room for two models' full queues and batches.

        NOTE: a request waiting for a gunicorn thread is invisible to admission control and to its
        deadline, so there must be a thread for every request the engine could hold.
        """
        if self.threads:
            return self.threads
        instances, _ = parallelism(self.runtime, self.batching_settings, on_gpu=self.device == "cuda")
        return min(1024, 2 * (self.max_queue_size + self.max_batch_size * instances) + 16)

    @property
    def runtime(self) -> RuntimeSettings:
        """Return the ONNX Runtime knobs for the engine."""
        return RuntimeSettings(
            device=self.device,
            gpu_device_id=self.gpu_device_id,
            intra_op_threads=self.ort_intra_op_threads,
            inter_op_threads=self.ort_inter_op_threads,
            allow_spinning=self.ort_allow_spinning,
            graph_optimization=self.ort_graph_optimization,
            enable_cpu_mem_arena=self.ort_cpu_mem_arena,
            enable_mem_pattern=self.ort_mem_pattern,
            arena_extend_strategy=self.ort_arena_extend_strategy,
            gpu_mem_limit_bytes=self.gpu_mem_limit_mb * 1024 * 1024,
        )

    @property
    def batching_settings(self) -> BatchingSettings:
        """Return the batcher knobs for the engine."""
        return BatchingSettings(
            enabled=self.batching,
            max_batch_size=self.max_batch_size,
            max_queue_delay_ms=self.max_queue_delay_ms,
            max_queue_size=self.max_queue_size,
            default_timeout_ms=self.default_timeout_ms,
            instances=self.batch_instances,
            warmup_max_sequence=self.warmup_max_sequence,
        )

    def validate(self) -> Settings:
        """Raise ConfigError for values that cannot work; return self."""
        choices = {
            "env": ("development", "production"),
            "device": ("auto", "cpu", "cuda"),
            "ort_graph_optimization": ("disable", "basic", "extended", "all"),
            "ort_arena_extend_strategy": ("kNextPowerOfTwo", "kSameAsRequested"),
            "cookie_secure": ("auto", "always", "never"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{PREFIX}{name.upper()} must be one of {allowed}, not {getattr(self, name)!r}")
        positive = (
            "port",
            "max_batch_size",
            "max_queue_size",
            "max_request_bytes",
            "login_max_failures",
            "max_archive_bytes",
            "max_archive_files",
            "max_unpacked_bytes",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{PREFIX}{name.upper()} must be at least 1")
        for name in (
            "history_interval_s",
            "retention_interval_s",
            "rollout_tick_s",
            "reconcile_poll_ms",
            "alert_interval_s",
            "session_hours",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be positive")
        for name in (
            "max_queue_delay_ms",
            "default_timeout_ms",
            "drain_grace_s",
            "lease_ttl_s",
            "history_raw_retention_h",
            "history_minute_retention_d",
            "history_hour_retention_d",
            "login_lockout_s",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must not be negative")
        for name in ("workers", "threads", "batch_instances", "ort_intra_op_threads"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{PREFIX}{name.upper()} must be 0 (auto) or more")
        if self.threads and self.threads < self.max_queue_size + self.max_batch_size:
            raise ConfigError(
                f"{PREFIX}THREADS={self.threads} cannot hold a full queue ({PREFIX}MAX_QUEUE_SIZE={self.max_queue_size}) "
                f"plus a running batch ({PREFIX}MAX_BATCH_SIZE={self.max_batch_size}): the excess would wait inside "
                "gunicorn, past admission control and deadlines. Raise THREADS, lower MAX_QUEUE_SIZE, or use 0 (auto)."
            )
        if not 0.0 <= self.log_sample_rate <= 1.0:
            raise ConfigError(f"{PREFIX}LOG_SAMPLE_RATE must be between 0 and 1")
        # NOTE: in every mode: a development server on a shared host is as easy to forge cookies for.
        why = _weak_secret(self.secret_key) if self.secret_key else None
        if why:
            raise ConfigError(
                f"{PREFIX}SECRET_KEY {why}; use a random value of at least {MIN_SECRET_LENGTH} characters "
                f"(python -c 'import secrets; print(secrets.token_urlsafe(48))'), or leave it unset to have one "
                "generated into HOME/session-secret"
            )
        return self

    def printable(self) -> dict[str, str]:
        """Return every setting as text fit to print: secrets masked, database URLs without their password."""
        shown: dict[str, str] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"] and f.name.endswith("_url"):
                shown[f.name] = mask_url(str(value))
            elif f.metadata["secret"]:
                shown[f.name] = MASK if value else ""
            else:
                shown[f.name] = str(value)
        return shown


def _convert(name: str, kind: type, raw: Any) -> Any:
    if kind is bool and isinstance(raw, str):
        lowered = raw.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{PREFIX}{name.upper()} must be true or false, not {raw!r}")
    try:
        return kind(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{PREFIX}{name.upper()} must be {kind.__name__}, not {raw!r}") from None


_TYPES = {"Path": Path, "str": str, "int": int, "float": float, "bool": bool}


def load_settings(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build validated settings from defaults, FLIGHTDECK_CONFIG (a TOML file), the environment and overrides."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    config_file = environ.get(f"{PREFIX}CONFIG")
    if config_file:
        try:
            values.update(tomllib.loads(Path(config_file).read_text()))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {PREFIX}CONFIG {config_file}: {exc}") from None
    for f in fields(Settings):
        key = PREFIX + f.name.upper()
        if key in environ:
            values[f.name] = environ[key]
    values.update(overrides or {})
    known = {f.name: f for f in fields(Settings)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting(s) {unknown}")
    converted = {name: _convert(name, _TYPES[str(known[name].type)], raw) for name, raw in values.items()}
    return dataclasses.replace(Settings(), **converted).validate()


def settings_table() -> str:
    """Return the settings as a Markdown table for the README."""
    rows = ["| Variable | Default | Meaning |", "| --- | --- | --- |"]
    for f in fields(Settings):
        rows.append(f"| `{PREFIX}{f.name.upper()}` | `{f.default}` | {f.metadata['doc']} |")
    return "\n".join(rows)
