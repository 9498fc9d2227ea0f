"""The scheduler simulation (SPEC R26): small runs with every fault on, determinism, and
negative controls showing that each check can fail, so a green report means something."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import idemcrawl.frontier.scheduler as scheduler
from idemcrawl.lab import politeness_check
from idemcrawl.lab.sim import SimOptions, SimReport, compare_hot_host, main, run_sim

from ..frontier.conftest import drop_pg_schema, pg_schema_for, require_postgres

#: Every fault far more often than by default, and robots.txt answers of every kind.
FAULTY = dict(
    hosts=50,
    urls_per_host=10,
    concurrency=16,
    p_crash=0.03,
    p_lost=0.03,
    p_duplicate=0.05,
    error_hosts=0.4,
    robots_mix=(0.3, 0.2, 0.1, 0.1, 0.1, 0.2),
    max_virtual_seconds=1800.0,
)


def faulty(**kw: Any) -> SimOptions:
    return SimOptions(**{**FAULTY, **kw})  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def report() -> SimReport:
    return run_sim(faulty(seed=7))


def test_small_sim_with_all_faults_passes(report: SimReport) -> None:
    assert report.ok, report.text()
    assert report.finished
    assert report.audit["violations"] == 0
    assert report.request_log["violations"] == 0
    assert report.request_log["retry_after_violations"] == 0
    assert report.disallowed["leases"] == 0
    assert report.events["duplicate_events"] == 0
    assert report.events["events"] == report.outcomes["pages_done"] > 0
    assert report.checks["backpressure"]


def test_every_fault_actually_happened(report: SimReport) -> None:
    """A pass is only meaningful if the run went through the paths it claims to test."""
    f = report.faults
    assert f["crash"] > 0 and f["lost"] > 0 and f["duplicate"] > 0
    assert f["http_429"] > 0 and f["http_503"] > 0
    assert f["robots_refetches"] > 0  # short max_age: copies expired during the run
    assert report.request_log["retry_after_marks"] > 0
    assert report.events["duplicates_rejected"] == f["duplicate"]
    assert report.scheduler["lease_expiries"] >= f["crash"] + f["lost"]
    states = report.frontier["urls_by_state"]
    assert states["disallowed"] > 0  # /private URLs
    assert states["deferred"] > 0  # hosts whose robots.txt is blocked or stays unreachable
    bp = report.backpressure
    assert bp["held_peak"] > 0 and bp["saturated"]
    assert bp["max_outstanding"] <= report.options["concurrency"]


def test_same_seed_same_report() -> None:
    def strip(r: SimReport) -> dict[str, Any]:
        d = r.as_dict()
        d.pop("wall")
        return d

    a = run_sim(faulty(hosts=30, seed=3))
    b = run_sim(faulty(hosts=30, seed=3))
    assert strip(a) == strip(b)
    c = run_sim(faulty(hosts=30, seed=4))
    assert strip(c) != strip(a)


def test_frontier_without_robots_is_caught() -> None:
    """Negative control: the frontier gets no RobotsCache while the sites have rules."""
    r = run_sim(faulty(seed=7, frontier_robots=False))
    assert not r.ok
    assert not r.checks["disallowed_leases"]
    assert r.disallowed["leases"] > 0
    assert r.disallowed["by_reason"]["before robots.txt known"] > 0
    assert r.disallowed["by_reason"]["disallowed path"] > 0
    # The servers saw it too: /private fetched, and pages of hosts whose robots.txt is down.
    assert r.request_log["by_kind"].get("disallowed", 0) > 0
    assert r.request_log["by_kind"].get("forbidden-host", 0) > 0


def test_frontier_reclaiming_leases_early_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a frontier whose leases expire while their requests still run, so a
    host's slot is handed out again too soon. Its lease log looks fine (each grant saw a free
    slot); the servers' request log and the simulator's lease bookkeeping must not."""
    real = scheduler.Scheduler._expire
    monkeypatch.setattr(
        scheduler.Scheduler, "_expire", lambda self, s, now, **kw: real(self, s, now + 59.9, **kw)
    )
    r = run_sim(faulty(seed=7, hosts=20, max_virtual_seconds=60.0))
    assert not r.ok
    assert r.audit["violations"] == 0  # blind to it: why the request log is checked too
    assert r.request_log["by_kind"].get("concurrency", 0) > 0
    assert not r.checks["no_double_lease"]
    assert not r.checks["in_flight_consistent"]


def test_frontier_ignoring_delay_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a frontier that spaces requests by half the delay."""
    real = scheduler.effective_delay
    monkeypatch.setattr(scheduler, "effective_delay", lambda *a, **k: real(*a, **k) / 2)
    monkeypatch.setattr(scheduler, "end_gap", lambda *a: 0.0)  # no end-to-start spacing (I8)
    r = run_sim(faulty(seed=7, hosts=20, error_hosts=0.0))
    assert not r.ok
    assert r.request_log["by_kind"].get("gap", 0) > 0


def test_checker_flags_a_doctored_log() -> None:
    """The request-log checker the simulation relies on does fail on an impolite log."""
    allow = {"http://a.test": politeness_check.Allowance(max_in_flight=1, min_gap=1.0)}
    good = [
        {"host": "http://a.test", "path": "/robots.txt", "start": 0.0, "end": 0.3},
        {"host": "http://a.test", "path": "/p0", "start": 1.3, "end": 1.6},
    ]
    assert politeness_check.check_log(good, allow, tolerance=1e-6) == []
    doctored = [*good, {"host": "http://a.test", "path": "/p1", "start": 1.5, "end": 1.8}]
    kinds = {v.kind for v in politeness_check.check_log(doctored, allow, tolerance=1e-6)}
    assert kinds == {"concurrency", "gap"}


def test_hot_host_does_not_slow_the_others() -> None:
    cmp = compare_hot_host(faulty(hosts=40, hot_host_urls=5000, seed=5))
    with_hot, without = cmp
    assert with_hot.ok, with_hot.text()
    assert without.ok, without.text()
    assert with_hot.grants["hot"] > 0 and without.grants["hot"] == 0
    assert cmp.ratio is not None and cmp.ratio <= cmp.tolerance, cmp.text()
    assert "ratio" in cmp.text()


def test_options_are_validated() -> None:
    with pytest.raises(ValueError):
        SimOptions(tick=0)
    with pytest.raises(ValueError):
        SimOptions(class_mix=(1.0, 0.0))
    with pytest.raises(ValueError):
        compare_hot_host(SimOptions(hot_host_urls=0))


def test_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--hosts", "20", "--concurrency", "8", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "result: PASS" in out
    assert "eligibility delay" in out
    assert "audit_violations" in out


def test_sim_drives_the_sqlite_backend_through_the_contract() -> None:
    r = run_sim(faulty(hosts=20, seed=11, backend="sqlite"))
    assert r.ok, r.text()
    assert r.options["backend"] == "sqlite" and "real sqlite frontier" in r.text()
    # The same seed on the memory backend makes the same scheduling decisions.
    m = run_sim(faulty(hosts=20, seed=11))
    assert (m.grants, m.outcomes, m.events) == (r.grants, r.outcomes, r.events)


def test_sim_drives_postgresql(tmp_path: Path) -> None:
    dsn = require_postgres()
    schema = pg_schema_for(tmp_path)
    try:
        r = run_sim(faulty(hosts=10, seed=12, backend=f"{dsn}?schema={schema}"))
    finally:
        drop_pg_schema(schema)
    assert r.ok, r.text()
    assert "real postgresql frontier" in r.text()


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(ValueError, match="backend"):
        SimOptions(backend="mysql://x")
