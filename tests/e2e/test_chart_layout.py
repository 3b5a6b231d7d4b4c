"""Chart layout in a real browser: marker labels that never overprint, a legend that never meets the time axis.

Headless Chromium against the real server. The history is seeded before it starts: six model versions
(eighteen latency lines, a legend of several rows) and rollouts whose starts, step verdicts and endings
land seconds apart, as a fast canary's do. The checks read the drawn SVG's bounding boxes.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.auth import Role
from controlplane.auth import users as user_service
from controlplane.db import make_engine, session_factory
from controlplane.models import Rollout, RolloutMeasurement, SlotSample
from serving.histogram import Histogram
from tests.conftest import copy_home
from tests.e2e.browser import open_console, screenshot_name
from tests.servers import start_server

PASSWORD = "charts-password-1"
MARKERS = 7  # a fast rollout's start, three verdicts and end; an instant one's start and end
VERSIONS = [
    (model, str(v), slot) for model in ("textcls", "mlp") for v, slot in ((1, "blue"), (2, "green"), (3, "blue"))
]
# Every plot's boxes, in page coordinates: marker labels, the x-axis title, the legend and the chart's title.
BOXES_JS = """() => [...document.querySelectorAll('.plot')].filter(p => p.querySelector('.main-svg')).map(p => {
  const box = e => { if (!e) return null; const r = e.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  return {
    id: p.dataset.figure,
    labels: [...p.querySelectorAll('.annotation')].filter(a => a.textContent !== 'no data in this range')
      .map(a => [a.textContent, box(a.querySelector('.annotation-text-g') || a)]),
    xtitle: box(p.querySelector('.g-xtitle')),
    title: box(p.querySelector('.g-gtitle')),
    legend: box(p.querySelector('.legend')),
    legend_rows: new Set([...p.querySelectorAll('.legend .traces')].map(t => t.getBoundingClientRect().top)).size,
  };
})"""


def history_rows(now: datetime) -> list[SlotSample]:
    """Ten minutes of 10 s samples for every version, with distinct latencies."""
    rows = []
    for i, (model, version, slot) in enumerate(VERSIONS):
        histogram = Histogram()
        for _ in range(20):
            histogram.record(0.002 * (i + 1))
        for step in range(60):
            rows.append(
                SlotSample(
                    ts=now - timedelta(seconds=10 * step), resolution_s=0, interval_s=10.0, process="seed",
                    model=model, version=version, slot=slot, successes=20, latency_hist=histogram.to_dict(),
                    latency_sum_s=0.04 * (i + 1), batches=20, batch_sizes={"1": 20},
                )
            )  # fmt: skip
    return rows


def rollout(model: str, versions: tuple[str, str], started: datetime, finished: datetime) -> Rollout:
    """A finished canary rollout (history only: the controller never looks at a finished one)."""
    return Rollout(
        model=model, from_version=versions[0], to_version=versions[1], candidate_slot="green", strategy="canary",
        steps=[10, 50, 100], step_index=2, step_started_at=started, pause_s=1.0, shadow=False, policy={},
        state="succeeded", reason="", created_by="seed", created_at=started, updated_at=finished,
        finished_at=finished,
    )  # fmt: skip


@pytest.fixture(scope="module")
def charts_server(tmp_path_factory: pytest.TempPathFactory, template_home: Path) -> Iterator:
    home = copy_home(template_home, tmp_path_factory.mktemp("charts") / "home")
    now = datetime.now(UTC)
    engine = make_engine(f"sqlite:///{home / 'flightdeck.db'}")
    with session_factory(engine)() as session:
        user_service.create_user(session, "ada", PASSWORD, Role.ADMIN, now)
        session.add_all(history_rows(now))
        # Five markers within 40 s (start, three verdicts, the end), and two more at one instant before them;
        # all within the last 15 minutes, the overview's range, with minutes to spare for a slow run.
        fast = rollout("textcls", ("1", "2"), now - timedelta(minutes=4), now - timedelta(minutes=4, seconds=-40))
        early = rollout("mlp", ("1", "2"), now - timedelta(minutes=8), now - timedelta(minutes=8))
        session.add_all([fast, early])
        session.flush()
        for step in range(3):
            ts = fast.created_at + timedelta(seconds=10 * (step + 1))
            session.add(
                RolloutMeasurement(rollout_id=fast.id, step_index=step, ts=ts, verdict="pass", reasons=[], figures={})
            )
        session.commit()
    engine.dispose()
    server = start_server(home, {"FLIGHTDECK_LOAD_MODELS": "mlp", "FLIGHTDECK_WARMUP_MAX_SEQUENCE": "16"})
    yield server
    assert server.stop() == 0


def intersect(a: list[float], b: list[float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def drawn_boxes(browser, server, request: pytest.FixtureRequest, path: str, width: int) -> list[dict]:
    context, page, log = open_console(browser, server.url, "ada", PASSWORD, width, 900)
    try:
        page.goto(path)
        page.wait_for_function(
            "() => [...document.querySelectorAll('.plot')].every(p => p.querySelector('.main-svg'))", timeout=15_000
        )
        page.wait_for_function(
            "() => [...document.querySelectorAll('.chart-status, #dashboard-status')]"
            ".every(s => s.textContent.startsWith('Updated at'))",
            timeout=15_000,
        )
        page.screenshot(
            path=screenshot_name(request, f"{width}-{path.strip('/').split('?')[0] or 'overview'}"), full_page=True
        )
        boxes = page.evaluate(BOXES_JS)
    finally:
        context.close()
    assert not log.unexpected()
    return boxes


@pytest.mark.parametrize(
    ("path", "width"), [("/dashboards?range=1h", 1280), ("/?", 1280), ("/dashboards?range=1h", 390)]
)
def test_the_time_axis_title_never_meets_the_legend(browser, charts_server, request, path: str, width: int) -> None:
    boxes = drawn_boxes(browser, charts_server, request, path, width)

    latency = next(b for b in boxes if b["id"] == "latency")
    assert latency["legend_rows"] >= 3  # the case that overlapped: a legend of several rows
    for plot in boxes:
        if plot["legend"] and plot["xtitle"]:
            assert not intersect(plot["xtitle"], plot["legend"]), plot
            assert plot["xtitle"][3] <= plot["legend"][1], plot  # the title stays above the legend


@pytest.mark.parametrize("path", ["/dashboards?range=1h", "/?"])
def test_marker_labels_never_overprint(browser, charts_server, request, path: str) -> None:
    boxes = drawn_boxes(browser, charts_server, request, path, 1280)

    for plot in boxes:
        if plot["id"] == "batch":
            continue
        for i, (text, box) in enumerate(plot["labels"]):
            for other, other_box in plot["labels"][i + 1 :]:
                assert not intersect(box, other_box), f"{plot['id']}: {text!r} overprints {other!r}"
            assert not intersect(box, plot["title"]), f"{plot['id']}: {text!r} overprints the chart's title"
        texts = [text for text, _ in plot["labels"]]
        # Every marker is on every range the console shows: a label of its own, or counted in "N events".
        assert sum(int(t.split()[0]) if t.endswith(" events") else 1 for t in texts) == MARKERS, texts
        assert len({box[1] for _, box in plot["labels"]}) > 1, texts  # close labels went to other rows
