"""A PromQL evaluation over :mod:`tests.observability.tsdb`, for the subset the chart's rules use.

The expression is parsed by Prometheus's own grammar (``promql_parser``, a port of it); this
module only evaluates the tree, with Prometheus's semantics for what it supports:

* instant selectors (matchers ``=``, ``!=``, ``=~``, ``!~``; ``offset``) with the five-minute
  lookback and staleness markers; range selectors ``[d]`` over the left-open window
  ``(t - d, t]`` (Prometheus 3);
* ``rate``, ``increase``, ``delta`` with Prometheus's extrapolation to the window's edges and
  counter resets; ``irate``, ``idelta``, ``changes``, ``resets``,
  ``{avg,min,max,sum,count,last,present}_over_time``;
* ``absent``, ``absent_over_time``, ``histogram_quantile`` (classic buckets),
  ``clamp``, ``clamp_min``, ``clamp_max``, ``abs``, ``ceil``, ``floor``, ``time``,
  ``vector``, ``scalar``, ``timestamp``;
* ``sum``, ``avg``, ``min``, ``max``, ``count``, ``group``, ``topk``, ``bottomk`` with ``by``
  and ``without``;
* arithmetic, comparisons (filtering, or ``bool``), ``and``, ``or``, ``unless``; vector
  matching one-to-one and many-to-one/one-to-many (``on``, ``ignoring``, ``group_left``,
  ``group_right``), with Prometheus's errors for ambiguous matches.

Anything else (subqueries, ``@``, ``or`` inside braces, other functions and aggregations)
raises :class:`Unsupported`: a rule the tests cannot evaluate is reported, never taken as
"does not fire".
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from itertools import pairwise

import promql_parser as pp

from tests.observability.tsdb import METRIC_NAME, Labels, Store

#: Prometheus's default ``--query.lookback-delta``.
LOOKBACK_SECONDS = 300.0


class PromQLError(Exception):
    """The expression fails as it would fail in Prometheus (bad types, ambiguous matching)."""


class Unsupported(PromQLError):
    """The expression uses PromQL this evaluator does not implement."""


@dataclass(frozen=True, slots=True)
class Element:
    """One element of an instant vector."""

    labels: Labels
    value: float

    @property
    def metric(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True, slots=True)
class RangeSeries:
    labels: Labels
    points: list[tuple[float, float]]


@dataclass(frozen=True, slots=True)
class Scalar:
    value: float


@dataclass(frozen=True, slots=True)
class String:
    value: str


@dataclass(frozen=True, slots=True)
class InstantVector:
    elements: list[Element]


@dataclass(frozen=True, slots=True)
class RangeVector:
    series: list[RangeSeries]


Value = Scalar | String | InstantVector | RangeVector


def parse(expr: str) -> pp.Expr:
    """Parse with Prometheus's grammar; a syntax error names the expression."""
    try:
        return pp.parse(expr)
    except ValueError as exc:
        raise PromQLError(f"does not parse: {expr!r}: {exc}") from exc


class Evaluator:
    """Evaluates expressions at a timestamp of the store's clock."""

    def __init__(self, store: Store, lookback: float = LOOKBACK_SECONDS) -> None:
        self.store = store
        self.lookback = lookback

    def evaluate(self, expr: str, at: float) -> Value:
        return self._eval(parse(expr), at)

    def vector(self, expr: str, at: float) -> list[Element]:
        """The instant vector an alerting rule sees (a scalar becomes one unlabelled
        element, as in Prometheus's rule manager)."""
        value = self.evaluate(expr, at)
        if isinstance(value, InstantVector):
            return value.elements
        if isinstance(value, Scalar):
            return [Element((), value.value)]
        raise PromQLError(f"{expr!r} is a {type(value).__name__}, not an instant vector")

    # ----------------------------------------------------------------------------- dispatch

    def _eval(self, node: pp.Expr, t: float) -> Value:
        if isinstance(node, pp.NumberLiteral):
            return Scalar(float(node.val))
        if isinstance(node, pp.StringLiteral):
            return String(str(node.val))
        if isinstance(node, pp.ParenExpr):
            return self._eval(node.expr, t)
        if isinstance(node, pp.UnaryExpr):  # PromQL's only unary operator that stays: minus
            return _negate(self._eval(node.expr, t))
        if isinstance(node, pp.VectorSelector):
            return InstantVector(self._instant(node, t))
        if isinstance(node, pp.MatrixSelector):
            return RangeVector(self._range(node, t))
        if isinstance(node, pp.Call):
            return self._call(node, t)
        if isinstance(node, pp.AggregateExpr):
            return self._aggregate(node, t)
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node, t)
        if isinstance(node, pp.SubqueryExpr):
            raise Unsupported(f"subqueries are not supported: {node}")
        raise Unsupported(f"unsupported expression node {type(node).__name__}: {node}")

    def _instant_vector(self, node: pp.Expr, t: float) -> list[Element]:
        value = self._eval(node, t)
        if not isinstance(value, InstantVector):
            raise PromQLError(f"expected an instant vector, got {type(value).__name__}: {node}")
        return value.elements

    def _scalar(self, node: pp.Expr, t: float) -> float:
        value = self._eval(node, t)
        if not isinstance(value, Scalar):
            raise PromQLError(f"expected a scalar, got {type(value).__name__}: {node}")
        return value.value

    def _string(self, node: pp.Expr, t: float) -> str:
        value = self._eval(node, t)
        if not isinstance(value, String):
            raise PromQLError(f"expected a string, got {type(value).__name__}: {node}")
        return value.value

    # ---------------------------------------------------------------------------- selectors

    def _selected(
        self, vs: pp.VectorSelector
    ) -> Iterable[tuple[Labels, list[tuple[float, float | None]]]]:
        if vs.at is not None:
            raise Unsupported(f"the @ modifier is not supported: {vs}")
        if vs.matchers.or_matchers:
            raise Unsupported(f"'or' inside a selector's braces is not supported: {vs}")
        tests = [_matcher(m) for m in vs.matchers.matchers]
        if vs.name:
            tests.append(_equal(METRIC_NAME, vs.name))
        for labels, points in self.store.series():
            metric = dict(labels)
            if all(test(metric) for test in tests):
                yield labels, [(p.t, p.value) for p in points]

    def _instant(self, vs: pp.VectorSelector, t: float) -> list[Element]:
        at = t - _seconds(vs.offset)
        out = []
        for labels, points in self._selected(vs):
            # the newest point in the lookback window; a staleness marker hides the series
            newest = [v for pt, v in points if at - self.lookback < pt <= at]
            latest = newest[-1] if newest else None
            if latest is not None:
                out.append(Element(labels, latest))
        return out

    def _range(self, ms: pp.MatrixSelector, t: float) -> list[RangeSeries]:
        vs = ms.vector_selector
        end = t - _seconds(vs.offset)
        start = end - _seconds(ms.range)
        out = []
        for labels, points in self._selected(vs):
            window = [(pt, v) for pt, v in points if start < pt <= end and v is not None]
            if window:
                out.append(RangeSeries(labels, window))
        return out

    # ---------------------------------------------------------------------------- functions

    def _call(self, node: pp.Call, t: float) -> Value:
        name = node.func.name
        args = list(node.args)
        if name in _RANGE_FUNCTIONS:
            (arg,) = args
            if not isinstance(arg, pp.MatrixSelector):
                raise Unsupported(f"{name}() over a subquery or expression: {node}")
            return InstantVector(self._over_range(name, arg, t))
        if name == "absent":
            elements = self._instant_vector(args[0], t)
            return InstantVector([] if elements else [Element(_absent_labels(args[0]), 1.0)])
        if name == "absent_over_time":
            (arg,) = args
            if not isinstance(arg, pp.MatrixSelector):
                raise Unsupported(f"absent_over_time() over a subquery: {node}")
            found = self._range(arg, t)
            return InstantVector(
                [] if found else [Element(_absent_labels(arg.vector_selector), 1.0)]
            )
        if name == "histogram_quantile":
            q = self._scalar(args[0], t)
            return InstantVector(_histogram_quantile(q, self._instant_vector(args[1], t)))
        if name in _ELEMENTWISE:
            fn = _ELEMENTWISE[name]
            return _map(self._instant_vector(args[0], t), fn)
        if name == "clamp_min":
            low = self._scalar(args[1], t)
            return _map(self._instant_vector(args[0], t), lambda v: max(v, low))
        if name == "clamp_max":
            high = self._scalar(args[1], t)
            return _map(self._instant_vector(args[0], t), lambda v: min(v, high))
        if name == "clamp":
            low, high = self._scalar(args[1], t), self._scalar(args[2], t)
            if low > high:
                return InstantVector([])
            return _map(self._instant_vector(args[0], t), lambda v: max(low, min(v, high)))
        if name == "time":
            return Scalar(t)
        if name == "vector":
            return InstantVector([Element((), self._scalar(args[0], t))])
        if name == "scalar":
            elements = self._instant_vector(args[0], t)
            return Scalar(elements[0].value if len(elements) == 1 else math.nan)
        if name == "timestamp":
            return self._timestamp(args[0], t)
        raise Unsupported(f"function {name}() is not supported: {node}")

    def _timestamp(self, arg: pp.Expr, t: float) -> InstantVector:
        if not isinstance(arg, pp.VectorSelector):  # of a computed vector: evaluation time
            return _map(self._instant_vector(arg, t), lambda _v: t)
        at = t - _seconds(arg.offset)
        out = []
        for labels, points in self._selected(arg):
            newest = [(pt, v) for pt, v in points if at - self.lookback < pt <= at]
            if newest and newest[-1][1] is not None:
                out.append(Element(_drop_name(labels), newest[-1][0]))
        return InstantVector(out)

    def _over_range(self, name: str, ms: pp.MatrixSelector, t: float) -> list[Element]:
        end = t - _seconds(ms.vector_selector.offset)
        start = end - _seconds(ms.range)
        out = []
        for series in self._range(ms, t):
            value = _RANGE_FUNCTIONS[name](series.points, start, end)
            if value is not None:
                keep_name = name == "last_over_time"
                out.append(
                    Element(series.labels if keep_name else _drop_name(series.labels), value)
                )
        return out

    # -------------------------------------------------------------------------- aggregation

    def _aggregate(self, node: pp.AggregateExpr, t: float) -> InstantVector:
        op = str(node.op)
        elements = self._instant_vector(node.expr, t)
        modifier = node.modifier
        by = modifier is None or modifier.type == pp.AggModifierType.By
        names = set(modifier.labels) if modifier is not None else set()

        def key(labels: Labels) -> Labels:
            if by:
                return tuple((k, v) for k, v in labels if k in names)
            return tuple((k, v) for k, v in labels if k not in names and k != METRIC_NAME)

        groups: dict[Labels, list[Element]] = {}
        for element in elements:
            groups.setdefault(key(element.labels), []).append(element)
        if op in ("topk", "bottomk"):
            if node.param is None:
                raise PromQLError(f"{op} needs a parameter: {node}")
            k = int(self._scalar(node.param, t))
            out: list[Element] = []
            for members in groups.values():
                ranked = sorted(
                    (e for e in members if not math.isnan(e.value)),
                    key=lambda e: e.value,
                    reverse=op == "topk",
                )
                out.extend(ranked[: max(k, 0)])
            return InstantVector(out)
        reduce = _AGGREGATIONS.get(op)
        if reduce is None:
            raise Unsupported(f"aggregation {op} is not supported: {node}")
        return InstantVector(
            [
                Element(group, reduce([e.value for e in members]))
                for group, members in groups.items()
            ]
        )

    # ------------------------------------------------------------------------ binary ops

    def _binary(self, node: pp.BinaryExpr, t: float) -> Value:
        op = str(node.op)
        lhs, rhs = self._eval(node.lhs, t), self._eval(node.rhs, t)
        modifier = node.modifier
        return_bool = bool(modifier is not None and modifier.return_bool)
        if op in _SET_OPS:
            if not (isinstance(lhs, InstantVector) and isinstance(rhs, InstantVector)):
                raise PromQLError(f"{op} needs instant vectors on both sides: {node}")
            return InstantVector(_set_op(op, lhs.elements, rhs.elements, _Matching.of(modifier)))
        if op not in _ARITHMETIC and op not in _COMPARISON:
            raise Unsupported(f"operator {op} is not supported: {node}")
        if isinstance(lhs, Scalar) and isinstance(rhs, Scalar):
            if op in _COMPARISON:
                if not return_bool:
                    raise PromQLError(f"comparisons between scalars need bool: {node}")
                return Scalar(float(_COMPARISON[op](lhs.value, rhs.value)))
            return Scalar(_ARITHMETIC[op](lhs.value, rhs.value))
        if isinstance(lhs, InstantVector) and isinstance(rhs, Scalar):
            return InstantVector(_vector_scalar(op, lhs.elements, rhs.value, False, return_bool))
        if isinstance(lhs, Scalar) and isinstance(rhs, InstantVector):
            return InstantVector(_vector_scalar(op, rhs.elements, lhs.value, True, return_bool))
        if isinstance(lhs, InstantVector) and isinstance(rhs, InstantVector):
            return InstantVector(
                _vector_vector(op, lhs.elements, rhs.elements, _Matching.of(modifier), return_bool)
            )
        raise PromQLError(f"{op} between {type(lhs).__name__} and {type(rhs).__name__}: {node}")


# ------------------------------------------------------------------------------ matchers


def _seconds(delta: timedelta | None) -> float:
    return delta.total_seconds() if delta is not None else 0.0


def _equal(name: str, value: str) -> Callable[[dict[str, str]], bool]:
    return lambda metric: metric.get(name, "") == value


def _matcher(m: pp.Matcher) -> Callable[[dict[str, str]], bool]:
    name, value = m.name, m.value
    if m.op == pp.MatchOp.Equal:
        return _equal(name, value)
    if m.op == pp.MatchOp.NotEqual:
        return lambda metric: metric.get(name, "") != value
    pattern = re.compile(value)  # fully anchored, as Prometheus anchors its regexes
    if m.op == pp.MatchOp.Re:
        return lambda metric: pattern.fullmatch(metric.get(name, "")) is not None
    if m.op == pp.MatchOp.NotRe:
        return lambda metric: pattern.fullmatch(metric.get(name, "")) is None
    raise Unsupported(f"matcher {m}")


def _absent_labels(node: pp.Expr) -> Labels:
    """``absent()``'s labels: the selector's equality matchers, unless a name is matched
    twice (then Prometheus cannot tell which value to report)."""
    if not isinstance(node, pp.VectorSelector):
        return ()
    found: dict[str, str] = {}
    twice: set[str] = set()
    for m in node.matchers.matchers:
        if m.op != pp.MatchOp.Equal or m.name == METRIC_NAME:
            continue
        if m.name in found:
            twice.add(m.name)
        found[m.name] = m.value
    return tuple(sorted((k, v) for k, v in found.items() if k not in twice and v != ""))


def _drop_name(labels: Labels) -> Labels:
    return tuple((k, v) for k, v in labels if k != METRIC_NAME)


def _map(elements: list[Element], fn: Callable[[float], float]) -> InstantVector:
    return InstantVector([Element(_drop_name(e.labels), fn(e.value)) for e in elements])


def _negate(value: Value) -> Value:
    if isinstance(value, Scalar):
        return Scalar(-value.value)
    if isinstance(value, InstantVector):
        return _map(value.elements, lambda v: -v)
    raise PromQLError(f"unary minus on a {type(value).__name__}")


# ---------------------------------------------------------------------- range functions

Points = list[tuple[float, float]]


def _extrapolated(
    points: Points, start: float, end: float, counter: bool, rate: bool
) -> float | None:
    """Prometheus's ``extrapolatedRate``: the change over the samples, counter resets added
    back, extrapolated towards the window's edges (all the way when a sample is within 1.1
    average intervals of the edge, else half an interval; never below a counter's zero)."""
    if len(points) < 2:
        return None
    first_t, first_v = points[0]
    last_t, last_v = points[-1]
    result = last_v - first_v
    if counter:
        previous = first_v
        for _t, value in points[1:]:
            if value < previous:
                result += previous
            previous = value
    sampled = last_t - first_t
    average = sampled / (len(points) - 1)
    threshold = average * 1.1
    to_start, to_end = first_t - start, end - last_t
    if to_start >= threshold:
        to_start = average / 2
    if counter and result > 0 and first_v >= 0:
        to_start = min(to_start, sampled * (first_v / result))
    if to_end >= threshold:
        to_end = average / 2
    factor = (sampled + to_start + to_end) / sampled
    if rate:
        factor /= end - start
    return result * factor


def _instant_rate(points: Points, is_rate: bool) -> float | None:
    if len(points) < 2:
        return None
    (t0, v0), (t1, v1) = points[-2], points[-1]
    change = v1 if is_rate and v1 < v0 else v1 - v0  # irate: a reset starts from zero
    if not is_rate:
        return change
    return change / (t1 - t0) if t1 > t0 else None


def _changes(points: Points) -> float:
    return float(
        sum(
            1
            for (_a, x), (_b, y) in pairwise(points)
            if x != y and not (math.isnan(x) and math.isnan(y))
        )
    )


def _resets(points: Points) -> float:
    return float(sum(1 for (_a, x), (_b, y) in pairwise(points) if y < x))


RangeFunction = Callable[[Points, float, float], float | None]

_RANGE_FUNCTIONS: dict[str, RangeFunction] = {
    "rate": lambda p, s, e: _extrapolated(p, s, e, counter=True, rate=True),
    "increase": lambda p, s, e: _extrapolated(p, s, e, counter=True, rate=False),
    "delta": lambda p, s, e: _extrapolated(p, s, e, counter=False, rate=False),
    "irate": lambda p, _s, _e: _instant_rate(p, True),
    "idelta": lambda p, _s, _e: _instant_rate(p, False),
    "changes": lambda p, _s, _e: _changes(p),
    "resets": lambda p, _s, _e: _resets(p),
    "avg_over_time": lambda p, _s, _e: sum(v for _t, v in p) / len(p),
    "min_over_time": lambda p, _s, _e: _min([v for _t, v in p]),
    "max_over_time": lambda p, _s, _e: _max([v for _t, v in p]),
    "sum_over_time": lambda p, _s, _e: sum(v for _t, v in p),
    "count_over_time": lambda p, _s, _e: float(len(p)),
    "last_over_time": lambda p, _s, _e: p[-1][1],
    "present_over_time": lambda _p, _s, _e: 1.0,
}


# ----------------------------------------------------------------- instant functions


_ELEMENTWISE: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "ceil": lambda v: float(math.ceil(v)) if math.isfinite(v) else v,
    "floor": lambda v: float(math.floor(v)) if math.isfinite(v) else v,
}


def _histogram_quantile(q: float, elements: list[Element]) -> list[Element]:
    """Prometheus's ``bucketQuantile`` over classic ``le`` buckets, per label set without
    ``le`` and the metric name."""
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for e in elements:
        metric = e.metric
        le = metric.get("le")
        if le is None:
            continue  # not a bucket: Prometheus ignores it (with a warning)
        try:
            bound = float(le)
        except ValueError:
            continue
        key = tuple((k, v) for k, v in e.labels if k not in ("le", METRIC_NAME))
        groups.setdefault(key, []).append((bound, e.value))
    return [Element(key, _bucket_quantile(q, buckets)) for key, buckets in groups.items()]


def _bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets)
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    merged: list[tuple[float, float]] = []  # equal bounds summed (Prometheus coalesces them)
    for bound, count in buckets:
        if merged and merged[-1][0] == bound:
            merged[-1] = (bound, merged[-1][1] + count)
        else:
            merged.append((bound, count))
    monotonic: list[tuple[float, float]] = []  # counts made non-decreasing
    for bound, count in merged:
        prev = monotonic[-1][1] if monotonic else count
        monotonic.append((bound, max(count, prev)))
    if len(monotonic) < 2:
        return math.nan
    observations = monotonic[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next(i for i, (_bound, count) in enumerate(monotonic) if count >= rank)
    if b == len(monotonic) - 1:
        return monotonic[-2][0]
    if b == 0 and monotonic[0][0] <= 0:
        return monotonic[0][0]
    start, end, count = 0.0, monotonic[b][0], monotonic[b][1]
    if b > 0:
        start = monotonic[b - 1][0]
        count -= monotonic[b - 1][1]
        rank -= monotonic[b - 1][1]
    return start + (end - start) * (rank / count)


# ---------------------------------------------------------------------- aggregations


def _min(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return min(real) if real else math.nan


def _max(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return max(real) if real else math.nan


_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": lambda vs: float(sum(vs)),
    "avg": lambda vs: float(sum(vs)) / len(vs),
    "min": _min,
    "max": _max,
    "count": lambda vs: float(len(vs)),
    "group": lambda _vs: 1.0,
}


# ------------------------------------------------------------------------ binary ops


def _divide(a: float, b: float) -> float:
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def _modulo(a: float, b: float) -> float:
    return math.nan if b == 0 else math.fmod(a, b)


def _power(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:
        return math.inf
    except ValueError:
        return math.nan


_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": _divide,
    "%": _modulo,
    "^": _power,
    "atan2": math.atan2,
}

_COMPARISON: dict[str, Callable[[float, float], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
}

_SET_OPS = ("and", "or", "unless")


def _operate(op: str, left: float, right: float) -> tuple[float, bool]:
    """(value, keep): arithmetic always keeps; a comparison keeps the left value if true."""
    if op in _ARITHMETIC:
        return _ARITHMETIC[op](left, right), True
    return left, _COMPARISON[op](left, right)


def _vector_scalar(
    op: str, elements: list[Element], scalar: float, scalar_left: bool, return_bool: bool
) -> list[Element]:
    out = []
    for e in elements:
        left, right = (scalar, e.value) if scalar_left else (e.value, scalar)
        value, keep = _operate(op, left, right)
        if op in _COMPARISON:
            value = e.value  # the vector's value, whichever side the scalar is on
            if return_bool:
                value, keep = float(keep), True
        if not keep:
            continue
        drop = op in _ARITHMETIC or return_bool
        out.append(Element(_drop_name(e.labels) if drop else e.labels, value))
    return out


@dataclass(frozen=True)
class _Matching:
    on: bool
    names: tuple[str, ...]
    card: str  # "one-to-one", "many-to-one", "one-to-many", "many-to-many"
    include: tuple[str, ...]

    @staticmethod
    def of(modifier: pp.BinModifier | None) -> _Matching:
        if modifier is None:
            return _Matching(False, (), "one-to-one", ())
        matching = modifier.matching
        on = matching is not None and matching.type == pp.LabelModifierType.Include
        names = tuple(matching.labels) if matching is not None else ()
        cards = (
            (pp.VectorMatchCardinality.OneToOne, "one-to-one"),
            (pp.VectorMatchCardinality.ManyToOne, "many-to-one"),
            (pp.VectorMatchCardinality.OneToMany, "one-to-many"),
            (pp.VectorMatchCardinality.ManyToMany, "many-to-many"),
        )  # the parser's enum does not hash
        card = next(name for kind, name in cards if modifier.card == kind)
        include = tuple(modifier.group_labels or ())
        return _Matching(on, names, card, include)

    def signature(self, labels: Labels) -> Labels:
        if self.on:
            return tuple((k, v) for k, v in labels if k in self.names)
        return tuple((k, v) for k, v in labels if k not in self.names and k != METRIC_NAME)


def _set_op(op: str, lhs: list[Element], rhs: list[Element], m: _Matching) -> list[Element]:
    right = {m.signature(e.labels) for e in rhs}
    if op == "and":
        return [e for e in lhs if m.signature(e.labels) in right]
    if op == "unless":
        return [e for e in lhs if m.signature(e.labels) not in right]
    left = {m.signature(e.labels) for e in lhs}
    return lhs + [e for e in rhs if m.signature(e.labels) not in left]


def _vector_vector(
    op: str, lhs: list[Element], rhs: list[Element], m: _Matching, return_bool: bool
) -> list[Element]:
    """Prometheus's ``VectorBinop``: the "one" side indexed by signature, each element of
    the other side matched against it."""
    many, one = (rhs, lhs) if m.card == "one-to-many" else (lhs, rhs)
    index: dict[Labels, Element] = {}
    for e in one:
        sig = m.signature(e.labels)
        if sig in index:
            side = "left" if m.card == "one-to-many" else "right"
            raise PromQLError(
                f"found duplicate series for the match group {dict(sig)} on the {side} "
                "hand-side of the operation: many-to-many matching not allowed"
            )
        index[sig] = e
    out: list[Element] = []
    matched: set[Labels] = set()
    results: set[Labels] = set()
    for e in many:
        sig = m.signature(e.labels)
        other = index.get(sig)
        if other is None:
            continue
        left, right = (other, e) if m.card == "one-to-many" else (e, other)
        value, keep = _operate(op, left.value, right.value)
        if return_bool:
            value, keep = float(keep), True
        if not keep:
            continue
        labels = _result_labels(e.labels, other.labels, op, m, return_bool)
        if m.card == "one-to-one":
            if sig in matched:
                raise PromQLError(
                    f"multiple matches for labels {dict(sig)}: many-to-one matching must be "
                    "explicit (group_left/group_right)"
                )
            matched.add(sig)
        elif labels in results:
            raise PromQLError(f"multiple matches for labels {dict(labels)}: same result labels")
        results.add(labels)
        out.append(Element(labels, value))
    return out


def _result_labels(many: Labels, one: Labels, op: str, m: _Matching, return_bool: bool) -> Labels:
    """Prometheus's ``resultMetric``: the "many" side's labels, without the name after
    arithmetic or ``bool``, reduced to the matching labels for one-to-one, plus the
    ``group_*`` labels copied from the "one" side."""
    metric = dict(many)
    if op in _ARITHMETIC or return_bool:
        metric.pop(METRIC_NAME, None)
    if m.card == "one-to-one":
        if m.on:
            metric = {k: v for k, v in metric.items() if k in m.names}
        else:
            metric = {k: v for k, v in metric.items() if k not in m.names}
    one_metric = dict(one)
    for name in m.include:
        if one_metric.get(name, ""):
            metric[name] = one_metric[name]
        else:
            metric.pop(name, None)
    return tuple(sorted(metric.items()))
