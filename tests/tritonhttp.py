"""tritonclient's HTTP client as the tests use it: closed by whoever made it, and only then."""

from __future__ import annotations

import tritonclient.http as httpclient


class Client(httpclient.InferenceServerClient):
    """tritonclient.http's client without its `__del__`.

    NOTE: its own `__del__` closes it again, from whichever thread the garbage collector runs in, where
    gevent refuses the pool of another thread's hub (an unraisable InvalidThreadUseError, which pytest
    then pins on whatever test is running: seen twice in CI). Every test closes its clients itself.
    """

    def __del__(self) -> None:
        pass
