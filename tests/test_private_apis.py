"""The private parts of uvicorn, uvicorn-worker and prometheus-client that Flightdeck relies on, pinned.

`controlplane/worker.py` subclasses uvicorn's `HttpToolsProtocol`, `Server` and uvicorn-worker's
`UvicornWorker`, overriding methods they call and reading their attributes; `controlplane/metrics.py`
and `metricsflush.py` build `Metric` families by hand, merge multiprocess files and write straight
into a histogram child's buckets. None of that is public API, so pyproject.toml bounds those three
packages above; each test here fails naming the attribute and the installed version when an upgrade
moves one, so raising a bound is: install the new version, run this file, read what broke.
"""

from __future__ import annotations

import asyncio
import inspect
from bisect import bisect_left
from importlib.metadata import version
from typing import Any

import pytest


def pin(ok: bool, distribution: str, what: str) -> None:
    """Fail, naming the package, its installed version and what moved, when `ok` is false."""
    if not ok:
        pytest.fail(f"{distribution} {version(distribution)}: {what} (see tests/test_private_apis.py)", pytrace=False)


def params(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def source(function: Any) -> str:
    return inspect.getsource(function)


# --- uvicorn: BoundedHttpToolsProtocol (controlplane/worker.py) --------------------------------------


def test_the_httptools_protocol_still_has_what_the_bounded_protocol_overrides_and_reads() -> None:
    from uvicorn.config import Config
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
    from uvicorn.server import ServerState

    # The methods the bounded protocol overrides, with the arguments it passes on.
    for name, expected in (
        ("__init__", ["self", "config", "server_state", "app_state", "_loop"]),
        ("data_received", ["self", "data"]),
        ("on_headers_complete", ["self"]),
        ("on_message_complete", ["self"]),
        ("on_response_complete", ["self"]),
        ("pause_writing", ["self"]),
        ("resume_writing", ["self"]),
        ("timeout_keep_alive_handler", ["self"]),
    ):
        method = getattr(HttpToolsProtocol, name, None)
        pin(method is not None, "uvicorn", f"HttpToolsProtocol.{name} is gone")
        pin(
            params(method) == expected,
            "uvicorn",
            f"HttpToolsProtocol.{name}{inspect.signature(method)}, not {expected}",
        )
    # on_response_complete is only worth overriding while the cycle calls it when a response ends.
    pin(
        "on_response=self.on_response_complete" in source(HttpToolsProtocol.on_headers_complete),
        "uvicorn",
        "on_headers_complete no longer hands on_response_complete to the RequestResponseCycle",
    )
    for attribute in ("self.response_complete", "self.disconnected", "self.message_event"):
        pin(
            attribute in source(RequestResponseCycle.__init__),
            "uvicorn",
            f"RequestResponseCycle.{attribute.removeprefix('self.')} is gone",
        )
    # A closing answer lingers: the cycle writes through its own `transport` and closes it when not keep-alive.
    pin(
        "self.transport = transport" in source(RequestResponseCycle.__init__)
        and "self.transport.close()" in source(RequestResponseCycle.send),
        "uvicorn",
        "RequestResponseCycle no longer closes the connection through its own transport attribute",
    )
    # Expect: 100-continue: the body's clock starts when receive() writes the 100 and asks the flow to read.
    receive = source(RequestResponseCycle.receive)
    pin(
        "self.waiting_for_100_continue" in source(RequestResponseCycle.__init__)
        and receive.index("100 Continue") < receive.index("self.flow.resume_reading()"),
        "uvicorn",
        "RequestResponseCycle.receive no longer writes 100 Continue and then calls flow.resume_reading()",
    )
    # The attributes the bounded protocol reads, on a real instance.
    loop = asyncio.new_event_loop()
    try:
        config = Config(app=_asgi_app, lifespan="off", log_config=None)
        protocol = HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
    finally:
        loop.close()
    for attribute in ("transport", "cycle", "loop", "timeout_keep_alive", "timeout_keep_alive_task", "pipeline"):
        pin(hasattr(protocol, attribute), "uvicorn", f"HttpToolsProtocol instances have no {attribute!r}")
    pin(protocol.cycle is None, "uvicorn", "HttpToolsProtocol.cycle no longer starts as None")


async def _asgi_app(scope: dict, receive: Any, send: Any) -> None:
    """Stands in for the app a Config needs; never called."""


def test_uvicorns_config_takes_a_protocol_class_and_the_settings_the_worker_sets() -> None:
    from uvicorn.config import Config

    from controlplane.httpprotocol import BoundedHttpToolsProtocol
    from controlplane.worker import FlightdeckWorker

    async def notify() -> None: ...

    config = Config(
        app=_asgi_app, log_config=None, callback_notify=notify, timeout_notify=1.0, **FlightdeckWorker.CONFIG_KWARGS
    )
    config.load()
    pin(
        config.http_protocol_class is BoundedHttpToolsProtocol,
        "uvicorn",
        "Config(http=<class>) no longer uses the class as the HTTP protocol",
    )
    for attribute in ("limit_concurrency", "timeout_graceful_shutdown", "timeout_notify", "callback_notify", "app"):
        pin(hasattr(config, attribute), "uvicorn", f"Config has no {attribute!r}, which FlightdeckWorker sets")
    pin(config.callback_notify is notify, "uvicorn", "Config.callback_notify is not what was given")


def test_uvicorns_server_still_has_what_the_draining_server_uses() -> None:
    from uvicorn.config import Config
    from uvicorn.server import Server

    pin(
        params(Server.handle_exit) == ["self", "sig", "frame"],
        "uvicorn",
        f"Server.handle_exit{inspect.signature(Server.handle_exit)}",
    )
    pin("sockets" in params(Server.serve), "uvicorn", f"Server.serve{inspect.signature(Server.serve)} takes no sockets")
    server = Server(Config(app=_asgi_app, log_config=None))
    for attribute in ("started", "should_exit", "config"):
        pin(hasattr(server, attribute), "uvicorn", f"Server instances have no {attribute!r}")
    pin(
        "callback_notify" in source(Server),
        "uvicorn",
        "Server no longer calls config.callback_notify (the worker's heartbeat)",
    )
    # DrainingServer.main_loop replaces uvicorn's, ticking once a second, and passes counters in tens.
    pin(params(Server.main_loop) == ["self"], "uvicorn", f"Server.main_loop{inspect.signature(Server.main_loop)}")
    pin(params(Server.on_tick) == ["self", "counter"], "uvicorn", f"Server.on_tick{inspect.signature(Server.on_tick)}")
    pin(
        "counter % 10 == 0" in source(Server.on_tick),
        "uvicorn",
        "Server.on_tick no longer does its once-a-second work (Date header, heartbeat) at counter % 10 == 0",
    )
    pin("main_loop()" in source(Server._serve), "uvicorn", "Server._serve no longer awaits main_loop()")
    pin(hasattr(server, "server_state") and hasattr(server.server_state, "connections"), "uvicorn",
        "Server.server_state.connections is gone (the worker's loop-lag timer reads it)")  # fmt: skip


# --- uvicorn-worker: FlightdeckWorker -----------------------------------------------------------------


def test_uvicorn_workers_worker_still_runs_the_serve_method_the_flightdeck_worker_replaces() -> None:
    from uvicorn_worker import UvicornWorker

    pin(
        isinstance(getattr(UvicornWorker, "CONFIG_KWARGS", None), dict),
        "uvicorn-worker",
        "UvicornWorker.CONFIG_KWARGS is gone",
    )
    init = source(UvicornWorker.__init__)
    pin("self.CONFIG_KWARGS" in init and "self.config = Config(" in init, "uvicorn-worker",
        "UvicornWorker.__init__ no longer builds self.config from self.CONFIG_KWARGS")  # fmt: skip
    pin('"callback_notify": self.callback_notify' in init, "uvicorn-worker",
        "UvicornWorker.__init__ no longer passes self.callback_notify to uvicorn (the heartbeat FlightdeckWorker overrides)")  # fmt: skip
    pin(
        "self._serve()" in source(UvicornWorker.run), "uvicorn-worker", "UvicornWorker.run no longer runs self._serve()"
    )
    for name in ("_serve", "callback_notify", "init_signals"):
        pin(callable(getattr(UvicornWorker, name, None)), "uvicorn-worker", f"UvicornWorker.{name} is gone")
    pin(
        inspect.iscoroutinefunction(UvicornWorker._serve),
        "uvicorn-worker",
        "UvicornWorker._serve is no longer a coroutine",
    )


def test_gunicorns_boot_error_code_is_there() -> None:
    from gunicorn.arbiter import Arbiter

    pin(isinstance(getattr(Arbiter, "WORKER_BOOT_ERROR", None), int), "gunicorn", "Arbiter.WORKER_BOOT_ERROR is gone")


# --- prometheus-client: metrics.py and metricsflush.py --------------------------------------------------


def test_metric_families_can_still_be_built_by_hand() -> None:
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

    pin(inspect.isclass(Collector), "prometheus-client", "prometheus_client.registry.Collector is gone")
    pin(params(Metric.__init__)[:5] == ["self", "name", "documentation", "typ", "unit"], "prometheus-client",
        f"Metric{inspect.signature(Metric.__init__)}, not (name, documentation, typ, unit)")  # fmt: skip
    registry = CollectorRegistry()
    Counter("pinned", "a counter", ["model"], registry=registry).labels("m").inc()
    family = next(iter(registry.collect()))
    for attribute in ("name", "documentation", "type", "unit", "samples"):
        pin(hasattr(family, attribute), "prometheus-client", f"a collected family has no {attribute!r}")
    sample = family.samples[0]
    pin(hasattr(sample, "_replace") and isinstance(sample.labels, dict), "prometheus-client",
        "a Sample is no longer a namedtuple with a labels dict")  # fmt: skip
    copy = Metric(family.name, family.documentation, family.type, family.unit)
    copy.samples = [sample._replace(labels={**sample.labels, "node": "n"})]
    pin(copy.samples[0].labels == {"model": "m", "node": "n"}, "prometheus-client", "Metric.samples cannot be set")


def test_the_multiprocess_merge_still_takes_files_and_accumulate() -> None:
    from prometheus_client import multiprocess

    merge = getattr(multiprocess.MultiProcessCollector, "merge", None)
    pin(merge is not None, "prometheus-client", "MultiProcessCollector.merge is gone")
    pin(
        params(merge)[:2] == ["files", "accumulate"],
        "prometheus-client",
        f"MultiProcessCollector.merge{inspect.signature(merge)}",
    )
    pin(
        callable(getattr(multiprocess, "mark_process_dead", None)),
        "prometheus-client",
        "multiprocess.mark_process_dead is gone",
    )


def test_a_histogram_child_keeps_one_count_per_bucket_and_a_sum_as_metricsflush_writes_them() -> None:
    from prometheus_client import CollectorRegistry, Histogram

    child = Histogram(
        "pinned_seconds", "a histogram", ["model"], buckets=(0.1, 1.0), registry=CollectorRegistry()
    ).labels("m")
    for attribute in ("_upper_bounds", "_buckets", "_sum"):
        pin(hasattr(child, attribute), "prometheus-client", f"a Histogram child has no {attribute!r}")
    bounds = list(child._upper_bounds)
    pin(bounds == [0.1, 1.0, float("inf")], "prometheus-client", f"Histogram._upper_bounds is {bounds}")
    pin(len(child._buckets) == len(bounds), "prometheus-client", "Histogram._buckets is not one value per bound")
    # NOTE: metricsflush adds to the first bucket whose bound is >= the value (bisect_left), not to every
    # bucket above it: the child's own observe must do the same, or the flushed counts would disagree.
    for value in (0.05, 0.1, 0.5, 3.0):
        child.observe(value)
    counts = [bucket.get() for bucket in child._buckets]
    expected = [0.0] * len(bounds)
    for value in (0.05, 0.1, 0.5, 3.0):
        expected[bisect_left(bounds, value)] += 1
    pin(counts == expected, "prometheus-client", f"Histogram._buckets counts {counts}, not one per bucket {expected}")
    pin(child._sum.get() == pytest.approx(3.65), "prometheus-client", "Histogram._sum is not the sum of observations")
    child._buckets[0].inc(2)
    child._sum.inc(0.1)
    pin(
        child._buckets[0].get() == 4 and hasattr(child._sum, "inc"),
        "prometheus-client",
        "Histogram values take no inc()",
    )
