"""A tiny PromQL evaluator: the subset deploy/k8s/monitoring/prometheus-rule.yaml uses.

No promtool on these machines (nor a Prometheus): this reads the rules' expressions
and evaluates them against scraped exposition text, so a test can say "this alert
fires with a worker killed and clears after its replacement". Supported:

- selectors ``name{label="v", label!="v", label=~"re", label!~"re"}``; number literals;
- ``increase(sel[5m])`` and ``rate(sel[5m])`` over a history of scrapes (no
  extrapolation; counter resets handled);
- ``sum|max|min|count by (labels) (expr)`` and ``... without`` is not supported;
- ``+ - * /``, comparisons ``== != > < >= <=`` (filters, as without ``bool``),
  ``and`` / ``unless``: vectors match one-to-one on their whole label sets (so
  both sides are aggregated by the same labels in the rules).

Anything else raises ``SyntaxError`` naming what came: a rule using more than this
evaluator knows fails its test instead of passing untested.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
#: One scrape: (time in seconds, {(name, labels): value}).
Scrape = tuple[float, dict[tuple[str, Labels], float]]

_TOKEN = re.compile(r"""\s*(?:(?P<num>\d+(?:\.\d+)?)(?P<unit>[smhd])?(?![\w])
                       |(?P<str>"(?:[^"\\]|\\.)*")
                       |(?P<op>==|!=|>=|<=|=~|!~|[-+*/<>=(){}\[\],])|(?P<name>[a-zA-Z_:][\w:]*))""",
                    re.VERBOSE)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
    ">=": operator.ge, "<=": operator.le}
_ARITH: dict[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_AGGREGATE: dict[str, Callable[[list[float]], float]] = {
    "sum": sum, "max": max, "min": min, "count": lambda v: float(len(v))}


def parse_scrape(text: str, at: float = 0.0) -> Scrape:
    """Exposition text (what GET /metrics serves) as one scrape at time ``at``."""
    samples: dict[tuple[str, Labels], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = float(sample.value)
    return at, samples


def duration(text: str) -> float:
    """``"5m"`` -> 300.0 (one unit only, as the rules write them)."""
    match = re.fullmatch(r"(\d+)([smhd])", text)
    if match is None:
        raise SyntaxError(f"expected a duration such as 5m, got {text!r}")
    return int(match[1]) * _UNITS[match[2]]


@dataclass
class _Tok:
    kind: str
    text: str


def _tokens(expr: str) -> list[_Tok]:
    out, pos = [], 0
    expr = expr.strip()
    while pos < len(expr):
        match = _TOKEN.match(expr, pos)
        if match is None or match.end() == pos:
            raise SyntaxError(f"unexpected {expr[pos:pos + 20]!r} in {expr!r}")
        pos = match.end()
        kind = match.lastgroup if match.lastgroup != "unit" else "num"
        text = match[0].strip()
        out.append(_Tok("dur" if match["unit"] else kind or "", text))
    return out


class Query:
    """A parsed expression; ``query(history)`` evaluates it at the last scrape.

    >>> history = [parse_scrape('up{job="a"} 1\\nup{job="b"} 0\\n')]
    >>> Query('sum by (job) (up) == 0')(history)
    {frozenset({('job', 'b')}): 0.0}
    """

    def __init__(self, expr: str) -> None:
        self.expr = expr
        self._toks = _tokens(expr)
        self._pos = 0
        self._tree = self._logical()
        if self._pos != len(self._toks):
            raise SyntaxError(f"unexpected {self._toks[self._pos].text!r} in {expr!r}")

    def __call__(self, history: list[Scrape]) -> Vector:
        return self._tree(history)

    # -- parsing: each rule returns a function of the history --------------------------
    def _peek(self) -> str:
        return self._toks[self._pos].text if self._pos < len(self._toks) else ""

    def _take(self, expected: str | None = None) -> _Tok:
        if self._pos >= len(self._toks):
            raise SyntaxError(f"{self.expr!r} ends early (expected {expected or 'more'})")
        tok = self._toks[self._pos]
        if expected is not None and tok.text != expected:
            raise SyntaxError(f"expected {expected!r}, got {tok.text!r} in {self.expr!r}")
        self._pos += 1
        return tok

    def _logical(self) -> Callable[[list[Scrape]], Vector]:
        left = self._compare()
        while self._peek() in ("and", "unless"):
            keep = self._take().text == "and"
            right = self._compare()
            left = _set_op(left, right, keep)
        return left

    def _compare(self) -> Callable[[list[Scrape]], Vector]:
        left = self._additive()
        if self._peek() in _COMPARE:
            test = _COMPARE[self._take().text]
            right = self._additive()
            return _binary(left, right, lambda a, b: a if test(a, b) else None)
        return left

    def _additive(self) -> Callable[[list[Scrape]], Vector]:
        left = self._multiplicative()
        while self._peek() in ("+", "-"):
            op = _ARITH[self._take().text]
            left = _binary(left, self._multiplicative(), op, drop_name=True)
        return left

    def _multiplicative(self) -> Callable[[list[Scrape]], Vector]:
        left = self._atom()
        while self._peek() in ("*", "/"):
            op = _ARITH[self._take().text]
            left = _binary(left, self._atom(), op, drop_name=True)
        return left

    def _atom(self) -> Callable[[list[Scrape]], Vector]:
        tok = self._take()
        if tok.text == "(":
            inner = self._logical()
            self._take(")")
            return inner
        if tok.kind == "num":
            value = float(tok.text)
            return lambda history: {_SCALAR: value}
        if tok.kind != "name":
            raise SyntaxError(f"unexpected {tok.text!r} in {self.expr!r}")
        if tok.text in _AGGREGATE:
            return self._aggregation(_AGGREGATE[tok.text])
        if tok.text in ("increase", "rate"):
            return self._range_function(per_second=tok.text == "rate")
        return self._selector(tok.text)

    def _aggregation(self, reduce: Callable[[list[float]], float]
                     ) -> Callable[[list[Scrape]], Vector]:
        by: list[str] = []
        if self._peek() == "by":
            self._take()
            by = self._names()
        self._take("(")
        inner = self._logical()
        self._take(")")

        def evaluate(history: list[Scrape]) -> Vector:
            groups: dict[Labels, list[float]] = {}
            for labels, value in inner(history).items():
                key = frozenset((k, v) for k, v in labels if k in by)
                groups.setdefault(key, []).append(value)
            return {key: reduce(values) for key, values in groups.items()}
        return evaluate

    def _names(self) -> list[str]:
        self._take("(")
        names = []
        while self._peek() != ")":
            names.append(self._take().text)
            if self._peek() == ",":
                self._take()
        self._take(")")
        return names

    def _range_function(self, *, per_second: bool) -> Callable[[list[Scrape]], Vector]:
        self._take("(")
        select = self._matcher(self._take().text)
        self._take("[")
        window = duration(self._take().text)
        self._take("]")
        self._take(")")

        def evaluate(history: list[Scrape]) -> Vector:
            now = history[-1][0]
            inside = [(t, s) for t, s in history if now - t <= window]
            series: dict[Labels, list[float]] = {}
            for _, samples in inside:
                for labels, value in select(samples).items():
                    series.setdefault(labels, []).append(value)
            out = {}
            for labels, values in series.items():
                if len(values) < 2:
                    continue  # as Prometheus: an increase needs two samples
                grown = sum(b - a if b >= a else b for a, b in itertools.pairwise(values))
                out[_without_name(labels)] = grown / window if per_second else grown
            return out
        return evaluate

    def _selector(self, name: str) -> Callable[[list[Scrape]], Vector]:
        select = self._matcher(name)
        return lambda history: select(history[-1][1])

    def _matcher(self, name: str) -> Callable[[dict[tuple[str, Labels], float]], Vector]:
        tests: list[Callable[[dict[str, str]], bool]] = []
        if self._peek() == "{":
            self._take()
            while self._peek() != "}":
                label, op, value = self._take().text, self._take().text, self._take()
                if value.kind != "str" or op not in ("=", "!=", "=~", "!~"):
                    raise SyntaxError(f"unsupported matcher {label}{op}{value.text}")
                tests.append(_label_test(label, op, value.text[1:-1]))
                if self._peek() == ",":
                    self._take()
            self._take("}")

        def select(samples: dict[tuple[str, Labels], float]) -> Vector:
            out = {}
            for (sample_name, labels), value in samples.items():
                if sample_name == name and all(test(dict(labels)) for test in tests):
                    out[labels | {("__name__", name)}] = value
            return out
        return select


_SCALAR: Labels = frozenset({("__scalar__", "")})


def _label_test(label: str, op: str, value: str) -> Callable[[dict[str, str]], bool]:
    if op in ("=~", "!~"):
        pattern = re.compile(value)
        return lambda labels: bool(pattern.fullmatch(labels.get(label, ""))) == (op == "=~")
    return lambda labels: (labels.get(label, "") == value) == (op == "=")


def _without_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


def _binary(left: Callable[[list[Scrape]], Vector], right: Callable[[list[Scrape]], Vector],
            op: Callable[[float, float], float | None], *, drop_name: bool = False
            ) -> Callable[[list[Scrape]], Vector]:
    def evaluate(history: list[Scrape]) -> Vector:
        a, b = left(history), right(history)
        out: Vector = {}
        if _SCALAR in b:  # vector op scalar (or scalar op scalar)
            pairs = [(labels, value, b[_SCALAR]) for labels, value in a.items()]
        elif _SCALAR in a:
            pairs = [(labels, a[_SCALAR], value) for labels, value in b.items()]
        else:
            keyed = {_without_name(labels): value for labels, value in b.items()}
            pairs = [(labels, value, keyed[_without_name(labels)]) for labels, value in a.items()
                     if _without_name(labels) in keyed]
        for labels, x, y in pairs:
            result = op(x, y)
            if result is not None:
                out[_without_name(labels) if drop_name else labels] = result
        return out
    return evaluate


def _set_op(left: Callable[[list[Scrape]], Vector], right: Callable[[list[Scrape]], Vector],
            keep: bool) -> Callable[[list[Scrape]], Vector]:
    def evaluate(history: list[Scrape]) -> Vector:
        others = {_without_name(labels) for labels in right(history)}
        return {labels: value for labels, value in left(history).items()
                if (_without_name(labels) in others) == keep}
    return evaluate


__all__ = ["Query", "Scrape", "duration", "parse_scrape"]
