"""The rollout API's request and response models (`/api/models/<m>/deploy`, `/api/rollouts`, `/api/engine`).

The response models describe exactly what `rollout.readmodel`, `rollout.deployments`,
`rollout.service` and `rollout.enginewide` return; the view validates its answer against them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from controlplane.contract import Reply, RequestBody, Timestamp
from controlplane.errors import ApiError
from controlplane.rollout.analysis import RETIRED, AnalysisPolicy
from controlplane.rollout.enginewide import BATCHING_LIMITS
from controlplane.rollout.states import DEPLOY_STRATEGIES, RolloutState, Slot, Strategy, Verdict

# What a person may ask a deploy for (canary, bluegreen): Strategy.ROLLBACK is the record of a rollback only.
DeployStrategy = Literal[tuple(s.value for s in DEPLOY_STRATEGIES)]  # type: ignore[valid-type]
Rate = Annotated[float, Field(ge=0, le=1)]


class PolicyBody(RequestBody):
    """Analysis thresholds for a canary's steps; a setting left out keeps its default."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # stored as JSON: finite only

    min_requests: int = Field(AnalysisPolicy.min_requests, ge=0, description="fewer canary requests: inconclusive")
    alpha: float = Field(
        AnalysisPolicy.alpha, gt=0, lt=0.5, description="one-sided p-value under which a difference is evidence"
    )
    max_error_rate: Rate = Field(AnalysisPolicy.max_error_rate, description="ceiling on server errors over requests")
    max_timeout_rate: Rate = AnalysisPolicy.max_timeout_rate
    max_error_rate_increase: Rate = Field(
        AnalysisPolicy.max_error_rate_increase, description="canary minus stable below this never fails"
    )
    max_timeout_rate_increase: Rate = AnalysisPolicy.max_timeout_rate_increase
    slo_p99_ms: float = Field(
        AnalysisPolicy.slo_p99_ms, gt=0, description="the canary's requests over this must stay under 1 %"
    )
    latency_floor_ms: float = Field(
        AnalysisPolicy.latency_floor_ms, ge=0, description="a compute-time shift below this never fails"
    )
    latency_floor_slo_share: Rate = Field(
        AnalysisPolicy.latency_floor_slo_share, description="... nor one below this share of the SLO"
    )
    max_slowdown: float = Field(
        AnalysisPolicy.max_slowdown, ge=1, description="... nor one under this ratio of compute time"
    )
    max_slowdown_unmatched: float = Field(
        AnalysisPolicy.max_slowdown_unmatched,
        ge=1,
        description="... at a step whose traffic shares differ (a cold canary)",
    )
    min_batches: int = Field(
        AnalysisPolicy.min_batches, ge=1, description="canary batches at shared batch sizes for a latency verdict"
    )
    max_label_divergence: Rate = Field(
        AnalysisPolicy.max_label_divergence, description="Jensen-Shannon divergence (bits) of predicted labels"
    )
    min_labels: int = Field(
        AnalysisPolicy.min_labels, ge=1, description="canary predictions before their distribution is judged"
    )
    min_agreement: Rate = Field(AnalysisPolicy.min_agreement, description="shadow: share of outputs that agree")

    @model_validator(mode="before")
    @classmethod
    def _known_settings(cls, data: Any) -> Any:
        # NOTE: the words the API has always used for a misspelt threshold, which name the field.
        if isinstance(data, dict):
            for key, why in RETIRED.items():
                if key in data:
                    raise ValueError(f"'policy': analysis setting '{key}' was retired: {why}")
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(
                    f"'policy': unknown analysis setting(s) {unknown}; allowed: {sorted(cls.model_fields)}"
                )
        return data


class DeployRequest(RequestBody):
    """A version to serve: a first deploy when the model is not deployed, else a rollout to it."""

    version: str = Field(min_length=1, description="a version in the registry")
    strategy: DeployStrategy = Field(
        Strategy.CANARY.value, description="canary: steps with analysis; bluegreen: verify, then all traffic"
    )
    # NOTE: the bounds are documented here and checked by the service, whose refusal names the whole rule
    # ("must rise to 100, each between 1 and 100") and is audited as the rollout's own error.
    steps: list[int] | None = Field(
        None,
        description="a canary's traffic percentages, rising to 100 (default 5, 25, 50, 100)",
        json_schema_extra={"items": {"type": "integer", "minimum": 1, "maximum": 100}},
    )
    pause_s: float | None = Field(
        None, ge=0, description="seconds each step runs before its analysis (default: settings)"
    )
    shadow: bool = Field(False, description="a first step that only mirrors traffic and compares the answers")
    policy: PolicyBody | None = None

    @model_validator(mode="before")
    @classmethod
    def _version_given(cls, data: Any) -> Any:
        # NOTE: the words the API has always used when the one required field is missing or wrong; an
        # ApiError, as a ValueError from a whole-body validator would read "the body must be an object".
        if isinstance(data, dict) and not (isinstance(data.get("version"), str) and data["version"]):
            raise ApiError("'version' must be a non-empty string")
        return data

    def policy_dict(self) -> dict[str, Any] | None:
        """Return the thresholds that were given (the rest keep their defaults), or None."""
        return self.policy.model_dump(exclude_unset=True) if self.policy is not None else None


class BatchingChange(RequestBody):
    """New engine-wide batching limits; null hands a limit back to each process's own setting."""

    # NOTE: bounded: an unbounded integer overflowed the database column (a 500 the fuzz run found).
    max_batch_size: int | None = Field(None, ge=1, le=65_536)
    max_queue_delay_ms: float | None = Field(None, ge=0, le=60_000, allow_inf_nan=False)
    max_queue_size: int | None = Field(None, ge=1, le=1_048_576)

    @model_validator(mode="after")
    def _something_to_change(self) -> BatchingChange:
        if not self.model_fields_set:
            raise ApiError(f"give at least one of {list(BATCHING_LIMITS)}")
        return self

    def changes(self) -> dict[str, int | float | None]:
        """Return the limits that were given, nulls included."""
        return self.model_dump(include=self.model_fields_set)


# --- answers ------------------------------------------------------------------------------------


class MeasurementView(Reply):
    """One step's analysis: its verdict, why, and the figures behind it."""

    step_index: int
    ts: Timestamp
    verdict: Verdict
    reasons: list[str]
    figures: dict[str, int | float | None]
    evidence: list[dict[str, Any]] = Field(
        description="each check: its test, p-value or interval, effect sizes, sample sizes, floors and outcome; "
        "first the window judged"
    )


class RolloutView(Reply):
    """A rollout: which versions, which slot, its steps and where it stands."""

    id: int
    model: str
    from_version: str | None
    to_version: str
    candidate_slot: Slot
    strategy: Strategy
    steps: list[int] = Field(description="traffic percent per step; a shadow step is 0")
    step_index: int
    traffic_percent: int = Field(description="the candidate's share now (0 while loading)")
    pause_s: float
    shadow: bool
    policy: dict[str, int | float] = Field(description="the analysis thresholds (empty for a rollback's record)")
    state: RolloutState
    reason: str
    created_by: str
    created_at: Timestamp
    updated_at: Timestamp
    finished_at: Timestamp | None


class RolloutDetail(RolloutView):
    """A rollout with every step's analysis."""

    measurements: list[MeasurementView]


class FirstDeployView(Reply):
    """A first deploy: the version goes into blue with all traffic, served once loaded and checked."""

    model: str
    version: str
    first_deploy: Literal[True]
    generation: int
    state: Literal["loading"]


class UndeployView(Reply):
    model: str
    undeployed: Literal[True]
    versions: dict[Slot, str] = Field(description="what each slot held")


class RollbackView(Reply):
    model: str
    version: str | None = Field(description="the version traffic returns to")
    rollout: int = Field(description="the rollout stopped, or the rollback's own record")
    reloaded: bool = Field(description="the version is loaded again before traffic returns to it")


class SlotDesired(Reply):
    version: str | None
    weight: int = Field(description="traffic percent")


class SlotReport(Reply):
    """What one process reports for one slot."""

    process: str
    node: str = Field(description="the node the process runs on (FLIGHTDECK_NODE; process names are NODE:PID)")
    slot: Slot
    version: str | None
    state: Literal["loaded", "failed", "empty", "gone"] = Field(
        description="what the process reports; gone when it has sent no heartbeat for three FLIGHTDECK_HEARTBEAT_S"
    )
    reported_state: Literal["loaded", "failed", "empty"] = Field(description="what it last reported, alive or not")
    alive: bool
    last_heartbeat: Timestamp | None
    error: str
    generation: int
    updated_at: Timestamp


class DeploymentView(Reply):
    """A model's desired slots, what each process reports, and its latest ten rollouts."""

    model: str
    slots: dict[Slot, SlotDesired]
    stable_slot: Slot
    generation: int
    processes: list[SlotReport]
    rollouts: list[RolloutView]


class SlotReloadView(Reply):
    model: str
    slot: Slot
    version: str
    generation: int


class BatchingLimits(Reply):
    """The limits in force: the desired ones, each null one replaced by this process's own setting."""

    max_batch_size: int
    max_queue_delay_ms: float
    max_queue_size: int


class BatchingView(Reply):
    generation: int
    batching: BatchingLimits


class CompactView(Reply):
    compact_generation: int


class EngineProcessView(Reply):
    """What one serving process has applied."""

    process: str
    node: str = Field(description="the node the process runs on (FLIGHTDECK_NODE; process names are NODE:PID)")
    generation: int
    compact_generation: int
    error: str
    report: dict[str, Any] | None = Field(description="the last compaction's figures")
    updated_at: Timestamp


class EngineDesiredView(Reply):
    generation: int
    compact_generation: int
    batching: BatchingLimits
    processes: list[EngineProcessView] = Field(description="processes heard from in the last minute")
