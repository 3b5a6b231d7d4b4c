"""The alerting service outside any request: what a CLI or a job would call, over a real migrated database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from controlplane.alerting import readmodel, service
from controlplane.alerting.secretbox import Keyring
from controlplane.auth import Actor, Role
from controlplane.auth.audit import audit_as
from controlplane.errors import ApiError, Conflict, NotFound
from controlplane.models import AlertRecord, AuditEvent, Receiver, SilenceRecord

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
OPS = Actor(name="ops", role=Role.OPERATOR, kind="cli")


def _alert(sessions, state: str = "firing") -> None:
    with sessions() as s, s.begin():
        s.add(AlertRecord(fingerprint="f1", rule="high_error_rate", severity="P0", labels={"model": "mlp"},
                          state=state, value=0.2, summary="mlp errors", firing_since=T0, updated_at=T0))  # fmt: skip


def test_acknowledging_writes_the_alert_its_timeline_and_the_audit_event_and_leaves_the_commit(sessions) -> None:
    _alert(sessions)
    with sessions() as s:
        row = service.acknowledge(s, "f1", "ops", audit_as(OPS), T0)
        assert row.acknowledged_by == "ops"
        with sessions() as other:  # nothing is committed behind the caller
            assert other.get(AlertRecord, "f1").acknowledged_by is None
        s.commit()
    with sessions() as s:
        assert readmodel.alert_json(s.get(AlertRecord, "f1"))["acknowledged_at"] == T0.isoformat()
        assert [e["kind"] for e in readmodel.alert_timeline(s, "f1")] == ["acknowledged"]
        event = s.scalars(select(AuditEvent).where(AuditEvent.action == "alert.ack")).one()
        assert (event.actor, event.actor_kind, event.target, event.address) == ("ops", "cli", "f1", None)


def test_only_a_firing_alert_that_exists_can_be_acknowledged(sessions) -> None:
    _alert(sessions, state="resolved")
    with sessions() as s:
        with pytest.raises(Conflict, match="this one is resolved"):
            service.acknowledge(s, "f1", "ops", audit_as(OPS), T0)
        with pytest.raises(NotFound):
            service.acknowledge(s, "nope", "ops", audit_as(OPS), T0)


def test_a_silence_lasts_at_most_thirty_days_and_its_matchers_are_checked(sessions) -> None:
    matchers = service.matchers_from([{"label": "model", "value": "text.*", "regex": True}])
    assert matchers == [{"label": "model", "value": "text.*", "regex": True}]
    for bad, message in [([], "non-empty list"), ([{"label": "a b", "value": "x"}], "not a label name"),
                         ([{"label": "m", "value": "(", "regex": True}], "does not compile")]:  # fmt: skip
        with pytest.raises(ApiError, match=message):
            service.matchers_from(bad)
    with sessions() as s:
        for ends in (T0, T0 + timedelta(days=30, seconds=1)):
            with pytest.raises(ApiError, match="within 30 days"):
                service.create_silence(s, matchers, T0, ends, "window", "ops", audit_as(OPS), T0)
        row = service.create_silence(s, matchers, T0, T0 + timedelta(hours=2), "window", "ops", audit_as(OPS), T0)
        s.commit()
        service.expire_silence(s, row.id, "ops", audit_as(OPS), T0 + timedelta(hours=1))
        s.commit()
    with sessions() as s:
        (shown,) = [readmodel.silence_json(r) for r in readmodel.list_silences(s)]
        assert shown["expired_by"] == "ops" and shown["active"] is False
        assert s.get(SilenceRecord, row.id).ends_at == T0 + timedelta(hours=1)
        actions = [e.action for e in s.scalars(select(AuditEvent).order_by(AuditEvent.id))]
        assert actions == ["silence.create", "silence.expire"]


def test_a_receiver_needs_a_config_its_notifier_accepts_and_its_audit_event_never_holds_the_config(
    sessions, tmp_path
) -> None:
    config = {"url": "https://chat.example/hook?token=s3cr3t", "allow_http": False}
    keys = Keyring(tmp_path / "secret.key")
    keys.ensure()
    with sessions() as s:
        with pytest.raises(ApiError, match="receiver config"):
            service.put_receiver(s, "chat", "pager", config, ["P0"], [], True, audit_as(OPS), T0, keys=keys)
        with pytest.raises(ApiError, match="some of P0, P1, P2"):
            service.put_receiver(s, "chat", "webhook", config, ["P9"], [], True, audit_as(OPS), T0, keys=keys)
        service.put_receiver(s, "chat", "webhook", config, ["P0"], [], True, audit_as(OPS), T0, keys=keys)
        s.commit()
        assert [r.name for r in readmodel.list_receivers(s)] == ["chat"]
        assert "s3cr3t" not in str(s.get(Receiver, "chat").config)  # stored encrypted
        assert readmodel.receiver_json(s.get(Receiver, "chat"), keys)["url"] == "https://chat.example/***"
        assert "s3cr3t" not in str(s.scalars(select(AuditEvent.detail)).all())
        service.delete_receiver(s, "chat", audit_as(OPS))
        s.commit()
        assert readmodel.list_receivers(s) == []
        with pytest.raises(NotFound):
            service.delete_receiver(s, "chat", audit_as(OPS))
