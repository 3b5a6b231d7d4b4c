"""Drift: is a version still answering, and still being asked, like it was in its reference window?

For every version the history holds its predicted labels per output (the counts the canary judge
compares) and summaries of sampled numeric inputs per feature (`serving.inputstats`: a histogram
over fixed bins every window shares). A window's drift score for one output or feature is the
Jensen-Shannon divergence (bits, 0 = the same distribution, 1 = no overlap) between the window's
counts and the reference's: `rollout.judge.js_divergence`, the statistic the judge uses, with its
chi-square test of homogeneity reported beside it.

The reference is the window an operator pinned (`drift_references`, via the API or the console,
audited), or by default the version's first day serving: from its first history row to a day
later. While a version is in its first day the window and its reference overlap, so the score is
low by construction; pin a reference to judge sooner.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, select
from sqlalchemy.orm import Session, sessionmaker

from alerts.rules import Insufficient, duration_text
from controlplane import metrics
from controlplane.auth.audit import Audit
from controlplane.clock import utcnow
from controlplane.errors import ApiError, NotFound
from controlplane.history.query import SlotAggregate
from controlplane.models import DriftReference, ModelVersion, SlotSample
from controlplane.rollout.judge import chi2_homogeneity, js_divergence
from serving import inputstats

DEFAULT_REFERENCE = timedelta(days=1)
PREDICTIONS, INPUT = "predictions", "input"
# Fewest samples in the window (and in the reference) before a score is computed: the divergence of
# two samples of the same distribution shrinks like (bins - 1) / samples, so it needs enough of them.
MIN_SAMPLES = 50
# A score worth a look: the shipped rule's threshold (alerts/rules/drift.yaml); the model page marks scores above it.
NOTABLE = 0.1
# Each point of a drift series scores at least this much of the history before it.
SERIES_WINDOW = timedelta(minutes=15)
# Rows `aggregate` holds in memory at once, however many the window has.
STREAM_ROWS = 100
# Kept sums (an open reference's, a recurring window's minutes): rows are written at their interval's end, so
# those older than SETTLED no longer change; what was kept is read again after KEPT_FOR, so a late row counts.
SETTLED = timedelta(minutes=10)
KEPT_FOR = timedelta(hours=1)


@dataclass(frozen=True)
class Reference:
    """A version's reference window and where it came from ('pinned' by someone, or 'first_day')."""

    start: datetime
    end: datetime
    source: str
    pinned_by: str | None = None
    pinned_at: datetime | None = None

    def as_dict(self) -> dict:
        return {
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "source": self.source,
            "pinned_by": self.pinned_by,
            "pinned_at": self.pinned_at.isoformat() if self.pinned_at else None,
        }


@dataclass(frozen=True)
class Score:
    """The drift of one output's predictions or one input feature over a window against the reference."""

    kind: str  # PREDICTIONS or INPUT
    name: str  # the output, or the feature (serving.inputstats)
    score: float | None  # Jensen-Shannon divergence in bits; None with too few samples
    samples: int
    reference_samples: int
    p_value: float | None = None  # chi-square test of homogeneity, as the canary judge reports
    mean: float | None = None  # an input feature's mean and standard deviation, window and reference
    std: float | None = None
    reference_mean: float | None = None
    reference_std: float | None = None

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def reference_of(
    session: Session, model: str, version: str, kept: WindowSums | None = None, now: datetime | None = None
) -> Reference | None:
    """Return the version's reference: the pinned window, else its first day serving; None if it never served.

    With `kept` (the leader's recurring looks, ending at `now`), when the version first served is kept there.
    """
    pinned = session.get(DriftReference, (model, version))
    if pinned is not None:
        return Reference(pinned.start, pinned.end, "pinned", pinned.pinned_by, pinned.pinned_at)
    if kept is not None and now is not None:
        first = kept.first_served(session, model, version, now)
    else:
        first = _first_served(session, model, version)
    if first is None:
        return None
    # NOTE: a row's ts is the end of its interval (a rollup's: of its bucket), so the day starts where the
    # first row's interval began; once rows are rolled up the day's edges are as coarse as the rows kept.
    start = first[0] - timedelta(seconds=first[1] or 1)
    return Reference(start, start + DEFAULT_REFERENCE, "first_day")


def _first_served(session: Session, model: str, version: str) -> tuple[datetime, float | None] | None:
    """The end and length of the version's first row that served a request, or None."""
    first = session.execute(
        select(SlotSample.ts, SlotSample.interval_s)
        .where(SlotSample.model == model, SlotSample.version == version, SlotSample.successes > 0)
        .order_by(SlotSample.ts)
        .limit(1)
    ).first()
    return None if first is None else (first[0], first[1])


# What drift adds up of a row: whether the version served (successes), what it answered, what it was asked.
_DRIFT_COLUMNS = (SlotSample.successes, SlotSample.label_counts, SlotSample.input_summaries)


def _rows(session: Session, model: str, version: str, start: datetime, end: datetime, *columns: Any):
    # NOTE: streamed, STREAM_ROWS at a time, and only the columns added up (issue 29, item 8): the leader runs
    # this every minute (drift-score) and every alert evaluation (the drift rule), and reading whole ORM rows,
    # all at once, held ~5 KB per row: 80 MB at 16,000 rows, a peak that grew with the history and left the
    # lease holder's RSS that much higher (glibc keeps freed heap). Decoding the latency and batch JSON that
    # drift never reads was most of each evaluation's cost.
    return session.execute(
        select(*columns, *_DRIFT_COLUMNS)
        .where(SlotSample.model == model, SlotSample.version == version, SlotSample.ts > start, SlotSample.ts <= end)
        .execution_options(yield_per=STREAM_ROWS)
    )


def _add(agg: SlotAggregate, row: Row[Any]) -> None:
    agg.successes += row.successes
    agg.add_answers(row)


def aggregate(session: Session, model: str, version: str, start: datetime, end: datetime) -> SlotAggregate:
    """Add up what drift compares of one version's rows (every slot, process and resolution) ending in (start,
    end]: its successes, predicted labels and sampled inputs; the aggregate's other figures stay zero."""
    agg = SlotAggregate()
    for row in _rows(session, model, version, start, end):
        _add(agg, row)
    return agg


def _mean_std(summary: dict | None) -> tuple[float | None, float | None]:
    found = inputstats.moments(summary) if summary else None
    return (None, None) if found is None else (found[0], math.sqrt(found[1]))


def compare(window: SlotAggregate, reference: SlotAggregate, min_samples: int = MIN_SAMPLES) -> list[Score]:
    """Score every output and input feature the window or the reference saw."""
    scores = []
    for output in sorted(set(window.labels) | set(reference.labels)):
        now, then = window.labels.get(output, {}), reference.labels.get(output, {})
        n, m = sum(now.values()), sum(then.values())
        enough = n >= min_samples and m >= min_samples
        scores.append(
            Score(
                PREDICTIONS,
                output,
                js_divergence(now, then) if enough else None,
                n,
                m,
                chi2_homogeneity(now, then)[2] if enough else None,
            )
        )
    for feature in sorted(set(window.inputs) | set(reference.inputs)):
        now_s, then_s = window.inputs.get(feature), reference.inputs.get(feature)
        now, then = (now_s or {}).get("bins", {}), (then_s or {}).get("bins", {})
        n, m = sum(now.values()), sum(then.values())
        enough = n >= min_samples and m >= min_samples
        mean, std = _mean_std(now_s)
        ref_mean, ref_std = _mean_std(then_s)
        scores.append(
            Score(
                INPUT,
                feature,
                js_divergence(now, then) if enough else None,
                n,
                m,
                chi2_homogeneity(now, then)[2] if enough else None,
                mean,
                std,
                ref_mean,
                ref_std,
            )
        )
    return scores


class ReferenceCache:
    """Aggregates of reference windows: one that has ended is read from the database once, and one still open
    (a version in its first day) is read in full only once an hour, then only at its recent end.

    NOTE: keyed by the window itself, so a newly pinned window is a new entry. Retention rolling rows up does
    not change their sums, so a kept aggregate stays right. An open reference's rows up to `SETTLED` ago are
    kept (`_Settled`), cut on a whole minute, which rollups never move a row across: before, every alert
    evaluation (15 s) and drift score (60 s) re-read the version's whole day so far, 120 ms an hour in.
    """

    def __init__(self, limit: int = 256) -> None:
        self._entries: dict[tuple[str, str, datetime, datetime], SlotAggregate] = {}
        self._open: dict[tuple[str, str, datetime, datetime], _Settled] = {}
        self._limit = limit

    def get(self, session: Session, model: str, version: str, reference: Reference, now: datetime) -> SlotAggregate:
        key = (model, version, reference.start, reference.end)
        found = self._entries.get(key)
        if found is not None:
            return found
        if reference.end <= now:
            found = aggregate(session, model, version, reference.start, reference.end)
            self._open.pop(key, None)
            _bounded_put(self._entries, key, found, self._limit)
            return found
        settled = _minute_floor(max(reference.start, now - SETTLED))
        kept = self._open.get(key)
        if kept is None or settled < kept.upto or now - kept.read_at >= KEPT_FOR:
            kept = _Settled(reference.start, SlotAggregate(), now)
            _bounded_put(self._open, key, kept, self._limit)
        if settled > kept.upto:
            kept.aggregate.merge(aggregate(session, model, version, kept.upto, settled))
            kept.upto = settled
        found = SlotAggregate()
        found.merge(kept.aggregate)
        found.merge(aggregate(session, model, version, kept.upto, now))
        return found


@dataclass
class _Settled:
    """An open reference's rows in (its start, `upto`], added up; read from the database since `read_at`."""

    upto: datetime
    aggregate: SlotAggregate
    read_at: datetime


class WindowSums:
    """The drift sums of a recent window (the drift rule's and the drift-score job's hour, every 15 and 60 s),
    kept per whole minute once it has settled: each look reads only the window's ragged first minute and its
    last `SETTLED`, and adds up the kept minutes between.

    NOTE: a minute is cut on whole minutes, which rollups never move a row across, and kept at most `KEPT_FOR`, so a
    row that came later than `SETTLED` is counted within the hour. Windows longer than `LONGEST` are read whole.
    """

    LONGEST = timedelta(hours=6)

    def __init__(self) -> None:
        # (model, version) -> minute end -> (the sums of the rows ending in that minute, when they were read)
        self._minutes: dict[tuple[str, str], dict[datetime, tuple[SlotAggregate, datetime]]] = {}
        # (model, version) -> (when read, the first served row's end and length)
        self._first: dict[tuple[str, str], tuple[datetime, tuple[datetime, float | None]]] = {}

    def first_served(
        self, session: Session, model: str, version: str, now: datetime
    ) -> tuple[datetime, float | None] | None:
        """`_first_served`, kept for `KEPT_FOR`: it places the version's first-day reference at every look.

        NOTE: a version's first row only moves later (retention, rollups), so a kept one is read again hourly, as
        kept sums are. Never serving is not kept: the first row counts at once.
        """
        kept = self._first.get((model, version))
        if kept is not None and timedelta(0) <= now - kept[0] < KEPT_FOR:
            return kept[1]
        first = _first_served(session, model, version)
        if first is not None:
            self._first[(model, version)] = (now, first)
        return first

    def get(self, session: Session, model: str, version: str, start: datetime, end: datetime) -> SlotAggregate:
        first, settled = _minute_ceil(start), _minute_floor(end - SETTLED)
        if settled <= first or end - start > self.LONGEST:
            return aggregate(session, model, version, start, end)
        kept = self._minutes.setdefault((model, version), {})
        for minute in [m for m, (_, read_at) in kept.items() if m <= first or end - read_at >= KEPT_FOR]:
            del kept[minute]
        wanted = [first + timedelta(minutes=i + 1) for i in range(int((settled - first).total_seconds()) // 60)]
        missing = [m for m in wanted if m not in kept]
        if missing:
            sums = {m: SlotAggregate() for m in missing}
            for row in _rows(session, model, version, missing[0] - timedelta(minutes=1), missing[-1], SlotSample.ts):
                if (agg := sums.get(_minute_ceil(row.ts))) is not None:  # NOTE: kept minutes between are not read twice
                    _add(agg, row)
            kept.update((m, (agg, end)) for m, agg in sums.items())
        found = aggregate(session, model, version, start, first)
        for minute in wanted:
            found.merge(kept[minute][0])
        found.merge(aggregate(session, model, version, settled, end))
        return found

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop what is kept of versions no longer seen."""
        for key in set(self._minutes) - keep:
            del self._minutes[key]
        for key in set(self._first) - keep:
            del self._first[key]


def _minute_floor(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _minute_ceil(ts: datetime) -> datetime:
    floor = _minute_floor(ts)
    return floor if floor == ts else floor + timedelta(minutes=1)


def _bounded_put(entries: dict, key: Hashable, value: object, limit: int) -> None:
    if key not in entries and len(entries) >= limit:
        entries.pop(next(iter(entries)))  # the oldest
    entries[key] = value


_KEPT: dict[str, tuple[ReferenceCache, WindowSums]] = {}  # by database URL


def _kept(session: Session) -> tuple[ReferenceCache, WindowSums]:
    """What the looks at `session`'s database keep between them.

    NOTE: per database: the kept sums are keyed by model and version, which two databases share (tests open
    many in one process, each with a version 1 of the same model).
    """
    url = str(session.get_bind().url)
    kept = _KEPT.get(url)
    if kept is None:
        kept = (ReferenceCache(), WindowSums())
        _bounded_put(_KEPT, url, kept, 16)
    return kept


def versions_seen(session: Session, start: datetime, end: datetime, model: str | None = None) -> list[tuple[str, str]]:
    """Return the (model, version) pairs with history rows in (start, end]."""
    query = select(SlotSample.model, SlotSample.version).where(SlotSample.ts > start, SlotSample.ts <= end)
    if model is not None:
        query = query.where(SlotSample.model == model)
    return sorted({(m, v) for m, v in session.execute(query.distinct())})


def drift(
    session: Session,
    model: str,
    version: str,
    start: datetime,
    end: datetime,
    cache: ReferenceCache | None = None,
    min_samples: int = MIN_SAMPLES,
    windows: WindowSums | None = None,
) -> tuple[Reference | None, list[Score]]:
    """Return a version's reference and its scores over the window (start, end]; `windows` keeps the sums of the
    window's settled minutes for the next look (the leader's recurring window, ending now)."""
    reference = reference_of(session, model, version, windows, end)
    if reference is None:
        return None, []
    window = (
        aggregate(session, model, version, start, end)
        if windows is None
        else windows.get(session, model, version, start, end)
    )
    then = (cache or ReferenceCache()).get(session, model, version, reference, end)
    return reference, compare(window, then, min_samples)


def drift_series(
    session: Session, model: str, version: str, start: datetime, end: datetime, step_s: int
) -> tuple[Reference | None, list[dict]]:
    """Return one series of scores per (kind, name): at the end of every step, the score of the trailing
    `max(step, SERIES_WINDOW)` against the reference (a 30-second step alone holds too few samples to judge)."""
    reference = reference_of(session, model, version)
    if reference is None:
        return None, []
    then = _kept(session)[0].get(session, model, version, reference, end)
    steps = max(1, math.ceil((end - start).total_seconds() / step_s))
    span = max(1, math.ceil(SERIES_WINDOW.total_seconds() / step_s))  # steps each point looks back over
    buckets: dict[int, list[SlotSample]] = defaultdict(list)
    rows = session.scalars(
        select(SlotSample).where(
            SlotSample.model == model,
            SlotSample.version == version,
            SlotSample.ts > start - timedelta(seconds=step_s * (span - 1)),
            SlotSample.ts <= end,
        )
    )
    for row in rows:
        buckets[math.floor((row.ts - start).total_seconds() / step_s)].append(row)
    times = [(start + timedelta(seconds=step_s * (i + 1))).isoformat() for i in range(steps)]
    points: dict[tuple[str, str], dict[int, float | None]] = defaultdict(dict)
    for i in range(steps):
        if i not in buckets:
            continue  # nothing answered in this step: a gap, not a stale score
        window = SlotAggregate()
        for j in range(i - span + 1, i + 1):
            for row in buckets.get(j, ()):
                window.add(row)
        for score in compare(window, then):
            points[(score.kind, score.name)][i] = score.score
    return reference, [
        {
            "labels": {"model": model, "version": version, "kind": kind, "name": name},
            "points": [[t, values.get(i)] for i, t in enumerate(times)],
        }
        for (kind, name), values in sorted(points.items())
    ]


def describe(session: Session, model: str, start: datetime, end: datetime, version: str | None = None) -> dict:
    """Every version of a model seen in (start, end] (or the one asked for), scored against its reference.

    What `GET /api/models/<m>/drift` answers and the model page shows.
    """
    versions = [version] if version else [v for _, v in versions_seen(session, start, end, model)]
    found = []
    for v in versions:
        reference, scored = drift(session, model, v, start, end, _kept(session)[0])
        found.append(
            {
                "version": v,
                "reference": reference.as_dict() if reference else None,
                "scores": [s.as_dict() for s in scored],
            }
        )
    return {
        "model": model,
        "start": start.isoformat(),
        "end": end.isoformat(),
        "min_samples": MIN_SAMPLES,
        "versions": found,
    }


def pin_reference(
    session: Session, model: str, version: str, start: datetime, end: datetime, audit: Audit, actor: str
) -> Reference:
    """Pin (start, end] as a version's drift reference; audited in the caller's transaction."""
    if session.scalar(select(ModelVersion).where(ModelVersion.name == model, ModelVersion.version == version)) is None:
        raise NotFound(f"model '{model}' has no version '{version}'")
    if end <= start:
        raise ApiError("the reference window must end after it starts")
    if end > utcnow() + timedelta(minutes=1):
        raise ApiError("the reference window must have ended: its end is in the future")
    samples = aggregate(session, model, version, start, end)
    if samples.successes == 0:
        raise ApiError(f"version '{version}' of '{model}' answered no request between {start} and {end}")
    row = session.get(DriftReference, (model, version))
    if row is None:
        row = DriftReference(model=model, version=version, start=start, end=end, pinned_by=actor, pinned_at=utcnow())
        session.add(row)
    else:
        row.start, row.end, row.pinned_by, row.pinned_at = start, end, actor, utcnow()
    audit(
        session,
        "drift.pin_reference",
        f"{model}:{version}",
        "ok",
        {"start": start.isoformat(), "end": end.isoformat(), "requests": samples.successes},
    )
    return Reference(start, end, "pinned", actor, row.pinned_at)


def unpin_reference(session: Session, model: str, version: str, audit: Audit) -> bool:
    """Go back to the default reference (the first day); return whether a pinned one was removed."""
    row = session.get(DriftReference, (model, version))
    if row is not None:
        session.delete(row)
    audit(session, "drift.unpin_reference", f"{model}:{version}", "ok", {"was_pinned": row is not None})
    return row is not None


def feature_label(score: Score) -> str:
    """Name what a score is about, as alerts and the gauge label it: 'predictions:<output>', 'input:<feature>'."""
    return f"{score.kind}:{score.name}"


def drift_observation(
    session: Session, window: timedelta, by: tuple[str, ...], min_samples: int, now: datetime
) -> dict[tuple[tuple[str, str], ...], float | Insufficient]:
    """What a drift rule sees: per label set, the largest score over the window (Insufficient with too few samples)."""
    needed = min_samples or MIN_SAMPLES
    found: dict[tuple[tuple[str, str], ...], float | Insufficient] = {}
    for model, version, scored in _recurring_looks(session, window, now, needed):
        for score in scored:
            labels = {"model": model, "version": version, "feature": feature_label(score)}
            key = tuple((name, labels.get(name, "")) for name in by)
            if score.score is None:
                if key not in found:
                    found[key] = Insufficient(
                        f"too few samples to judge: {score.samples} in {duration_text(window)} and "
                        f"{score.reference_samples} in the reference, fewer than the {needed} needed on both sides"
                    )
                continue
            earlier = found.get(key)
            if not isinstance(earlier, float) or score.score > earlier:
                found[key] = score.score
    return found


DriftReading = tuple[str, str, str, str, float]  # model, version, kind, name, score: one flightdeck_drift_score


def current_scores(
    sessions: sessionmaker[Session], window: timedelta, now: datetime | None = None
) -> list[DriftReading]:
    """Return every judged score of the versions seen in the window (the leader's `drift-score` job computes them)."""
    now = now or utcnow()
    readings: list[DriftReading] = []
    with sessions() as session:
        for model, version, scored in _recurring_looks(session, window, now, MIN_SAMPLES):
            readings += [(model, version, s.kind, s.name, s.score) for s in scored if s.score is not None]
    return readings


def _recurring_looks(
    session: Session, window: timedelta, now: datetime, min_samples: int
) -> Iterator[tuple[str, str, list[Score]]]:
    """The scores of every version seen in the window ending `now`, looked at with what the last looks kept
    (the drift rule's and the drift-score job's, every 15 and 60 s)."""
    references, windows = _kept(session)
    seen = versions_seen(session, now - window, now)
    windows.forget(set(seen))
    for model, version in seen:
        _, scored = drift(session, model, version, now - window, now, references, min_samples, windows)
        yield model, version, scored


def publish(readings: list[DriftReading]) -> int:
    """Set flightdeck_drift_score in this process for each reading; return how many."""
    for model, version, kind, name, score in readings:
        metrics.DRIFT_SCORE.labels(model, version, kind, name).set(score)
    return len(readings)


def publish_scores(sessions: sessionmaker[Session], window: timedelta, now: datetime | None = None) -> int:
    """Compute and set flightdeck_drift_score for every version seen in the window, in this process."""
    return publish(current_scores(sessions, window, now))
