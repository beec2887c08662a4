"""Thresholds of the nightly report: limits per metric, optionally per workload and position.

The defaults live in ``thresholds.toml`` beside this module (the same text as
``examples/thresholds.toml``); a user file given with ``--thresholds`` is merged
over them key by key, so it only lists what it changes.  See that file for the
meaning of every key.

>>> th = load_thresholds()
>>> rule, in_scope = th.rule("debiased_ece", workload="*", position=3)
>>> rule.max, rule.gate, in_scope
(0.05, 'fail', True)
>>> th.rule("debiased_ece", workload="poetry", position=3)[1]   # aggregate scope: per-workload rows warn
False
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

from dspark_obs.report.metrics import METRICS

__all__ = ["Rule", "Override", "Thresholds", "load_thresholds", "default_text", "ThresholdsError",
           "LABEL_CHOICES", "GATES", "BASES", "SCOPES"]

LABEL_CHOICES = ("best", "companion", "reconstructed", "observed")
GATES = ("fail", "warn", "off")
BASES = ("point", "ci")
SCOPES = ("aggregate", "each")
_BINNINGS = ("width15", "width20", "mass15")
_RULE_KEYS = ("max", "min", "basis", "gate", "scope", "min_n", "drift", "drift_min_delta")
_OVERRIDE_KEYS = ("workload", "position", *_RULE_KEYS)


class ThresholdsError(ValueError):
    """The thresholds file is unreadable or invalid; the message names the key and the fix."""


@dataclass(frozen=True)
class Rule:
    """The limit and gating of one metric (for one workload/position after overrides)."""

    max: float | None = None
    min: float | None = None
    basis: str = "point"
    gate: str = "fail"
    scope: str = "aggregate"
    min_n: int = 0
    drift: str = "off"
    drift_min_delta: float = 0.0

    @property
    def has_limit(self) -> bool:
        return self.max is not None or self.min is not None


@dataclass(frozen=True)
class Override:
    workload: str | None
    position: int | None
    values: dict[str, Any]

    def matches(self, workload: str | None, position: int | None) -> bool:
        return ((self.workload is None or self.workload == workload)
                and (self.position is None or self.position == position))

    @property
    def specificity(self) -> int:
        return (self.workload is not None) * 2 + (self.position is not None)


@dataclass(frozen=True)
class Thresholds:
    """Parsed thresholds; :meth:`rule` resolves the rule of one figure."""

    source: str
    labels: str = "best"
    binning: str = "width15"
    n_bootstrap: int = 1000
    seed: int = 0
    fdr: float = 0.05
    rules: dict[str, Rule] = field(default_factory=dict)
    overrides: dict[str, tuple[Override, ...]] = field(default_factory=dict)

    def rule(self, metric: str, *, workload: str | None = None, position: int | None = None) -> tuple[Rule, bool]:
        """``(rule, in_scope)`` for one figure: the metric's rule with matching overrides applied.

        ``in_scope`` is True when breaches of the rule count with its ``gate``:
        per-run figures and the all-workloads rows always, each workload's rows
        under ``scope = "each"`` or when an override names the workload.
        """
        base = self.rules.get(metric, Rule())
        matched = sorted((o for o in self.overrides.get(metric, ()) if o.matches(workload, position)),
                         key=lambda o: o.specificity)
        for o in matched:
            base = replace(base, **o.values)
        in_scope = (workload in (None, "*") or base.scope == "each"
                    or any(o.workload is not None for o in matched))
        return base, in_scope

    def with_overrides(self, **changes: Any) -> "Thresholds":
        """A copy with report-level settings changed (e.g. ``n_bootstrap`` from the command line)."""
        return replace(self, **changes)


def default_text() -> str:
    """The text of the packaged defaults (``thresholds.toml``)."""
    return resources.files("dspark_obs.report").joinpath("thresholds.toml").read_text(encoding="utf-8")


def load_thresholds(path: str | Path | None = None) -> Thresholds:
    """The defaults, with the TOML file at ``path`` merged over them.

    Raises :class:`ThresholdsError` for an unreadable file, invalid TOML, an
    unknown section, metric or key, or a value of the wrong kind.
    """
    defaults = _parse_toml(default_text(), "the packaged defaults")
    merged = _merge(defaults, {})
    source = "defaults"
    if path is not None:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ThresholdsError(f"--thresholds {path}: cannot read it ({exc.strerror or exc}); "
                                  "pass a TOML file like examples/thresholds.toml") from None
        merged = _merge(defaults, _parse_toml(text, str(path)))
        source = str(path)
    return _build(merged, source)


def _parse_toml(text: str, where: str) -> dict:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ThresholdsError(f"{where}: not valid TOML ({exc})") from None


def _merge(defaults: dict, user: dict) -> dict:
    unknown = set(user) - {"version", "report", "drift", "metrics"}
    if unknown:
        raise ThresholdsError(f"unknown top-level keys {sorted(unknown)}; allowed: version, report, drift, metrics")
    if user.get("version", 1) != 1:
        raise ThresholdsError(f"thresholds version {user.get('version')!r} is not supported; this dspark-obs "
                              "reads version = 1")
    out = {"report": {**defaults.get("report", {}), **_table(user, "report")},
           "drift": {**defaults.get("drift", {}), **_table(user, "drift")},
           "metrics": {}}
    user_metrics = _table(user, "metrics")
    unknown = set(user_metrics) - set(METRICS)
    if unknown:
        raise ThresholdsError(f"unknown metrics {sorted(unknown)} in [metrics]; known: {', '.join(METRICS)}")
    for name in METRICS:
        base = dict(defaults.get("metrics", {}).get(name, {}))
        mine = _table(user_metrics, name)
        if "override" in mine:
            base.pop("override", None)
        if ("max" in mine or "min" in mine) and not ("max" in mine and "min" in mine):
            base.pop("max", None)  # a user limit replaces the default limit, whichever side it is on
            base.pop("min", None)
        out["metrics"][name] = {**base, **mine}
    return out


def _table(d: dict, key: str) -> dict:
    value = d.get(key, {})
    if not isinstance(value, dict):
        raise ThresholdsError(f"[{key}] must be a table, got {type(value).__name__} {value!r}")
    return value


def _number(value: Any, where: str, *, integer: bool = False, minimum: float | None = None) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value):
        raise ThresholdsError(f"{where} must be {'an integer' if integer else 'a number'}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ThresholdsError(f"{where} must be >= {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def _choice(value: Any, where: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ThresholdsError(f"{where} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _rule_values(raw: dict, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    unknown = set(raw) - set(keys) - {"override"}
    if unknown:
        raise ThresholdsError(f"{where}: unknown keys {sorted(unknown)}; allowed: {', '.join(keys)}")
    out: dict[str, Any] = {}
    for key in ("max", "min", "drift_min_delta"):
        if key in raw:
            out[key] = _number(raw[key], f"{where}.{key}", minimum=0.0 if key == "drift_min_delta" else None)
    if "min_n" in raw:
        out["min_n"] = _number(raw["min_n"], f"{where}.min_n", integer=True, minimum=0)
    for key, allowed in (("basis", BASES), ("gate", GATES), ("scope", SCOPES), ("drift", GATES)):
        if key in raw:
            out[key] = _choice(raw[key], f"{where}.{key}", allowed)
    if "max" in out and "min" in out and out["min"] > out["max"]:
        raise ThresholdsError(f"{where}: min {out['min']:g} is above max {out['max']:g}")
    return out


def _build(merged: dict, source: str) -> Thresholds:
    report, drift = merged["report"], merged["drift"]
    unknown = set(report) - {"labels", "binning", "n_bootstrap", "seed"}
    if unknown:
        raise ThresholdsError(f"[report]: unknown keys {sorted(unknown)}; allowed: labels, binning, n_bootstrap, seed")
    if set(drift) - {"fdr"}:
        raise ThresholdsError(f"[drift]: unknown keys {sorted(set(drift) - {'fdr'})}; allowed: fdr")
    fdr = _number(drift.get("fdr", 0.05), "[drift].fdr")
    if not 0 < fdr < 1:
        raise ThresholdsError(f"[drift].fdr must be in (0, 1), got {fdr!r}")
    rules, overrides = {}, {}
    for name, raw in merged["metrics"].items():
        where = f"[metrics.{name}]"
        rules[name] = Rule(**_rule_values(raw, where, _RULE_KEYS))
        items = raw.get("override", [])
        if not isinstance(items, list):
            raise ThresholdsError(f"{where}.override must be an array of tables ([[metrics.{name}.override]])")
        parsed = []
        for i, item in enumerate(items):
            w = f"[[metrics.{name}.override]] #{i + 1}"
            if not isinstance(item, dict):
                raise ThresholdsError(f"{w} must be a table")
            workload = item.get("workload")
            if workload is not None and not isinstance(workload, str):
                raise ThresholdsError(f"{w}.workload must be a string, got {workload!r}")
            position = item.get("position")
            if position is not None:
                position = _number(position, f"{w}.position", integer=True, minimum=1)
            if workload is None and position is None:
                raise ThresholdsError(f"{w} names neither a workload nor a position; set the metric's own keys "
                                      "instead")
            values = _rule_values({k: v for k, v in item.items() if k not in ("workload", "position")}, w,
                                  _RULE_KEYS)
            parsed.append(Override(workload, position, values))
        overrides[name] = tuple(parsed)
    return Thresholds(
        source=source,
        labels=_choice(report.get("labels", "best"), "[report].labels", LABEL_CHOICES),
        binning=_choice(report.get("binning", "width15"), "[report].binning", _BINNINGS),
        n_bootstrap=_number(report.get("n_bootstrap", 1000), "[report].n_bootstrap", integer=True, minimum=50),
        seed=_number(report.get("seed", 0), "[report].seed", integer=True, minimum=0),
        fdr=fdr, rules=rules, overrides=overrides)
