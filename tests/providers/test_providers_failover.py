"""Failover: capacity/quota move on and block, transient backs off on the clock, auth stops, nothing leaks."""

from __future__ import annotations

import random

import pytest

from broker.clock import ManualClock
from broker.errors import AuthError, CapacityError, InvalidRequestError, QuotaError, TransientError
from broker.model import RetryPolicy
from providers.base import TAG_JOB, TAG_REQUEST
from providers.failover import Blocklist, backoff_delay, exhausted_reason, provision
from providers.fake import FakeProvider

from .builders import make_job, make_option

A1 = make_option("a", "r1", "t.small")
A1B = make_option("a", "r1", "t.big")
A2 = make_option("a", "r2", "t.small")
B1 = make_option("b", "r1", "t.small")

DEFAULT_RETRY = RetryPolicy()


def run(providers: dict[str, FakeProvider], options, retry=DEFAULT_RETRY, clock=None, blocklist=None, **kw):
    clock = clock or ManualClock()
    out = provision(
        options,
        providers.__getitem__,
        request_id="req-1",
        tags={TAG_JOB: "job-1"},
        job=None,
        retry=retry,
        clock=clock,
        blocklist=blocklist,
        rng=random.Random(7),
        **kw,
    )
    return out, clock


SCENARIOS = [
    ("capacity on the first region fails over to the next region",
     {"a": [CapacityError("full"), None]}, [A1, A2], ("a", "r2"), ["capacity", "launched"]),
    ("quota on a region skips the other offer in that region",
     {"a": [QuotaError("vcpus")], "b": []}, [A1, A1B, B1], ("b", "r1"), ["quota", "skipped", "launched"]),
    ("capacity blocks only that offer, not the region",
     {"a": [CapacityError("full"), None]}, [A1, A1B], ("a", "r1"), ["capacity", "launched"]),
    ("an invalid request moves on to the next provider",
     {"a": [InvalidRequestError("bad ami")], "b": []}, [A1, B1], ("b", "r1"), ["invalid", "launched"]),
    ("transient errors are retried on the same option",
     {"a": [TransientError("429"), TransientError("429"), None]}, [A1, B1], ("a", "r1"),
     ["transient", "transient", "launched"]),
    ("auth stops at once without trying the rest",
     {"a": [AuthError("denied")], "b": []}, [A1, B1], None, ["auth"]),
    ("every option out of capacity gives up with the last error",
     {"a": [CapacityError("x"), CapacityError("y")], "b": [CapacityError("z")]}, [A1, A2, B1], None,
     ["capacity", "capacity", "capacity"]),
]


@pytest.mark.parametrize(("script", "options", "where", "outcomes"), [s[1:] for s in SCENARIOS],
                         ids=[s[0] for s in SCENARIOS])
def test_failover_scenarios(script, options, where, outcomes) -> None:
    fakes = {name: FakeProvider(name, fail=errors) for name, errors in script.items()}
    out, _ = run(fakes, options)
    assert [a.outcome for a in out.attempts] == outcomes
    if where is None:
        assert out.option is None and out.instances == [] and out.error is not None
        assert type(out.error).__name__.lower().startswith(outcomes[-1])
    else:
        assert out.ok and (out.option.provider, out.option.region) == where
        assert [i.tags[TAG_REQUEST] for i in out.instances] == ["req-1"]
        assert out.instances[0].tags[TAG_JOB] == "job-1"
    for fake in fakes.values():
        live = {i.id for i in fake.running()}
        assert live == ({i.id for i in out.instances} if where and where[0] == fake.name else set())


def test_backoff_delays_double_up_to_the_cap_with_jitter_on_the_clock() -> None:
    retry = RetryPolicy(backoff_limit=6, retry_delay_seconds=10, max_retry_delay_seconds=120)
    fake = FakeProvider("a", fail=[TransientError("slow")] * 6)
    out, clock = run({"a": fake}, [A1], retry=retry)
    assert out.ok
    expected = [min(120.0, 10.0 * 2**n) for n in range(6)]  # 10 20 40 80 120 120
    assert len(clock.sleeps) == 6
    for slept, base in zip(clock.sleeps, expected, strict=True):
        assert base * 0.5 <= slept <= base
    assert [a.delay_seconds for a in out.attempts if a.outcome == "transient"] == clock.sleeps
    rng = random.Random(7)
    assert clock.sleeps == [backoff_delay(retry, n, rng) for n in range(6)]


def test_backoff_jitter_is_reproducible_with_a_seeded_rng() -> None:
    fake1 = FakeProvider("a", fail=[TransientError("slow")] * 3)
    fake2 = FakeProvider("a", fail=[TransientError("slow")] * 3)
    _, c1 = run({"a": fake1}, [A1])
    _, c2 = run({"a": fake2}, [A1])
    assert c1.sleeps == c2.sleeps and len(set(c1.sleeps)) == 3


def test_gives_up_after_the_backoff_limit() -> None:
    fake = FakeProvider("a", fail=[TransientError("throttled")] * 10)
    out, clock = run({"a": fake}, [A1], retry=RetryPolicy(backoff_limit=3, retry_delay_seconds=1))
    assert not out.ok and isinstance(out.error, TransientError)
    assert len(clock.sleeps) == 3
    assert len(fake.launch_calls) == 4  # the first try and 3 retries
    assert "gave up after 3 retries" in out.attempts[-1].message


def test_a_blocked_offer_is_skipped_by_the_next_call_until_it_expires() -> None:
    clock = ManualClock()
    blocks = Blocklist(clock, capacity_block_seconds=300)
    fake = FakeProvider("a", fail=[CapacityError("full")])
    out1, _ = run({"a": fake}, [A1], clock=clock, blocklist=blocks)
    assert out1.error is not None
    out2, _ = run({"a": fake}, [A1], clock=clock, blocklist=blocks)
    assert [a.outcome for a in out2.attempts] == ["skipped"]
    clock.advance(301)
    out3, _ = run({"a": fake}, [A1], clock=clock, blocklist=blocks)
    assert out3.ok


def test_a_partial_launch_that_errors_leaves_no_orphan() -> None:
    leaky = FakeProvider("a", fail=[CapacityError("half made")], leak_on_error=True)
    ok = FakeProvider("b")
    out, _ = run({"a": leaky, "b": ok}, [A1, B1], count=2)
    assert out.ok and len(out.instances) == 2
    assert leaky.running() == [] and len(leaky.terminated) == 2


def test_an_abandoned_request_terminates_what_it_created_everywhere() -> None:
    leaky = FakeProvider("a", fail=[CapacityError("half")], leak_on_error=True)
    auth = FakeProvider("b", fail=[AuthError("no")])
    out, _ = run({"a": leaky, "b": auth}, [A1, B1])
    assert isinstance(out.error, AuthError)
    assert leaky.running() == [] and auth.running() == []


def test_provision_is_idempotent_per_request_id() -> None:
    fake = FakeProvider("a")
    out1, _ = run({"a": fake}, [A1])
    out2, _ = run({"a": fake}, [A1])
    assert [i.id for i in out1.instances] == [i.id for i in out2.instances]
    assert len(fake.running()) == 1


def test_an_unexpected_adapter_exception_is_a_failed_option_not_a_crash() -> None:
    def boom(offer, count, request_id):
        raise RuntimeError("adapter bug")

    out, _ = run({"a": FakeProvider("a", fail=boom), "b": FakeProvider("b")}, [A1, B1])
    assert out.ok and out.option == B1
    assert out.attempts[0].outcome == "provider" and "adapter bug" in out.attempts[0].message


def _transient(after: float | None) -> TransientError:
    err = TransientError("429 throttled")
    err.retry_after = after  # type: ignore[attr-defined]  # what map_exception reads from Retry-After
    return err


def test_when_retries_run_out_the_next_option_is_tried() -> None:
    a, b = FakeProvider("a", fail=[TransientError("busy")] * 10), FakeProvider("b")
    out, clock = run({"a": a, "b": b}, [A1, B1], retry=RetryPolicy(backoff_limit=2, retry_delay_seconds=1))
    assert [x.outcome for x in out.attempts] == ["transient", "transient", "transient", "launched"]
    assert out.ok and out.option == B1 and len(clock.sleeps) == 2 and a.running() == []


def test_retry_after_is_honoured_when_longer_than_the_backoff() -> None:
    fake = FakeProvider("a", fail=[_transient(45.0), None])
    out, clock = run({"a": fake}, [A1], retry=RetryPolicy(backoff_limit=3, retry_delay_seconds=1,
                                                          max_retry_delay_seconds=120))
    assert out.ok and clock.sleeps == [45.0]


def test_a_retry_after_over_the_cap_blocks_the_offer_and_moves_on_without_sleeping() -> None:
    clock = ManualClock()
    blocks = Blocklist(clock)
    a, b = FakeProvider("a", fail=[_transient(600.0)]), FakeProvider("b")
    out, _ = run({"a": a, "b": b}, [A1, B1], clock=clock, blocklist=blocks,
                 retry=RetryPolicy(backoff_limit=3, retry_delay_seconds=1, max_retry_delay_seconds=60))
    assert out.option == B1 and clock.sleeps == [] and "Retry-After 600s" in out.attempts[0].message
    assert blocks.reason(A1) is not None
    clock.advance(601)
    assert blocks.reason(A1) is None


def test_a_command_job_is_not_launched_where_nothing_runs_it() -> None:
    from providers.base import Capability

    no_work = FakeProvider("a", capabilities=frozenset({Capability.TAGS}))
    out = provision([A1, B1], {"a": no_work, "b": FakeProvider("b")}.__getitem__, request_id="req-w",
                    tags={TAG_JOB: "w"}, job=make_job("w", command=("true",)), retry=DEFAULT_RETRY,
                    clock=ManualClock())
    assert [x.outcome for x in out.attempts] == ["invalid", "launched"] and no_work.launch_calls == []
    assert "runs-work" in out.attempts[0].message and out.option == B1


def test_every_option_tried_and_failed_is_exhausted_and_the_reason_names_each_option() -> None:
    a = FakeProvider("a", fail=[TransientError("throttled")] * 10)
    b = FakeProvider("b", fail=[CapacityError("no t.small left")])
    out, clock = run({"a": a, "b": b}, [A1, B1], retry=RetryPolicy(backoff_limit=1, retry_delay_seconds=2))
    assert out.exhausted and not out.ok and len(clock.sleeps) == 1
    why = exhausted_reason(out.attempts)
    assert why.startswith("every placement option failed (2 tried): a:r1 t.small on-demand: 2 transient errors")
    assert "gave up after 1 retries" in why and "b:r1 t.small on-demand: capacity error" in why


def test_a_skip_for_a_block_this_call_set_still_counts_as_tried() -> None:
    out, _ = run({"a": FakeProvider("a", fail=[QuotaError("vcpus")])}, [A1, A1B])
    assert [x.outcome for x in out.attempts] == ["quota", "skipped"] and out.exhausted


def test_an_option_skipped_for_an_earlier_block_is_not_exhausted_it_may_come_back() -> None:
    clock = ManualClock()
    blocks = Blocklist(clock)
    blocks.block_offer(A1, "capacity seen by another job")
    out, _ = run({"a": FakeProvider("a", fail=[CapacityError("full")])}, [A1, A2], clock=clock, blocklist=blocks)
    assert [x.outcome for x in out.attempts] == ["skipped", "capacity"] and not out.exhausted


def test_auth_is_not_exhausted_but_stops() -> None:
    out, _ = run({"a": FakeProvider("a", fail=[AuthError("denied")]), "b": FakeProvider("b")}, [A1, B1])
    assert isinstance(out.error, AuthError) and not out.exhausted


def test_a_retry_past_the_wait_budget_blocks_the_offer_for_its_delay_and_moves_on() -> None:
    """A throttled option is retried while its delays fit the call's wait budget; the retry that would not
    fit is not slept: the offer is blocked for that delay, the next option launches, and a list that fails
    this way is not exhausted (the job backs off and comes back once the block expires)."""
    clock = ManualClock()
    blocks = Blocklist(clock)
    retry = RetryPolicy(backoff_limit=6, retry_delay_seconds=4, max_retry_delay_seconds=120)
    a, b = FakeProvider("a", fail=[TransientError("throttled")] * 10), FakeProvider("b")
    out, _ = run({"a": a, "b": b}, [A1, B1], retry=retry, clock=clock, blocklist=blocks, wait_budget_seconds=10)
    assert out.ok and out.option == B1
    over = out.attempts[len(clock.sleeps)]  # the retries slept come first, then the one that did not fit
    assert over.outcome == "transient" and "past this call's 10s wait budget" in over.message
    assert sum(clock.sleeps) <= 10 < sum(clock.sleeps) + over.delay_seconds
    assert blocks.reason(A1) is not None
    clock.advance(over.delay_seconds + 0.01)
    assert blocks.reason(A1) is None
    a2 = FakeProvider("a", fail=[TransientError("throttled")] * 10)
    out2, clock2 = run({"a": a2}, [A1], retry=retry, wait_budget_seconds=10)
    assert not out2.ok and not out2.exhausted and sum(clock2.sleeps) <= 10
    unbounded, clock3 = run({"a": FakeProvider("a", fail=[TransientError("throttled")] * 10)}, [A1], retry=retry)
    assert len(clock3.sleeps) == 6 and unbounded.exhausted  # no budget: the spec's retries, all slept
