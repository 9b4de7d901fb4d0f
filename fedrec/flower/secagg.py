"""Secure aggregation (SecAgg+) of the nodes' item-table updates, with Flower's own protocol.

The server learns only the sum of the nodes' dense update tables, never one node's (and, under
fedrec's item-row rules, the sum of their per-row sender counts, by which it divides each row). Both sides
are Flower's code: the server runs the stock `SecAggPlusWorkflow` (key exchange, Shamir shares
of the mask seeds, masked vectors, unmasking, recovery of dropped nodes' masks), the ClientApp
the stock `secaggplus_mod`, which masks what fedrec's train function returns. The workflow
belongs to Flower's legacy Strategy API, so `secure_sum` hands it a `LegacyContext` whose
Strategy gives it fedrec's per-node messages (`configure_fit`) and takes the unmasked result
(`aggregate_fit`). Every node reports weight 1 with ``max_weight`` 1, so the workflow's weighted
mean is the plain mean of the nodes that took part; times their number it is the sum.

What SecAgg+ costs: an update is a dense table (the rows a node touched would tell the server
which items its users train), entries are clipped to ``[-clip, clip]`` and quantised to
``2 clip / quantization`` (fedrec refuses, rather than clips, a table outside the range), and a
round takes four exchanges instead of one. The per-node counts (clients trained, loss, bytes)
travel beside the masked vector in the clear.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from flwr.common import (
    Code,
    EvaluateIns,
    EvaluateRes,
    FitIns,
    FitRes,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server.client_manager import ClientManager
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.strategy import Strategy
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, Key
from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
from flwr.serverapp import Grid

from fedrec.errors import FedrecError

NAMES = "fedrec.names"  # the payload's array names, in the order of FitIns.parameters
#: default bound on an update entry: a node's row-delta sums reach ~2,400 on ML-100K (FedMF,
#: 3 nodes of ~314 users, item rate 13,456); quantised to 2 x 8192 / 2^24 = 1e-3 before the
#: server divides by the clients of the round
RANGE = 8192.0
QUANTIZATION = 2**24


def is_request(msg: Message) -> bool:
    """A message of the SecAgg+ protocol (the stock mod handles it)."""
    return msg.metadata.message_type == "train" and RECORD_KEY_CONFIGS in msg.content.config_records


def client_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """`secaggplus_mod` for SecAgg+ messages only (the stock mod takes every train message)."""
    from flwr.client.mod import secaggplus_mod

    return secaggplus_mod(msg, context, call_next) if is_request(msg) else call_next(msg, context)


def unpack(msg: Message) -> dict[str, Any]:
    """The fedrec payload of a SecAgg+ train message (arrays and scalars)."""
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = dict(fitins.config)
    names = str(config.pop(NAMES)).split(",") if config.get(NAMES) else []
    return {**config, **dict(zip(names, parameters_to_ndarrays(fitins.parameters), strict=True))}


def reply(msg: Message, vectors: list[np.ndarray], counts: dict[str, Any], clip: float) -> Message:
    """The node's masked-vector stage answer: ``vectors`` are masked by the mod, ``counts``
    travel in the clear. A vector outside ``[-clip, clip]`` is refused, not silently clipped."""
    worst = max((float(np.abs(v).max()) for v in vectors if v.size), default=0.0)
    if worst > clip:
        raise FedrecError(f"an update entry reaches {worst:.4g}, outside the SecAgg+ range "
                          f"+-{clip:g}; raise secagg-range")
    fitres = FitRes(status=Status(Code.OK, ""), num_examples=1, metrics=dict(counts),
                    parameters=ndarrays_to_parameters([np.asarray(v, np.float64) for v in vectors]))
    return Message(compat.fitres_to_recorddict(fitres, keep_input=False), reply_to=msg)


class _Proxy(ClientProxy):
    """The workflow reads only a proxy's node id."""

    def __init__(self, node_id: int) -> None:
        super().__init__(str(node_id))
        self.node_id = node_id

    def get_properties(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def get_parameters(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def fit(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def evaluate(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError

    def reconnect(self, *a: Any, **k: Any) -> Any:
        raise NotImplementedError


class _Relay(Strategy):
    """Gives the workflow fedrec's messages and keeps what it aggregates."""

    def __init__(self, fitins: dict[int, FitIns]) -> None:
        self.fitins = fitins
        self.results: list[tuple[ClientProxy, FitRes]] = []
        self.failures: list[Any] = []

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: ClientManager) -> list[tuple[ClientProxy, FitIns]]:
        return [(_Proxy(nid), fi) for nid, fi in self.fitins.items()]

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Any]]:
        self.results, self.failures = results, failures
        return (results[0][1].parameters if results else None), {}

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_evaluate(self, server_round: int, parameters: Parameters,
                           client_manager: ClientManager) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(self, server_round: int, results: list[tuple[ClientProxy, EvaluateRes]],
                           failures: list[Any]) -> tuple[float | None, dict[str, Any]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Any]] | None:
        return None


def secure_sum(grid: Grid, context: Context, payloads: dict[int, dict[str, Any]], r: int, *,
               clip: float, quantization: int = QUANTIZATION, modulus: int = 2**32,
               timeout: float | None = None) -> tuple[list[np.ndarray] | None, dict[int, dict[str, Any]]]:
    """Send each node its payload through SecAgg+; the sum of the vectors of the nodes that
    completed the protocol (None if it halted) and each such node's clear counts."""
    fitins = {}
    for nid, payload in payloads.items():
        names = [k for k, v in payload.items() if isinstance(v, np.ndarray)]
        config = {k: v for k, v in payload.items() if not isinstance(v, np.ndarray)}
        config[NAMES] = ",".join(names)
        fitins[nid] = FitIns(ndarrays_to_parameters([payload[k] for k in names]), config)
    relay = _Relay(fitins)
    legacy = LegacyContext(context, strategy=relay)
    legacy.state[MAIN_CONFIGS_RECORD] = ConfigRecord({Key.CURRENT_ROUND: r})
    legacy.state[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=0.5, max_weight=1.0,
                                  clipping_range=clip, quantization_range=quantization,
                                  modulus_range=modulus, timeout=timeout)
    workflow(grid, legacy)
    if not relay.results:
        return None, {}
    mean = parameters_to_ndarrays(relay.results[0][1].parameters)
    counts = {int(proxy.node_id): dict(res.metrics) for proxy, res in relay.results}
    return [m * len(relay.results) for m in mean], counts
