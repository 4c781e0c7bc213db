"""What the doctor hands back: a `Finding` per measurement and the `Report` that collects them.

A check has a status ('pass' | 'warn' | 'fail' | 'skip'), a one-line summary with the measured
numbers, and when it does not pass the symptom it shows (a key of
`jaxdl.doctor.diagnoses.SYMPTOMS`) and the most likely cause (a key of `CAUSES`) judged from the
evidence the check gathered.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

STATUSES = ("pass", "warn", "fail", "skip")
_MARK = {"pass": "ok  ", "warn": "WARN", "fail": "FAIL", "skip": "skip"}


@dataclasses.dataclass
class Finding:
  """One measurement: `status`, `summary`, and for a problem its `symptom` and `cause` keys."""
  name: str
  status: str
  summary: str
  symptom: str = ""
  cause: str = ""
  causes: tuple[str, ...] = ()       # likely causes, most likely first (text)
  details: str = ""                  # a table or trace shown under the summary
  values: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.status not in STATUSES:
      raise ValueError(f"check status: {self.status!r}; expected one of {STATUSES}")


@dataclasses.dataclass
class Report:
  """The checks of one preflight, in the order they ran."""
  experiment: str
  checks: list[Finding] = dataclasses.field(default_factory=list)

  def add(self, check: Finding) -> Finding:
    self.checks.append(check)
    return check

  def __getitem__(self, name: str) -> Finding:
    for c in self.checks:
      if c.name == name:
        return c
    raise KeyError(f"no check named {name!r}; checks: {[c.name for c in self.checks]}")

  @property
  def ok(self) -> bool:
    """True when no check failed (warnings allowed)."""
    return all(c.status != "fail" for c in self.checks)

  def failed(self) -> list[Finding]:
    return [c for c in self.checks if c.status == "fail"]

  def causes(self) -> list[str]:
    """Cause keys of the failed checks, then of the warnings, without repeats."""
    out: list[str] = []
    for status in ("fail", "warn"):
      for c in self.checks:
        if c.status == status and c.cause and c.cause not in out:
          out.append(c.cause)
    return out

  def text(self, verbose: bool = False) -> str:
    """One line per check, causes and first checks under problems; tables when `verbose`."""
    from jaxdl.doctor.diagnoses import CAUSES, SYMPTOMS
    lines = [f"jaxdl doctor: {self.experiment}"]
    for c in self.checks:
      lines.append(f"[{_MARK[c.status]}] {c.name:<16} {c.summary}")
      if c.status in ("fail", "warn") and c.cause:
        lines.append(f"       likely cause: {CAUSES.get(c.cause, c.cause)}")
      if c.status in ("fail", "warn"):
        for cause in c.causes:
          lines.append(f"       - {cause}")
        if c.symptom in SYMPTOMS:
          lines.append(f"       first checks: {SYMPTOMS[c.symptom].first_checks}")
      if c.details and (verbose or c.status in ("fail", "warn")):
        lines += ["       " + line for line in c.details.splitlines()]
    verdict = ("passed" if self.ok else
               f"FAILED ({', '.join(c.name for c in self.failed())})")
    if self.causes():
      verdict += "; named causes: " + ", ".join(self.causes())
    lines.append(f"preflight {verdict}")
    return "\n".join(lines)

  def to_dict(self) -> dict:
    def clean(v):
      if isinstance(v, float) and not math.isfinite(v):
        return str(v)
      if isinstance(v, dict):
        return {str(k): clean(x) for k, x in v.items()}
      if isinstance(v, (list, tuple)):
        return [clean(x) for x in v]
      return v
    return {"experiment": self.experiment, "ok": self.ok, "causes": self.causes(),
            "checks": [clean(dataclasses.asdict(c)) for c in self.checks]}

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), indent=2)
