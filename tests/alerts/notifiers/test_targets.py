"""Internal destinations: refused when saved and when sent, unless the allow-list names them."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from alerts.notifiers import Notification, deliver, make_notifier
from alerts.notifiers.base import Outgoing
from alerts.notifiers.delivery import send
from alerts.notifiers.targets import PUBLIC_ONLY, TargetPolicy, TargetRefused, address_kind
from tests.alerts.notifiers.recorder import LOOPBACK, RecordingServer
from tests.alerts.notifiers.samples import NOW


@pytest.mark.parametrize(
    ("host", "reason"),
    [
        ("127.0.0.1", "a loopback address"),
        ("127.1", "a loopback address"),  # the short and numeric forms resolvers accept
        ("0x7f.0.0.1", "a loopback address"),
        ("2130706433", "a loopback address"),
        ("[::1]", "a loopback address"),
        ("[::ffff:127.0.0.1]", "a loopback address"),
        ("169.254.169.254", "a cloud metadata address"),
        ("[fd00:ec2::254]", "a cloud metadata address"),
        ("169.254.10.1", "a link-local address"),
        ("[fe80::1]", "a link-local address"),
        ("10.0.0.5", "a private address"),
        ("192.168.1.1", "a private address"),
        ("[fd12::1]", "a private address"),
        ("100.64.0.1", "a non-global address"),
        ("0.0.0.0", "an unspecified address"),
        ("localhost", "a loopback name"),
        ("hooks.localhost", "a loopback name"),
        ("metadata.google.internal", "a cloud metadata name"),
    ],
)
def test_internal_hosts_are_refused_when_saved(host: str, reason: str) -> None:
    with pytest.raises(TargetRefused, match=reason):
        PUBLIC_ONLY.check_url(f"https://{host}:8443/hook")


@pytest.mark.parametrize("host", ["hooks.slack.com", "8.8.8.8", "[2606:4700::1111]", "cafe.be"])
def test_public_hosts_and_names_pass_the_save_check(host: str) -> None:
    PUBLIC_ONLY.check_url(f"https://{host}/hook")


def test_the_allow_list_names_addresses_networks_and_hosts() -> None:
    policy = TargetPolicy.parse("127.0.0.1, 10.20.0.0/16 alertmanager.internal.")
    policy.check_url("http://127.0.0.1:9093/hook")
    policy.check_url("https://10.20.3.4/hook")
    assert policy.refusal("alertmanager.internal", ipaddress.ip_address("10.9.9.9")) is None  # named host
    with pytest.raises(TargetRefused, match="a private address"):
        policy.check_url("https://10.21.0.1/hook")
    with pytest.raises(TargetRefused, match="a cloud metadata address"):
        policy.check_url("https://169.254.169.254/latest/meta-data/")
    with pytest.raises(ValueError, match="'bad/entry' is neither an address"):
        TargetPolicy.parse("127.0.0.1,bad/entry")


def test_address_kinds() -> None:
    assert address_kind(ipaddress.ip_address("1.1.1.1")) is None
    assert address_kind(ipaddress.ip_address("224.0.0.1")) == "multicast"
    assert address_kind(ipaddress.ip_address("::ffff:10.0.0.1")) == "private"


def _name_resolving_internally() -> str:
    """This machine's own name: it passes the save check (not an address, not localhost) but resolves inside."""
    name = socket.gethostname()
    addresses = {info[4][0] for info in socket.getaddrinfo(name, 80, type=socket.SOCK_STREAM)}
    if any(address_kind(ipaddress.ip_address(a.split("%")[0])) is None for a in addresses):
        pytest.skip(f"{name} resolves to a public address here")
    return name


def test_a_name_is_checked_again_on_the_addresses_it_resolves_to_at_send_time(firing: Notification) -> None:
    name = _name_resolving_internally()
    with RecordingServer(200, b"ok") as server:
        port = server.url.rsplit(":", 1)[1]
        url = f"https://{name}:{port}/hook"
        PUBLIC_ONLY.check_url(url)  # nothing to refuse before the name is resolved
        notifier = make_notifier("webhook", {"url": url})
        result = deliver(notifier, firing, NOW, timeout_s=5)
    assert (result.ok, result.permanent, result.maybe_delivered) == (False, True, False)
    assert result.error.startswith("refused destination: the host resolves to a")
    assert server.requests == []  # nothing left the process


def test_a_refused_destination_gets_no_connection(firing: Notification) -> None:
    for url in ("http://127.0.0.1:{port}/hook", "https://[::ffff:127.0.0.1]:{port}/hook"):
        with RecordingServer(200, b"ok") as server:
            port = server.url.rsplit(":", 1)[1]
            notifier = make_notifier("webhook", {"url": url.format(port=port), "allow_http": url.startswith("http:")})
            result = deliver(notifier, firing, NOW, timeout_s=5)
        assert result.permanent and "loopback address" in result.error
        assert server.requests == []


def test_an_allowed_name_is_sent_to_the_checked_address_with_its_own_host_header() -> None:
    name = _name_resolving_internally()
    with RecordingServer(204) as server:
        port = int(server.url.rsplit(":", 1)[1])
        policy = TargetPolicy.parse(name)
        status, _headers, _body = send(Outgoing("POST", f"http://{name}:{port}/x", {}, b"hi"), 5, policy)
    assert status == 204
    assert server.requests[0].headers["host"] == f"{name}:{port}"


def test_a_redirect_to_an_internal_address_is_not_followed(firing: Notification) -> None:
    with RecordingServer(200, b"secret internal page") as inside:
        with RecordingServer(307, b"", {"Location": inside.url + "/admin"}) as outside:
            notifier = make_notifier("webhook", {"url": outside.url + "/hook", "allow_http": True})
            result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
    assert (result.ok, result.permanent, result.error) == (False, True, "HTTP 307")
    assert len(outside.requests) == 1 and inside.requests == []


def test_an_error_reports_the_status_and_the_service_code_never_the_body(firing: Notification) -> None:
    answers = [
        (500, b"<html>Internal admin panel: user=root password=hunter2</html>", "HTTP 500"),
        (404, b"no_service", "HTTP 404: no_service"),  # Slack's answer is only a code
        (400, b'{"error": {"code": "TriggerInputSchemaMismatch", "message": "details"}}', "HTTP 400: Trigger"),
    ]
    for status, body, expected in answers:
        with RecordingServer(status, body) as server:
            notifier = make_notifier("webhook", {"url": server.url + "/hook", "allow_http": True})
            result = deliver(notifier, firing, NOW, timeout_s=5, targets=LOOPBACK)
        assert result.error.startswith(expected)
        assert "password" not in result.error and "details" not in result.error
