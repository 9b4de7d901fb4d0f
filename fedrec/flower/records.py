"""fedrec's messages and run options as Flower records.

A role's message is a flat dict of numpy arrays and scalars: arrays go into one `ArrayRecord`,
scalars into one `ConfigRecord`, so a message is what it carries and nothing else. The run's
options travel as one JSON string in Flower's run config (key ``fedrec``), which the ServerApp
and every ClientApp read the same way.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig

RUN_KEY = "fedrec"


def to_record(payload: dict[str, Any]) -> RecordDict:
    arrays = {k: Array(np.ascontiguousarray(v)) for k, v in payload.items() if isinstance(v, np.ndarray)}
    scalars = {k: _scalar(v) for k, v in payload.items() if not isinstance(v, np.ndarray)}
    return RecordDict({"arrays": ArrayRecord(arrays), "scalars": ConfigRecord(scalars)})


def from_record(content: RecordDict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "arrays" in content:
        out.update({k: v.numpy() for k, v in content["arrays"].items()})
    if "scalars" in content:
        out.update(dict(content["scalars"]))
    return out


def _scalar(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, (bool, int, float, str, bytes)):
        return v
    raise TypeError(f"cannot send {type(v).__name__} in a message")


def run_to_json(run: RunConfig) -> str:
    return json.dumps(asdict(run), sort_keys=True)


def run_from_json(text: str) -> RunConfig:
    """The `RunConfig` a run config's ``fedrec`` entry holds (unknown keys are an error)."""
    try:
        return RunConfig.from_dict(json.loads(text))
    except FedrecError as e:
        raise FedrecError(f"the run config's '{RUN_KEY}' entry is not a fedrec run: {e}") from e
