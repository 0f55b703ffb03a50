"""A reader mailbox measures how long each admission takes against
``engine.source-runtime.admission.p99-budget``: the p99 and the admissions over the budget are
in its task group's ``sourceRuntime`` metrics, and a p99 over the budget is logged at most once
a minute. The poll options the watchdog reads come from the engine options too."""

from __future__ import annotations

from engine.sourceruntime.admission import BUDGET_OPTION, WARN_INTERVAL, AdmissionLatency
from engine.sourceruntime.choices import AdmissionStatus, CommandKind
from engine.sourceruntime.limits import MailboxLimits, PollLimits
from engine.sourceruntime.mailbox import ReaderMailbox, WorkerBudget
from tests.source_conformance import admit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_budget_and_the_cancellation_timeout_are_the_engine_options(settings):
    assert MailboxLimits.from_settings().p99_budget == 0.005
    assert PollLimits.from_settings().cancellation_timeout == 30.0
    settings.ENGINE = {
        **settings.ENGINE,
        "source-runtime.admission.p99-budget": 0.002,
        "source-runtime.poll.cancellation-timeout": 4.0,
    }
    assert MailboxLimits.from_settings().p99_budget == 0.002
    assert PollLimits.from_settings().cancellation_timeout == 4.0


def test_every_admission_is_measured_and_those_over_the_budget_counted():
    """An accepted command takes 7 ms here (its wakeup is slow), anything else no time: once
    more than 1% of admissions were accepted, the p99 is over the 5 ms budget."""
    clock = Clock()

    def slow_wakeup() -> None:
        clock.now += 0.007

    box = ReaderMailbox(
        1, "1/1", 1, MailboxLimits(), WorkerBudget(10**9), wakeup=slow_wakeup, clock=clock
    )
    for _ in range(200):  # answered STALE_TARGET at once: another reader attempt's
        assert admit(box, CommandKind.AVAILABLE, attempt=2).status == AdmissionStatus.STALE_TARGET
    assert box.latency.to_json() == {
        "count": 200,
        "p99Ms": 0.0,
        "maxMs": 0.0,
        "overBudget": 0,
        "budgetMs": 5.0,
    }
    assert box.latency.warning(clock.now) is None
    for _ in range(3):
        assert admit(box, CommandKind.AVAILABLE).status == AdmissionStatus.ACCEPTED
    latency = box.latency.to_json()
    assert (latency["count"], latency["overBudget"], latency["maxMs"]) == (203, 3, 7.0)
    assert 5.0 < latency["p99Ms"] <= 7.0
    warning = box.latency.warning(clock.now)
    assert warning is not None and BUDGET_OPTION in warning and "3 of 203" in warning


def test_a_p99_over_the_budget_is_logged_at_most_once_a_minute():
    latency = AdmissionLatency(0.005)
    latency.record(0.010)
    assert latency.warning(1000.0) is not None
    assert latency.warning(1000.0 + WARN_INTERVAL - 1) is None
    assert latency.warning(1000.0 + WARN_INTERVAL) is not None
    for _ in range(1000):  # the p99 back within the budget: nothing to say
        latency.record(0.0001)
    assert latency.warning(5000.0) is None and latency.over_budget == 1
