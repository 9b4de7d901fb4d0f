"""One configuration of a reproduction, as the plans of `fedrec.reproduce.runner` (and the
papers' own plan modules, `fedrec.reproduce.personalfr`) list them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PlannedRun:
    """One configuration of a reproduction (repeated over seeds and negative policies).

    ``model`` and ``engine`` are extra model and engine options as ``(name, value)`` pairs (a
    tuple, so that runs stay hashable and shared runs are found by equality). They are not part
    of the file name: a run that sets any must say so in its ``setting``, unless every run of its
    name has them (a paper's protocol for the row, as FedCIA's stopping rule); a kept file made
    before such an option changed is reported when reused (`config_changes`).
    """

    method: str
    algorithm: str
    dual: bool = False
    protocol: str = "loo-sampled"
    setting: str = ""
    ldp: float = 0.0
    model: tuple[tuple[str, object], ...] = ()
    engine: tuple[tuple[str, object], ...] = ()

    def file_name(self, negatives: str, seed: int) -> str:
        setting = f"-{self.setting}" if self.setting else ""
        return f"{self.method}{setting}-{self.protocol}-{negatives}-s{seed}.json"
