"""The evaluator against cases small enough to compute by hand, with Prometheus's semantics
(each expected figure is derived in the test), and the scraper against a real HTTP server."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from tests.observability.promql import Element, Evaluator, PromQLError, Unsupported
from tests.observability.rules import load_alerts
from tests.observability.tsdb import Labels, Scraper, Store, Target, labels_of
from tests.support.ports import free_port


def series(name: str, **labels: str) -> Labels:
    return labels_of({"__name__": name, **labels})


def store_with(*rows: tuple[Labels, Sequence[tuple[float, float | None]]]) -> Store:
    store = Store()
    for labels, points in rows:
        for t, value in points:
            store.append(labels, t, value)
    return store


def values(elements: list[Element]) -> dict[Labels, float]:
    return {e.labels: e.value for e in elements}


def one(elements: list[Element]) -> float:
    assert len(elements) == 1, elements
    return elements[0].value


# ------------------------------------------------------------------------------ selectors


def test_matchers_select_by_equality_and_anchored_regexes() -> None:
    store = store_with(
        (series("m", job="a", code="200"), [(0, 1)]),
        (series("m", job="b", code="503"), [(0, 2)]),
        (series("m", job="ab"), [(0, 3)]),
        (series("other", job="a"), [(0, 4)]),
    )
    ev = Evaluator(store)
    assert sorted(e.value for e in ev.vector('m{job="a"}', 0)) == [1]
    assert sorted(e.value for e in ev.vector('m{job!="a"}', 0)) == [2, 3]
    # =~ is anchored: "a" does not match "ab"
    assert sorted(e.value for e in ev.vector('m{job=~"a"}', 0)) == [1]
    assert sorted(e.value for e in ev.vector('m{code=~"5.."}', 0)) == [2]
    assert sorted(e.value for e in ev.vector('m{code!~"5.."}', 0)) == [1, 3]
    # a missing label matches the empty value
    assert sorted(e.value for e in ev.vector('m{code=""}', 0)) == [3]
    assert sorted(e.value for e in ev.vector('{__name__=~"m|other", job="a"}', 0)) == [1, 4]


def test_an_instant_selector_takes_the_newest_point_within_five_minutes() -> None:
    store = store_with((series("g"), [(0, 1), (60, 2)]))
    ev = Evaluator(store)
    assert one(ev.vector("g", 30)) == 1
    assert one(ev.vector("g", 60)) == 2
    assert one(ev.vector("g", 359)) == 2  # 299 s old: still inside the lookback
    assert ev.vector("g", 360) == []  # 300 s old: the window (t-300, t] is left-open
    assert one(ev.vector("g offset 1m", 90)) == 1


def test_a_staleness_marker_hides_a_series_at_once() -> None:
    store = store_with((series("g"), [(0, 1), (15, None)]))
    ev = Evaluator(store)
    assert one(ev.vector("g", 14)) == 1
    assert ev.vector("g", 15) == []
    assert ev.vector("g", 100) == []


# ------------------------------------------------------------------------ range functions


def test_rate_and_increase_extrapolate_to_the_window_like_prometheus() -> None:
    # A counter growing 1/s, scraped every 15 s from t=0.
    store = store_with((series("c_total"), [(t, float(t)) for t in range(0, 75, 15)]))
    ev = Evaluator(store)
    # [1m] at t=60 holds t=15..60 (left-open): 45 over 45 s; the first sample is 15 s from
    # the window's start (< 1.1 x 15 s), so it extrapolates all the way: 45 x 60/45 = 60.
    assert one(ev.vector("increase(c_total[1m])", 60)) == pytest.approx(60)
    assert one(ev.vector("rate(c_total[1m])", 60)) == pytest.approx(1)
    # The name goes: it is no longer the counter.
    assert ev.vector("rate(c_total[1m])", 60)[0].labels == ()


def test_increase_adds_counter_resets_back_and_stops_at_zero() -> None:
    store = store_with((series("c_total"), [(15, 10), (30, 20), (45, 5)]))
    ev = Evaluator(store)
    # 5 - 10 + 20 (the reset) = 15 over 30 s; start: 15 s away (< 16.5) is extrapolated,
    # but the counter would reach zero 30 x 10/15 = 20 s before the first sample: 15 wins;
    # end: 15 s away, also extrapolated: 15 x (30 + 15 + 15) / 30 = 30.
    assert one(ev.vector("increase(c_total[1m])", 60)) == pytest.approx(30)
    assert one(ev.vector("resets(c_total[1m])", 60)) == 1
    assert one(ev.vector("changes(c_total[1m])", 60)) == 2


def test_a_sparse_window_extrapolates_half_an_interval() -> None:
    store = store_with((series("c_total"), [(50, 100), (60, 110)]))
    ev = Evaluator(store)
    # 10 over 10 s, 50 s from the start (> 11): half an interval (5 s) only: 10 x 15/10.
    assert one(ev.vector("increase(c_total[1m])", 60)) == pytest.approx(15)
    # One sample is not enough for a rate.
    assert ev.vector("rate(c_total[1m])", 55) == []


def test_delta_and_over_time_functions_on_a_gauge() -> None:
    store = store_with((series("g"), [(15, 4), (30, 1), (45, 7), (60, 2)]))
    ev = Evaluator(store)
    # -2 over 45 s, extrapolated by 15 s at the start: -2 x 60/45 (no zero clamp for gauges)
    assert one(ev.vector("delta(g[1m])", 60)) == pytest.approx(-2 * 60 / 45)
    assert one(ev.vector("max_over_time(g[1m])", 60)) == 7
    assert one(ev.vector("min_over_time(g[1m])", 60)) == 1
    assert one(ev.vector("avg_over_time(g[1m])", 60)) == pytest.approx(3.5)
    assert one(ev.vector("sum_over_time(g[1m])", 60)) == 14
    assert one(ev.vector("count_over_time(g[1m])", 60)) == 4
    assert one(ev.vector("last_over_time(g[1m])", 60)) == 2
    assert one(ev.vector("idelta(g[1m])", 60)) == -5
    assert one(ev.vector("max_over_time(g[20s])", 60)) == 7  # (40, 60]: t=45 and t=60
    assert one(ev.vector("irate(g[1m])", 60)) == pytest.approx(2 / 15)  # a drop: a reset


def test_range_windows_skip_staleness_markers() -> None:
    store = store_with((series("c_total"), [(0, 0), (15, 15), (30, None), (45, 45)]))
    ev = Evaluator(store)
    assert one(ev.vector("count_over_time(c_total[1m])", 45)) == 3


# -------------------------------------------------------------------------- aggregations


def test_sum_by_and_without_keep_only_the_grouping_labels() -> None:
    store = store_with(
        (series("r", job="a", pod="1", code="x"), [(0, 1)]),
        (series("r", job="a", pod="2", code="x"), [(0, 2)]),
        (series("r", job="b", pod="3", code="y"), [(0, 4)]),
    )
    ev = Evaluator(store)
    assert values(ev.vector("sum by (job) (r)", 0)) == {(("job", "a"),): 3, (("job", "b"),): 4}
    assert values(ev.vector("sum without (pod) (r)", 0)) == {
        (("code", "x"), ("job", "a")): 3,
        (("code", "y"), ("job", "b")): 4,
    }
    assert values(ev.vector("sum(r)", 0)) == {(): 7}
    assert values(ev.vector("count by (code) (r)", 0)) == {
        (("code", "x"),): 2,
        (("code", "y"),): 1,
    }
    assert one(ev.vector("max(r)", 0)) == 4
    assert one(ev.vector("min(r)", 0)) == 1
    assert one(ev.vector("avg(r)", 0)) == pytest.approx(7 / 3)
    assert [e.value for e in ev.vector("topk(1, r)", 0)] == [4]
    assert ev.vector("topk(1, r)", 0)[0].labels == series("r", job="b", pod="3", code="y")
    assert ev.vector("sum(nothing)", 0) == []


# ------------------------------------------------------------------------ binary operators


def test_comparisons_filter_unless_bool_and_keep_the_vectors_value() -> None:
    store = store_with((series("g", i="1"), [(0, 0)]), (series("g", i="2"), [(0, 5)]))
    ev = Evaluator(store)
    kept = ev.vector("g > 1", 0)
    assert [(e.labels, e.value) for e in kept] == [(series("g", i="2"), 5)]  # name kept
    assert values(ev.vector("g > bool 1", 0)) == {(("i", "1"),): 0, (("i", "2"),): 1}
    # a scalar on the left: the value is still the vector's
    assert values(ev.vector("1 < g", 0)) == {series("g", i="2"): 5}
    assert ev.vector("g == 1", 0) == []
    assert values(ev.vector("g == 0", 0)) == {series("g", i="1"): 0}


def test_arithmetic_drops_the_name_and_divides_like_floats() -> None:
    store = store_with(
        (series("num", job="a"), [(0, 3)]),
        (series("den", job="a"), [(0, 0)]),
        (series("den", job="b"), [(0, 2)]),
        (series("num", job="b"), [(0, 1)]),
    )
    ev = Evaluator(store)
    ratio = values(ev.vector("num / den", 0))
    assert ratio[(("job", "a"),)] == math.inf
    assert ratio[(("job", "b"),)] == 0.5
    assert values(ev.vector("num / den > 0.25", 0)) == {
        (("job", "a"),): math.inf,
        (("job", "b"),): 0.5,
    }
    assert values(ev.vector("-num + 2 * 3", 0)) == {(("job", "a"),): 3, (("job", "b"),): 5}
    assert ev.evaluate("2 ^ 10 % 1000", 0).value == 24  # type: ignore[union-attr]


def test_set_operators_match_on_all_labels_but_the_name_or_on_a_list() -> None:
    store = store_with(
        (series("a", job="x", pod="1"), [(0, 1)]),
        (series("a", job="y", pod="2"), [(0, 2)]),
        (series("b", job="x", pod="9"), [(0, 3)]),
    )
    ev = Evaluator(store)
    assert ev.vector("a and b", 0) == []  # pod differs
    assert values(ev.vector("a and on (job) b", 0)) == {series("a", job="x", pod="1"): 1}
    assert values(ev.vector("a unless on (job) b", 0)) == {series("a", job="y", pod="2"): 2}
    assert values(ev.vector("a or on (job) b", 0)) == {
        series("a", job="x", pod="1"): 1,
        series("a", job="y", pod="2"): 2,
    }
    assert len(ev.vector("a or b", 0)) == 3


def test_vector_matching_one_to_one_many_to_one_and_its_errors() -> None:
    store = store_with(
        (series("req", job="x", code="200"), [(0, 8)]),
        (series("req", job="x", code="500"), [(0, 2)]),
        (series("total", job="x", team="t1"), [(0, 10)]),
    )
    ev = Evaluator(store)
    with pytest.raises(PromQLError, match="group_left"):
        ev.vector("req / on (job) total", 0)
    assert values(ev.vector("req / on (job) group_left (team) total", 0)) == {
        (("code", "200"), ("job", "x"), ("team", "t1")): 0.8,
        (("code", "500"), ("job", "x"), ("team", "t1")): 0.2,
    }
    assert values(ev.vector('req{code="500"} / ignoring (code, team) total', 0)) == {
        (("job", "x"),): 0.2
    }
    with pytest.raises(PromQLError, match="many-to-many"):
        ev.vector("total / on (job) req", 0)


def test_absent_reports_the_equality_matchers_only_when_nothing_matches() -> None:
    store = store_with((series("up", job="svc"), [(0, 0)]))
    ev = Evaluator(store)
    assert ev.vector('absent(up{job="svc"})', 0) == []
    assert values(ev.vector('absent(up{job="other", instance=~".*"})', 0)) == {
        (("job", "other"),): 1
    }
    # of an expression, no labels: up is there but not 1
    assert values(ev.vector('absent(up{job="svc"} == 1)', 0)) == {(): 1}
    assert ev.vector('absent_over_time(up{job="svc"}[5m])', 0) == []


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    buckets = [("0.1", 10.0), ("0.5", 20.0), ("+Inf", 20.0)]
    store = store_with(*((series("h_bucket", job="w", le=le), [(0, n)]) for le, n in buckets))
    ev = Evaluator(store)
    # rank 10 of 20 falls at the top of the first bucket
    assert values(ev.vector("histogram_quantile(0.5, h_bucket)", 0)) == {
        (("job", "w"),): pytest.approx(0.1)
    }
    # rank 15: 5 of the second bucket's 10, halfway from 0.1 to 0.5
    assert one(ev.vector("histogram_quantile(0.75, h_bucket)", 0)) == pytest.approx(0.3)
    assert ev.vector("histogram_quantile(0.75, h_bucket) > 1", 0) == []
    # everything in +Inf: the highest finite bound
    store.append(series("h_bucket", job="w", le="+Inf"), 15, 40.0)
    store.append(series("h_bucket", job="w", le="0.1"), 15, 10.0)
    store.append(series("h_bucket", job="w", le="0.5"), 15, 20.0)
    assert one(ev.vector("histogram_quantile(0.99, h_bucket)", 15)) == 0.5
    # no observations: NaN, which no comparison keeps
    empty = store_with(*((series("e_bucket", le=le), [(0, 0.0)]) for le, _n in buckets))
    assert math.isnan(one(Evaluator(empty).vector("histogram_quantile(0.5, e_bucket)", 0)))
    assert Evaluator(empty).vector("histogram_quantile(0.5, e_bucket) > 0", 0) == []


@pytest.mark.parametrize(
    "expr",
    [
        "max_over_time(g[5m:1m])",
        "g @ 100",
        'count_values("v", g)',
        'label_replace(g, "a", "$1", "b", "(.*)")',
        "quantile(0.5, g)",
        'g{a="1" or b="2"}',
    ],
)
def test_what_is_not_implemented_says_so(expr: str) -> None:
    with pytest.raises(Unsupported):
        Evaluator(Store()).vector(expr, 0)


def test_every_alert_of_the_chart_is_within_the_evaluated_subset() -> None:
    alerts = load_alerts()
    assert alerts
    ev = Evaluator(Store())
    for rule in alerts.values():
        ev.vector(rule.expr, 0)  # raises Unsupported for anything not implemented


# ---------------------------------------------------------------------------- the scraper


@pytest.fixture
def exporter() -> Iterator[tuple[CollectorRegistry, str]]:
    registry = CollectorRegistry()
    port = free_port()
    server, thread = start_http_server(port, "127.0.0.1", registry=registry)
    yield registry, f"http://127.0.0.1:{port}/metrics"
    server.shutdown()
    thread.join(5)


def test_a_scrape_adds_target_labels_up_and_staleness(
    exporter: tuple[CollectorRegistry, str],
) -> None:
    registry, url = exporter
    hits = Counter("hits", "h", ["job"], registry=registry)
    temp = Gauge("temp", "t", ["room"], registry=registry)
    hits.labels("inner").inc(3)
    temp.labels("a").set(20)
    temp.labels("b").set(30)
    target = Target("outer", url, {"namespace": "ns"})
    scraper = Scraper([target])
    ev = Evaluator(scraper.store)

    t0 = scraper.scrape()
    instance = url.split("/")[2]
    assert values(ev.vector("up", t0)) == {
        series("up", job="outer", instance=instance, namespace="ns"): 1
    }
    # the exposed job label does not overwrite the target's: it becomes exported_job
    assert values(ev.vector("hits_total", t0)) == {
        series(
            "hits_total", job="outer", exported_job="inner", instance=instance, namespace="ns"
        ): 3
    }
    temp.remove("b")  # gone from the exposition: stale at the next scrape
    hits.labels("inner").inc(15)
    t1 = scraper.scrape()
    assert t1 == t0 + 15
    assert sorted(e.metric["room"] for e in ev.vector("temp", t1)) == ["a"]
    assert one(ev.vector("sum(increase(hits_total[1m]))", t1)) > 0

    server_gone = Target("outer", f"http://127.0.0.1:{free_port()}/metrics")
    scraper.targets = [server_gone]
    t2 = scraper.scrape()
    assert ev.vector("temp", t2) == []  # the target went: its series are stale
    assert values(ev.vector("up", t2)) == {
        series("up", job="outer", instance=server_gone.instance): 0
    }
    assert "ConnectError" in scraper.errors[server_gone]
