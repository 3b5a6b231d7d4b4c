"""Alertmanager's notification model, pure: group keys, group_wait/interval/repeat, whole-group messages."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from alerts.dispatch import Group, Route, alertmanager_order, dispatch, label_set
from alerts.lifecycle import Matcher, Tracked, fingerprint
from alerts.rules import duration_text
from alerts.states import AlertState, Severity

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)
ROUTE = Route("chat", ("P0", "P1"), group_wait=timedelta(seconds=30), group_interval=timedelta(minutes=5))


def alert(model: str, state: AlertState = AlertState.FIRING, rule: str = "high_error_rate", **changes) -> Tracked:
    labels = {"alertname": rule, "model": model, "severity": "P1"}
    made = Tracked(fingerprint(rule, labels), rule, Severity.P1, labels, state, value=0.2, firing_since=T0)
    return replace(made, **changes)


class Dispatcher:
    """Carries group state from one evaluation to the next, as the evaluator's table does."""

    def __init__(self, route: Route = ROUTE) -> None:
        self.route = route
        self.groups: dict[tuple[str, str], Group] = {}

    def __call__(self, alerts: list[Tracked], at: datetime, muted: dict[str, str] | None = None):
        updated, flushes = dispatch([self.route], alerts, muted or {}, self.groups, at)
        for ident, group in updated.items():
            if group is None:
                self.groups.pop(ident, None)
            else:
                self.groups[ident] = group
        return [
            (f.status, [a.labels["model"] for a in f.firing], [a.labels["model"] for a in f.resolved]) for f in flushes
        ]


def test_group_key_is_alertmanagers_route_key_then_the_group_label_set() -> None:
    route = Route("chat", ("P0", "P1"), (Matcher("model", "text.*", regex=True),), group_by=("alertname", "model"))
    assert route.key == '{}/{model=~"text.*",severity=~"P0|P1"}'  # sorted by name, as Alertmanager's Route.Key
    a = alert("textcls")
    assert route.group_labels(a) == {"alertname": "high_error_rate", "model": "textcls"}
    assert route.group_key(a) == '{}/{model=~"text.*",severity=~"P0|P1"}:{alertname="high_error_rate", model="textcls"}'
    by_value = Route("x", ("P1",), (Matcher("model", "b"), Matcher("model", "a", regex=True), Matcher("model", "a")))
    assert by_value.key == '{}/{model="a",model=~"a",model="b",severity=~"P1"}'  # then value, then type
    assert Route("x", ("P0",), group_by=("missing",)).group_key(a) == '{}/{severity=~"P0"}:{}'
    assert label_set({"b": 'say "hi"\n', "a": "\\"}) == '{a="\\\\", b="say \\"hi\\"\\n"}'
    assert [duration_text(timedelta(seconds=s)) for s in (0, 30, 300, 14400, 90)] == ["0s", "30s", "5m", "4h", "90s"]


def test_alerts_of_one_group_wait_group_wait_and_go_out_together() -> None:
    tick = Dispatcher()
    assert tick([alert("textcls")], T0) == []  # the group waits 30 s for company
    assert tick([alert("textcls"), alert("mlp")], T0 + timedelta(seconds=20)) == []
    assert tick([alert("textcls"), alert("mlp")], T0 + timedelta(seconds=30)) == [("firing", ["mlp", "textcls"], [])]
    (group,) = tick.groups.values()
    assert group.labels == {"alertname": "high_error_rate"} and group.last_notified_at == T0 + timedelta(seconds=30)


def test_a_group_is_firing_while_any_alert_fires_and_resolved_only_when_all_stopped() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0)))
    both = [alert("textcls"), alert("mlp")]
    assert tick(both, T0) == [("firing", ["mlp", "textcls"], [])]
    one_ended = [alert("textcls"), alert("mlp", AlertState.RESOLVED)]
    assert tick(one_ended, T0 + timedelta(minutes=1)) == []  # group_interval not yet over
    assert tick(one_ended, T0 + timedelta(minutes=5)) == [("firing", ["textcls"], ["mlp"])]
    assert tick(one_ended, T0 + timedelta(minutes=10)) == []  # mlp's end was told once
    all_ended = [alert("textcls", AlertState.RESOLVED), alert("mlp", AlertState.RESOLVED)]
    assert tick(all_ended, T0 + timedelta(minutes=15)) == [("resolved", [], ["textcls"])]
    assert tick.groups == {}  # nothing left to tell: the group is gone


def test_a_muted_alert_is_never_told_firing_nor_resolved() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0)))
    silenced = alert("textcls")
    assert tick([silenced], T0, muted={silenced.fingerprint: "silenced"}) == []
    ended = replace(silenced, state=AlertState.RESOLVED)
    assert tick([ended], T0 + timedelta(minutes=10)) == []
    assert tick.groups == {}


def test_an_alert_that_fires_and_resolves_within_group_wait_is_never_sent() -> None:
    tick = Dispatcher()
    assert tick([alert("textcls")], T0) == []
    assert tick([alert("textcls", AlertState.RESOLVED)], T0 + timedelta(seconds=40)) == []
    assert tick.groups == {}


def test_repeat_interval_repeats_unacknowledged_groups_and_a_new_severity_is_news() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0), repeat_interval=timedelta(hours=1)))
    assert tick([alert("textcls")], T0) == [("firing", ["textcls"], [])]
    assert tick([alert("textcls")], T0 + timedelta(minutes=55)) == []
    # Alertmanager's log is written just after the send, so the tick exactly an hour later is not yet past it.
    assert tick([alert("textcls")], T0 + timedelta(minutes=60)) == []
    assert tick([alert("textcls")], T0 + timedelta(minutes=65)) == [("firing", ["textcls"], [])]
    acked = alert("textcls", acknowledged_by="alice")
    assert tick([acked], T0 + timedelta(hours=3)) == []
    escalated = replace(acked, severity=Severity.P0)
    assert tick([escalated], T0 + timedelta(hours=3, minutes=5)) == [("firing", ["textcls"], [])]


def test_routes_pick_by_severity_and_matchers_and_a_removed_receiver_drops_its_groups() -> None:
    route = Route("mlp_only", ("P1",), (Matcher("model", "mlp"),), group_wait=timedelta(0))
    updated, flushes = dispatch([route], [alert("textcls"), alert("mlp")], {}, {}, T0)
    assert [[a.labels["model"] for a in f.firing] for f in flushes] == [["mlp"]]
    groups = {ident: g for ident, g in updated.items() if g is not None}
    updated, flushes = dispatch([], [alert("mlp")], {}, groups, T0 + timedelta(hours=1))
    assert flushes == [] and set(updated.values()) == {None}


def test_a_group_exists_from_its_first_firing_while_muted_and_keeps_its_ticks() -> None:
    tick = Dispatcher()  # group_wait 30 s, group_interval 5 min
    muted = alert("textcls")
    assert tick([muted], T0, muted={muted.fingerprint: "inhibited"}) == []
    (group,) = tick.groups.values()
    assert group.next_flush_at == T0 + timedelta(seconds=30) and group.held == {muted.fingerprint}
    assert tick([muted], T0 + timedelta(seconds=31), muted={muted.fingerprint: "inhibited"}) == []
    # Released between ticks: told at the group's next tick (30 s + 5 min), not after a new group_wait.
    assert tick([muted], T0 + timedelta(minutes=1)) == []
    assert tick([muted], T0 + timedelta(minutes=5, seconds=29)) == []
    assert tick([muted], T0 + timedelta(minutes=5, seconds=40)) == [("firing", ["textcls"], [])]
    # An evaluation running late does not shift the ticks: the next is still 30 s + 10 min.
    assert tick.groups[next(iter(tick.groups))].next_flush_at == T0 + timedelta(minutes=10, seconds=30)


def test_an_end_under_a_silence_is_never_told_and_the_log_remembers_the_firing() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0)))
    firing = alert("textcls")
    assert tick([firing], T0) == [("firing", ["textcls"], [])]
    ended = replace(firing, state=AlertState.RESOLVED)
    assert tick([ended], T0 + timedelta(minutes=5), muted={firing.fingerprint: "silenced"}) == []
    (group,) = tick.groups.values()
    assert group.held == frozenset() and group.notified == {firing.fingerprint: "P1"}  # dormant, log kept
    # Firing again later: Alertmanager's log still lists it firing, so only a repeat would tell it.
    assert tick([firing], T0 + timedelta(minutes=20)) == []
    assert tick([firing], T0 + timedelta(minutes=21)) == []


def test_a_message_lists_firing_and_resolved_alerts_in_alertmanagers_label_order() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0)))
    a, b, c = alert("b"), alert("a"), alert("c")
    assert tick([a, b, c], T0) == [("firing", ["a", "b", "c"], [])]
    # b fires and ends within one interval: Alertmanager lists it resolved with the others all the same.
    ended = replace(a, state=AlertState.RESOLVED)
    (flush,) = dispatch([ROUTE], [ended, b, c], {}, tick.groups, T0 + timedelta(minutes=5))[1]
    assert [(x.labels["model"], status) for x, status in flush.alerts] == [
        ("a", "firing"),
        ("b", "resolved"),
        ("c", "firing"),
    ]
    job = replace(c, labels={**c.labels, "job": "z"})
    assert [x.labels["model"] for x in alertmanager_order([a, job, b])] == ["c", "a", "b"]  # `job` first


def test_a_dormant_group_is_forgotten_when_alertmanagers_log_would_be() -> None:
    tick = Dispatcher(replace(ROUTE, group_wait=timedelta(0)))
    firing = alert("textcls")
    assert tick([firing], T0) == [("firing", ["textcls"], [])]
    muted_end = replace(firing, state=AlertState.RESOLVED)
    assert tick([muted_end], T0 + timedelta(minutes=5), muted={firing.fingerprint: "silenced"}) == []
    assert len(tick.groups) == 1  # dormant, for its log entry
    assert tick([muted_end], T0 + timedelta(hours=119)) == [] and len(tick.groups) == 1
    assert tick([muted_end], T0 + timedelta(hours=120)) == [] and tick.groups == {}
