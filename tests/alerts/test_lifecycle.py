"""The alert lifecycle: pending, firing after `for`, resolve, silence, inhibit (what is sent when: test_dispatch)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from alerts.lifecycle import Matcher, Silence, Tracked, decide, evaluate, fingerprint
from alerts.rules import Condition, Rule
from alerts.states import AlertState, Severity

T0 = datetime(2026, 11, 30, 12, tzinfo=UTC)


def rule(name: str = "high_error_rate", severity: Severity = Severity.P1, for_s: int = 120) -> Rule:
    condition = Condition("error_rate", "avg", timedelta(minutes=5), ">", 0.05, ("model",))
    return Rule(name, severity, "why", condition, timedelta(seconds=for_s), "{model} errors {value:.0%}")


def key(model: str) -> tuple[tuple[str, str], ...]:
    return (("model", model),)


def run(r: Rule, value: float | None, state: dict[str, Tracked], at: datetime, silences=()) -> tuple[dict, object]:
    observed = {} if value is None else {key("textcls"): value}
    alerts = evaluate(r, observed, state, at)
    outcome = decide(alerts, state, list(silences), at)
    return outcome.tracked, outcome


def test_pending_then_firing_after_for_then_resolved_each_change_recorded_once() -> None:
    r = rule()
    state, out = run(r, 0.2, {}, T0)
    (alert,) = state.values()
    assert alert.state is AlertState.PENDING and [a.state for a in out.changed] == [AlertState.PENDING]
    state, out = run(r, 0.2, state, T0 + timedelta(seconds=119))
    assert next(iter(state.values())).state is AlertState.PENDING and out.changed == []
    state, out = run(r, 0.3, state, T0 + timedelta(seconds=121))
    assert [a.state for a in out.changed] == [AlertState.FIRING] and out.muted == {}
    assert next(iter(state.values())).value == 0.3
    state, out = run(r, 0.3, state, T0 + timedelta(minutes=10))
    assert out.changed == []
    state, out = run(r, 0.01, state, T0 + timedelta(minutes=64))
    assert [a.state for a in out.changed] == [AlertState.RESOLVED]


def test_a_blip_shorter_than_for_never_fires() -> None:
    r = rule()
    state, _ = run(r, 0.2, {}, T0)
    state, out = run(r, 0.0, state, T0 + timedelta(seconds=60))
    assert next(iter(state.values())).state is AlertState.INACTIVE
    assert AlertState.FIRING not in {a.state for a in out.changed}


def test_silences_mute_notifications_but_not_state() -> None:
    r = rule(for_s=0)
    silence = Silence((Matcher("model", "text.*", regex=True),), T0, T0 + timedelta(hours=1))
    state, out = run(r, 0.2, {}, T0, [silence])
    (fp,) = state
    assert state[fp].state is AlertState.FIRING and out.muted == {fp: "silenced"}
    state, out = run(r, 0.2, state, T0 + timedelta(hours=2), [silence])  # the silence has ended
    assert out.muted == {}


def test_a_firing_p0_on_a_model_inhibits_its_p1s() -> None:
    p0, p1 = rule("engine_down", Severity.P0, 0), rule("slow", Severity.P1, 0)
    alerts = evaluate(p0, {key("textcls"): 1.0}, {}, T0) + evaluate(p1, {key("textcls"): 1.0, key("mlp"): 1.0}, {}, T0)
    out = decide(alerts, {}, [], T0)
    muted = {(out.tracked[fp].rule, out.tracked[fp].labels["model"]): why for fp, why in out.muted.items()}
    assert muted == {("slow", "textcls"): "inhibited by a firing P0 on the same model"}


def test_fingerprints_are_stable_and_distinguish_label_sets() -> None:
    assert fingerprint("r", {"model": "a", "x": "1"}) == fingerprint("r", {"x": "1", "model": "a"})
    assert fingerprint("r", {"model": "a"}) != fingerprint("r", {"model": "b"})
    r = rule(for_s=0)
    state, _ = run(r, 0.2, {}, T0)
    state, out = run(r, None, state, T0 + timedelta(minutes=1))  # the series vanished: it resolves
    assert [a.state for a in out.changed] == [AlertState.RESOLVED]
