"""Typed, layered settings: defaults -> optional TOML file -> FLIGHTDECK_* environment -> overrides.

Every setting is declared once below with its type, range, default and meaning (pydantic-settings);
a bad value stops the start with a message naming the variable, and the docs site's table is printed
from these declarations (`python -m controlplane config --markdown`).
"""

from __future__ import annotations

import os
import re
import socket
import tomllib
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from cryptography.fernet import Fernet
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources.utils import parse_env_vars

from controlplane.configdoc import explain, markdown_table
from serving.settings import BatchingSettings, RuntimeSettings, parallelism

if TYPE_CHECKING:
    from alerts.notifiers.targets import TargetPolicy
    from controlplane.cluster import Liveness
    from controlplane.history.retention import RetentionPolicy
    from controlplane.rollout.service import RolloutSettings

PREFIX = "FLIGHTDECK_"
DEV_SECRET = "dev-insecure-secret"  # the old built-in default: public, so refused like any known value
MIN_SECRET_LENGTH = 32
# Values seen in READMEs, tutorials and compose files; a secret anyone can guess signs anyone's cookie.
WEAK_SECRETS = frozenset(
    {
        DEV_SECRET,
        *("changeme", "change-me", "change_me", "secret", "secret-key", "secret_key", "password", "development"),
        *("dev", "test", "flightdeck", "insecure", "default", "your-secret-key", "supersecret"),
    }
)
MASK = "********"
_URL_PASSWORD_ANYWHERE = re.compile(r"(?P<head>[A-Za-z][\w+.-]*://[^:/@\s]*):[^@\s]*@")
_SECRET_PARAMETER = re.compile(r"pass|secret|token", re.IGNORECASE)  # libpq: password, sslpassword
_PASSWORD_PARAMETER = re.compile(r"(?P<key>\b\w*(?:pass\w*|secret|token)\s*=\s*)('[^']*'|[^\s&;,'\"]+)", re.IGNORECASE)

_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")  # a host or pod name: safe in labels and NODE:PID
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]


class ConfigError(ValueError):
    """A setting has a value that cannot be used; the message names it."""


def _setting(default: Any, doc: str, **limits: Any) -> Any:
    """Declare a setting: its default, its line in the docs' settings page and its range (ge, gt, le, min_length)."""
    return Field(default, description=doc, **limits)


def mask_url(url: str) -> str:
    """Return a database URL with its password replaced by ***, for printing and logs.

    The password may sit in the user part or, as libpq accepts, in the query (`?password=...`); both
    are hidden, through SQLAlchemy's own URL parsing and rendering. Text that is not a URL is masked
    by pattern, as `mask_secrets` masks any message.
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return mask_secrets(url)
    secret_keys = [key for key in parsed.query if _SECRET_PARAMETER.search(key)]
    if secret_keys:
        parsed = parsed.difference_update_query(secret_keys)
    shown = parsed.render_as_string(hide_password=True)
    if secret_keys:
        shown += ("&" if parsed.query else "?") + "&".join(f"{key}=***" for key in secret_keys)
    return shown


def mask_secrets(text: str) -> str:
    """Return `text` (a message, a conninfo string) with URL passwords and password=... values replaced by ***."""
    text = _URL_PASSWORD_ANYWHERE.sub(r"\g<head>:***@", text)
    return _PASSWORD_PARAMETER.sub(r"\g<key>***", text)


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


def parse_fernet_keys(text: str) -> list[bytes]:
    """Return the Fernet keys in `text` (comma- or line-separated, newest first); ValueError names a bad one by place."""
    keys = [part.strip().encode() for part in text.replace("\n", ",").split(",") if part.strip()]
    for n, key in enumerate(keys, 1):
        try:
            Fernet(key)
        except ValueError:
            raise ValueError(f"key {n} is not a Fernet key (32 url-safe base64-encoded bytes)") from None
    return keys


class Settings(BaseSettings):
    """All of Flightdeck's settings. Environment names are FLIGHTDECK_ + the upper-cased field name."""

    # NOTE: frozen, like the dataclass it replaced: one object is shared by every thread of a process.
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="forbid", frozen=True, allow_inf_nan=False, validate_default=False
    )

    home: Path = _setting(Path(".flightdeck"), "Data directory holding the database, the model registry and logs.")
    env: Literal["development", "production"] = _setting("development", "development or production.")
    secret_key: SecretStr = _setting(
        SecretStr(""),
        "Secret for signing session cookies, at least 32 characters (known example values are refused in every "
        "mode). Empty: a random one is generated at the first start into HOME/session-secret (mode 0600) and "
        "shared by every process using that HOME; set it when nodes do not share HOME.",
    )
    secret_keys: SecretStr = _setting(
        SecretStr(""),
        "Keys that encrypt receiver secrets in the database: Fernet keys, comma-separated, newest first (the "
        "newest encrypts, all decrypt). Empty: HOME/secret.key, generated at the first start (mode 0600). Set "
        "it when secrets are injected or nodes do not share HOME; rotate with `flightdeck secrets rotate-key`.",
    )
    database_url: SecretStr = _setting(
        SecretStr(""),
        "SQLAlchemy URL; empty means SQLite at HOME/flightdeck.db. postgresql+psycopg://... works too "
        "(its password, after the user name or as ?password=, is masked wherever the URL is printed).",
    )
    host: str = _setting("127.0.0.1", "Address gunicorn binds.", min_length=1)
    port: int = _setting(8000, "Port gunicorn binds.", ge=1, le=65535)
    grpc_port: int = _setting(
        8001,
        "Port of the Open Inference Protocol over gRPC (inference.GRPCInferenceService, grpc.health.v1), on "
        "FLIGHTDECK_HOST, served by every worker (SO_REUSEPORT); 0 turns it off.",
        ge=0,
        le=65535,
    )
    grpc_max_streams: int = _setting(
        100,
        "Concurrent gRPC calls one connection may hold (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); a client needing "
        "more opens more connections, and past gunicorn's worker_connections calls in all a worker refuses more.",
        ge=1,
    )
    workers: int = _setting(
        0,
        "gunicorn worker processes (0: one per CPU core, at most 4). Each holds its own engine and its own copy "
        "of every model; one process's Python work (HTTP, JSON) cannot use a second core (docs: Benchmarks).",
        ge=0,
        le=256,
    )
    threads: int = _setting(
        0,
        "Flask threads per worker: the console, the API, and inference when INFERENCE_AUTH is on (0: enough to "
        "hold every queue full plus running batches).",
        ge=0,
        le=4096,
    )
    log_level: LogLevel = _setting("INFO", "Python log level of Flightdeck's own loggers (others stay at WARNING).")
    log_format: Literal["text", "json"] = _setting(
        "text", "Terminal log lines: text for people, json for machines (one object per line, RFC 3339 UTC times)."
    )
    demo_models: bool = _setting(
        True, "On a first start (empty registry, nothing deployed), push the demo models (textcls, mlp) and deploy v1."
    )
    load_models: str = _setting(
        "", "Per-node filter: comma-separated deployed models this node serves (empty: every deployed model)."
    )
    device: Literal["auto", "cpu", "cuda"] = _setting("auto", "auto (CUDA when usable), cpu, or cuda.")
    gpu_device_id: int = _setting(0, "CUDA device index.", ge=0)
    gpu_mem_limit_mb: int = _setting(0, "CUDA provider memory limit per session in MiB (0: no limit).", ge=0)
    ort_intra_op_threads: int = _setting(
        0, "ONNX Runtime intra-op threads (0: auto, cores / batch instances on CPU).", ge=0
    )
    ort_inter_op_threads: int = _setting(1, "ONNX Runtime inter-op threads.", ge=0)
    ort_allow_spinning: bool = _setting(
        False, "Let idle ONNX Runtime threads spin (costs CPU the event loop and the other executors need)."
    )
    ort_lone_request_session: bool = _setting(
        True,
        "On the CPU, a second session per model version with every core, for a request that arrives when nothing "
        "else runs on the node (an idle server's latency); kept only where it is faster, timed at load. Costs a "
        "second copy of the weights. On 2 cores: 1.2-1.6x the requests/s at concurrency 1 on textcls, level "
        "at 2 and beyond (docs/benchmarks.md).",
    )
    ort_graph_optimization: Literal["disable", "basic", "extended", "all"] = _setting(
        "all", "Graph optimisation level: disable, basic, extended, all."
    )
    ort_cpu_mem_arena: bool = _setting(True, "Use ONNX Runtime's CPU memory arena.")
    ort_mem_pattern: bool = _setting(True, "Use ONNX Runtime's memory pattern planning.")
    ort_arena_extend_strategy: Literal["kNextPowerOfTwo", "kSameAsRequested"] = _setting(
        "kNextPowerOfTwo", "Arena growth: kNextPowerOfTwo or kSameAsRequested."
    )
    batching: bool = _setting(True, "Dynamic batching on or off (off: every request runs alone).")
    max_batch_size: int = _setting(32, "Largest batch the batcher forms (a model's own hint can lower it).", ge=1)
    max_queue_delay_ms: float = _setting(
        2.0, "Longest a request waits for a batch to fill while the engine is busy.", ge=0
    )
    max_queue_size: int = _setting(128, "Samples queued per loaded version before requests are refused with 429.", ge=1)
    default_timeout_ms: float = _setting(
        10_000.0, "Default request deadline; a client's 'timeout' parameter may only shorten it.", gt=0
    )
    batch_instances: int = _setting(
        0, "Executor threads per loaded version (0: auto, min(cores, 4) on CPU, 2 on GPU).", ge=0
    )
    warmup_max_sequence: int = _setting(128, "Longest sequence bucket used for warm-up.", ge=1)
    batch_limit_from_cost: bool = _setting(
        True,
        "At load, time batch sizes 1, 2, 4, ... up to the max per sequence bucket and merge requests only up to "
        "the smallest size whose cost per sample is within FLIGHTDECK_BATCH_COST_MARGIN of the best (at least 2); shown in "
        "/v2/models/{m}/config (false: batches up to the max batch size).",
    )
    batch_cost_margin: float = _setting(
        0.05,
        "The batch limit is the smallest batch size whose cost per sample is within this share of the best "
        "measured (0.05: 5 %); larger: smaller batches, shorter waits.",
        ge=0,
        lt=1,
    )
    batch_cost_budget_s: float = _setting(
        3.0, "Most seconds one version's load spends timing batch sizes (what it measured by then still counts).", gt=0
    )
    drift_sample_every: int = _setting(
        16,
        "Summarise the numeric inputs of one successful request in this many, for input drift (0: none; "
        "predicted labels are always counted).",
        ge=0,
    )
    max_request_bytes: int = _setting(16 * 1024 * 1024, "Largest inference request body; larger ones get 413.", ge=1)
    header_timeout_s: float = _setting(
        10.0,
        "A request's line and headers must arrive whole within this many seconds of their first byte (of the "
        "connection's opening, for its first request); else 408 and the connection closes (nginx's "
        "client_header_timeout). A new connection that sends nothing is closed after it.",
        gt=0,
    )
    body_timeout_s: float = _setting(
        10.0,
        "Longest wait for the next bytes of a request body while the server reads it (nginx's "
        "client_body_timeout); then 408 and the connection closes, freeing its buffer and any Flask thread "
        "reading it.",
        gt=0,
    )
    body_min_rate: int = _setting(
        65536,
        "Bytes per second a request body must average after its first BODY_TIMEOUT_S (Apache's mod_reqtimeout "
        "MinRate): a body may take BODY_TIMEOUT_S plus one second per this many bytes. 0: only BODY_TIMEOUT_S.",
        ge=0,
    )
    send_timeout_s: float = _setting(
        30.0,
        "Longest wait for a client to read more of an answer the server is blocked sending (nginx's send_timeout, "
        "between two reads); then the connection is aborted, freeing its buffer and any Flask thread sending it.",
        gt=0,
    )
    keepalive_timeout_s: float = _setting(
        5.0, "An idle keep-alive connection (no request in progress, no new bytes) is closed after this.", gt=0
    )
    max_request_values: int = _setting(
        1_048_576,
        "Most values the JSON of one inference request may hold, all inputs together (counted cheaply, before "
        "parsing, as its commas); more get 413. Parsing JSON holds Python's lock, so millions of tiny values stall "
        "every other request for a second: send large tensors with the binary tensor extension.",
        ge=1,
    )
    decode_thread_bytes: int = _setting(
        65536,
        "Inference bodies larger than this are decoded in a worker thread rather than on the event loop, so a big "
        "body cannot stall the loop (and the health probes it answers).",
        ge=0,
    )
    drain_grace_s: float = _setting(30.0, "On SIGTERM, how long accepted requests may take to finish.", ge=0)
    log_sample_rate: float = _setting(
        0.01, "Share of successful, fast requests logged (errors and slow ones always are).", ge=0, le=1
    )
    slow_request_ms: float = _setting(1000.0, "Requests slower than this are always logged.", ge=0)
    scheduler: bool = _setting(True, "Run scheduled jobs (one leader process runs the cluster-wide ones).")
    job_process: bool = _setting(
        True,
        "Run the leader's window jobs (alert evaluation, drift scores, retention) in a process of their own, "
        "replaced when its memory grows; false: in the worker's threads.",
    )
    job_process_max_growth_mb: float = _setting(
        32.0, "How far (MiB) the job process's RSS may grow past its level once warm before it is replaced.", gt=0
    )
    job_process_timeout_s: float = _setting(
        300.0, "How long one window job may run in the job process before the process is killed.", gt=0
    )
    lease_ttl_s: float = _setting(15.0, "How long the scheduler leader's lease lasts without renewal.", gt=0)
    history_interval_s: float = _setting(10.0, "How often each serving process writes a history row per slot.", gt=0)
    history_raw_retention_h: float = _setting(6.0, "Hours raw history rows are kept before 1-minute rollup.", ge=0)
    history_minute_retention_d: float = _setting(7.0, "Days 1-minute rows are kept before 1-hour rollup.", ge=0)
    history_hour_retention_d: float = _setting(90.0, "Days 1-hour rows are kept before deletion.", ge=0)
    retention_interval_s: float = _setting(60.0, "How often the scheduler leader applies history retention.", gt=0)
    max_archive_bytes: int = _setting(
        1024**3, "Largest model archive (tar.gz) a push accepts; a larger upload gets 413 and nothing is kept.", ge=1
    )
    max_archive_files: int = _setting(64, "Most files and folders one model archive may hold.", ge=1)
    max_unpacked_bytes: int = _setting(
        4 * 1024**3, "Most bytes a model archive may unpack to, all files together (checked before unpacking).", ge=1
    )
    storage_url: str = _setting(
        "",
        "Where pushed archives and their unpacked files are kept: empty for HOME/registry on this disk, or "
        "s3://bucket/prefix for an S3-compatible bucket every node shares (needs the s3 extra; credentials and "
        "region from the usual AWS_* variables). Each node then keeps a SHA-256-verified copy under HOME/cache.",
    )
    storage_endpoint_url: str = _setting(
        "",
        "S3 API address of an S3-compatible store (MinIO, Ceph, ...), e.g. http://minio:9000; empty: AWS's own, "
        "or AWS_ENDPOINT_URL.",
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
    cookie_secure: Literal["auto", "always", "never"] = _setting(
        "auto",
        "Secure flag on the session cookie: auto (when the request came over HTTPS, as the server sees it behind "
        "FORWARDED_ALLOW_IPS), always, or never. Use always whenever the console is reached over HTTPS.",
    )
    session_hours: float = _setting(
        12.0, "How long a console login lasts (from the moment of login); then the console asks again.", gt=0
    )
    session_idle_minutes: float = _setting(
        60.0,
        "A console login unused this long ends (its last use is recorded at most once a minute), "
        "however much of SESSION_HOURS is left.",
        gt=0,
    )
    login_max_failures: int = _setting(
        5, "Failed logins per name and client address before further attempts are refused (429) for a while.", ge=1
    )
    login_lockout_s: float = _setting(
        30.0, "First refusal period after LOGIN_MAX_FAILURES; doubles with each further failure, up to 64 times.", ge=0
    )
    public_url: str = _setting(
        "", "The console's address as people reach it, for links in alerts (empty: http://HOST:PORT)."
    )
    receiver_allow: str = _setting(
        "",
        "Internal destinations chat receivers may reach: comma-separated addresses, CIDR networks and host names "
        "(e.g. 10.20.0.0/16,alertmanager.internal). Loopback, link-local, cloud metadata, private and other "
        "non-public addresses are refused otherwise, when a receiver is saved and on every send.",
    )
    alert_interval_s: float = _setting(15.0, "How often the scheduler leader evaluates alert rules.", gt=0)
    drift_interval_s: float = _setting(
        60.0, "How often the scheduler leader computes drift scores for flightdeck_drift_score.", gt=0
    )
    drift_window_s: float = _setting(
        3600.0,
        "The window whose answers and inputs flightdeck_drift_score compares with each version's reference.",
        gt=0,
    )
    outbox_interval_s: float = _setting(5.0, "How often the scheduler leader delivers due alert notifications.", gt=0)
    outbox_backoff_s: float = _setting(30.0, "First retry delay of a failed notification; doubles up to an hour.", ge=0)
    alert_repeat_h: float = _setting(
        4.0,
        "Hours before a still-firing, unacknowledged alert group is sent again, for receivers without their own "
        "repeat_interval.",
        ge=0,
    )
    alert_rules_dir: str = _setting("", "Folder of alert rule YAML files (empty: the shipped alerts/rules).")
    docs_dir: str = _setting(
        "",
        "Folder of a built documentation site served under /docs (empty: the one bundled in the package, built by "
        "`make docs` or when the wheel is built; without one /docs says how to build it).",
    )
    reconcile_poll_ms: float = _setting(
        25.0,
        "How often a process looks for desired state others wrote when nothing woke it, on SQLite: for 0.2 s after "
        "an inotify wake-up, or always where inotify is missing (a change-counter read). PostgreSQL uses "
        "LISTEN/NOTIFY and RECONCILE_SAFETY_POLL_S instead (at least 1 s where LISTEN is unavailable).",
        gt=0,
    )
    reconcile_safety_poll_s: float = _setting(
        5.0,
        "On PostgreSQL, how often a node reads the desired state although no NOTIFY woke it: the safety net for a "
        "notification lost with a dropped connection.",
        ge=1,
        le=5,
    )
    heartbeat_s: float = _setting(
        10.0,
        "How often each serving process reports that it is alive (engine_status). One silent for three heartbeats "
        "is shown as gone wherever processes are listed (the API, the console, `status`).",
        gt=0,
    )
    process_drop_s: float = _setting(
        600.0,
        "How long a gone process stays listed (as gone) before the scheduler leader drops its reports.",
        gt=0,
    )
    cache_prune_s: float = _setting(
        60.0,
        "With an object store: how often each node drops its cached copies (and their lock files) of versions "
        "deleted from the registry, and of versions no deployment names that nobody used for 10 minutes.",
        gt=0,
    )
    node: str = _setting(
        "",
        "This node's name: the `node` label on every metric and the prefix of its processes' names (NODE:PID) in "
        "history and status rows. Empty: the host name (a Kubernetes pod's name).",
    )
    rollout_tick_s: float = _setting(1.0, "How often the scheduler leader advances rollouts (steps, analysis).", gt=0)
    rollout_pause_s: float = _setting(60.0, "Default time a canary step takes traffic before it is analysed.", ge=0)
    scale_down_delay_s: float = _setting(
        600.0, "How long the previous stable version stays loaded after a rollout.", ge=0
    )
    rollback_window_s: float = _setting(
        604800.0, "A version stable this recently comes back on rollback without analysis.", ge=0
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_in_any_case(cls, value: Any) -> Any:
        known = isinstance(value, str) and value.strip().upper() in LogLevel.__args__
        return value.strip().upper() if known else value

    @field_validator("secret_keys")
    @classmethod
    def _fernet_keys(cls, value: SecretStr) -> SecretStr:
        parse_fernet_keys(value.get_secret_value())  # a ValueError names the bad key by its position, never its value
        return value

    @field_validator("secret_key")
    @classmethod
    def _secret_is_strong(cls, value: SecretStr) -> SecretStr:
        # NOTE: in every mode: a development server on a shared host is as easy to forge cookies for.
        why = _weak_secret(value.get_secret_value()) if value.get_secret_value() else None
        if why:
            raise ValueError(
                f"{why}; use a random value of at least {MIN_SECRET_LENGTH} characters "
                f"(python -c 'import secrets; print(secrets.token_urlsafe(48))'), or leave it unset to have one "
                "generated into HOME/session-secret"
            )
        return value

    @field_validator("storage_url")
    @classmethod
    def _storage_url_parses(cls, value: str) -> str:
        from controlplane.registry.storage import parse_storage_url

        parse_storage_url(value)  # ValueError says what an s3:// URL must look like
        return value

    @field_validator("storage_endpoint_url")
    @classmethod
    def _endpoint_is_http(cls, value: str) -> str:
        if value and not re.match(r"^https?://[^/\s]+/?$", value):
            raise ValueError("must be http(s)://host[:port], or empty")
        return value

    @field_validator("node")
    @classmethod
    def _node_is_a_name(cls, value: str) -> str:
        if value and not _NODE_NAME.fullmatch(value):
            raise ValueError("must be 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")
        return value

    @field_validator("receiver_allow")
    @classmethod
    def _allow_list_parses(cls, value: str) -> str:
        from alerts.notifiers.targets import TargetPolicy  # noqa: F811 (kept out of gunicorn.conf's imports)

        TargetPolicy.parse(value)  # ValueError names the entry that is not an address, network or name
        return value

    @model_validator(mode="after")
    def _threads_hold_the_queue(self) -> Settings:
        if self.threads and self.threads < self.max_queue_size + self.max_batch_size:
            raise ValueError(
                f"{PREFIX}THREADS={self.threads} cannot hold a full queue ({PREFIX}MAX_QUEUE_SIZE={self.max_queue_size}) "
                f"plus a running batch ({PREFIX}MAX_BATCH_SIZE={self.max_batch_size}): the excess would wait inside "
                "the worker's thread pool, past admission control and deadlines. Raise THREADS, lower MAX_QUEUE_SIZE, "
                "or use 0 (auto)."
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Read nothing implicitly: `load_settings` layers the file, the environment and the overrides."""
        return (init_settings,)

    @property
    def sqlalchemy_url(self) -> str:
        """Return the database URL, defaulting to SQLite under the data directory."""
        return self.database_url.get_secret_value() or f"sqlite:///{(self.home / 'flightdeck.db').resolve()}"

    @property
    def log_dir(self) -> Path:
        """Return the folder of the log files (requests.log)."""
        return self.home / "logs"

    @property
    def measurements_dir(self) -> Path:
        """Return where the workers of this node share what their loads measured (serving.measured)."""
        return self.home.resolve() / "measured"

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
            history_interval_s=self.history_interval_s,
            process_gone_after_s=self.liveness.gone_after_s,
        )

    @property
    def liveness(self) -> Liveness:
        """Return how long a serving process may stay silent before it is shown as gone, then dropped."""
        from controlplane.cluster import Liveness  # noqa: F811 (kept out of gunicorn.conf's imports)

        return Liveness(heartbeat_s=self.heartbeat_s, drop_after_s=self.process_drop_s)

    @property
    def console_url(self) -> str:
        """Return the base URL for links people follow from chat."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def receiver_targets(self) -> TargetPolicy:
        """Return the destinations chat receivers may reach (public ones, and RECEIVER_ALLOW's)."""
        from alerts.notifiers.targets import TargetPolicy  # noqa: F811

        return TargetPolicy.parse(self.receiver_allow)

    @property
    def node_name(self) -> str:
        """Return NODE, or the host name when it is empty."""
        return self.node or socket.gethostname()

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
        """Return the Flask threads per worker: explicit, or room for two models' full queues and batches.

        NOTE: inference requests reach Flask's threads when inference auth is on; one waiting for a
        thread is invisible to admission control and to its deadline, so there must be a thread for
        every request the engine could hold. (Threads are started only when needed.)
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
            lone_request_session=self.ort_lone_request_session,
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
            learn_batch_limits=self.batch_limit_from_cost,
            batch_cost_margin=self.batch_cost_margin,
            batch_cost_budget_s=self.batch_cost_budget_s,
            input_sample_every=self.drift_sample_every,
        )

    def public(self) -> dict[str, Any]:
        """Return every setting as JSON-ready values: secrets masked, database URLs without their password."""
        shown = self.model_dump(mode="json")
        shown["secret_key"] = MASK if self.secret_key.get_secret_value() else ""
        shown["secret_keys"] = MASK if self.secret_keys.get_secret_value() else ""
        shown["database_url"] = mask_url(self.database_url.get_secret_value())
        return shown

    def printable(self) -> dict[str, str]:
        """Return every setting as text fit to print: secrets masked, database URLs without their password."""
        return {name: str(value) for name, value in self.public().items()}


def secret_fields() -> frozenset[str]:
    """Return the names of the settings that hold secrets (never printed, never echoed in errors)."""
    return frozenset(name for name, f in Settings.model_fields.items() if f.annotation is SecretStr)


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' FLIGHTDECK_* source over a given mapping (os.environ, or a test's own dict)."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


def load_settings(environ: Mapping[str, str] | None = None, overrides: Mapping[str, Any] | None = None) -> Settings:
    """Build validated settings from defaults, FLIGHTDECK_CONFIG (a TOML file), the environment and overrides."""
    environ = os.environ if environ is None else environ
    from_file: dict[str, Any] = {}
    config_file = environ.get(f"{PREFIX}CONFIG")
    if config_file:
        try:
            from_file = tomllib.loads(Path(config_file).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {PREFIX}CONFIG {config_file}: {exc}") from None
    from_env = _EnvironSource(environ)()
    try:
        return Settings(**{**from_file, **from_env, **(overrides or {})})
    except ValidationError as exc:
        only_in_file = set(from_file) - set(from_env) - set(overrides or {})
        raise ConfigError(explain(exc, Settings, PREFIX, secret_fields(), only_in_file, config_file)) from None


def settings_table() -> str:
    """Return the settings as a Markdown table (the docs site's settings page, generated at build time)."""
    return markdown_table(Settings, PREFIX)
