"""The Flower ServerApp and ClientApp of fedrec (Flower's Message API).

The ClientApp is a node (`fedrec.flower.roles.Node`) rebuilt for each message from the run's options (Flower's run
config) and the node's partition (node config ``partition-id`` / ``num-partitions``); the
private state of its clients lives in the node's ``Context.state`` between messages, never in
module globals. The ServerApp is a server (`fedrec.flower.roles.Server`) driving rounds through the Grid: one ``train``
exchange per node holding a sampled client, then an ``evaluate`` exchange. Nodes that do not
answer within ``round-timeout`` seconds are logged and left out of the round.

Run options: the run config's ``fedrec`` entry (a `RunConfig` as JSON, see `records`), and
``nodes`` (how many SuperNodes to wait for), ``round-timeout``, ``checkpoint`` (a path the
server saves to after every round), ``resume`` and ``out`` (the results JSON). `apps(options)`
builds apps that take these from ``options`` instead (Flower's simulation engine has no run
config); the module-level ``server`` and ``client`` read the run config (deployment).
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedrec.algorithms import get_algorithm
from fedrec.core import checkpoint
from fedrec.core.device import on
from fedrec.core.driver import run_rounds
from fedrec.core.selection import TrainOutcome
from fedrec.errors import FedrecError
from fedrec.experiment import RunConfig, fingerprint, prepare_split, recorded_config
from fedrec.flower import secagg
from fedrec.flower.failures import reply_reason
from fedrec.flower.records import RUN_KEY, from_record, run_from_json, to_record
from fedrec.flower.roles import Node, Server
from fedrec.flower.server import FlowerServer
from fedrec.protocols.protocol import Split
from fedrec.results import RoundRecord, RunResult, git_revision, peak_memory_mb

log = logging.getLogger("fedrec.flower")
STATE_KEY = "fedrec"


def _options(context: Context, fixed: dict[str, Any] | None) -> dict[str, Any]:
    return dict(fixed) if fixed is not None else dict(context.run_config)


@functools.lru_cache(maxsize=4)
def _split(run_json: str) -> Split:
    """The node's data under the run's protocol (read-only, so one copy per process serves every
    message; the clients' private state is in ``Context.state``)."""
    return prepare_split(run_from_json(run_json))


def _node(context: Context, fixed: dict[str, Any] | None) -> Any:
    opts = _options(context, fixed)
    run_json = str(opts[RUN_KEY])
    cfg = context.node_config
    node = Node(run_from_json(run_json), int(cfg["partition-id"]), int(cfg["num-partitions"]),
                     _split(run_json))
    if STATE_KEY in context.state:
        node.load_private_state(context.state[STATE_KEY]["private"])
    return node


def _reply(msg: Message, payload: dict[str, Any]) -> Message:
    return Message(content=to_record(payload), reply_to=msg)


def _keep(node: Any, context: Context, fixed: dict[str, Any] | None, r: int) -> None:
    """Keep the clients' private state in ``Context.state`` and, when the run names a
    ``client-state-dir``, on the node's disk too (a restarted run is a new Flower run with an
    empty context: the node reloads the state of the round the server resumes from)."""
    raw = node.private_state()
    context.state[STATE_KEY] = ConfigRecord({"private": raw})
    folder = _state_dir(context, fixed)
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    _save_bytes(folder / f"r{r:06d}.state", raw)
    for old in sorted(folder.glob("r*.state"))[:-2]:  # the last two: a crash loses at most a round
        old.unlink()


def _restore(node: Any, context: Context, fixed: dict[str, Any] | None, r: int) -> None:
    folder = _state_dir(context, fixed)
    saved = sorted(p for p in folder.glob("r*.state") if int(p.stem[1:]) <= r) if folder else []
    if not saved and folder is not None and any(folder.glob("r*.pt")):
        raise FedrecError(f"{folder}: holds client state an older fedrec pickled (r*.pt), which "
                          "this fedrec does not read; remove those files and train afresh")
    if not saved:
        log.warning("resuming after round %d without saved client state: the clients start afresh", r)
        return
    node.load_private_state(saved[-1].read_bytes())
    context.state[STATE_KEY] = ConfigRecord({"private": saved[-1].read_bytes()})


def _state_dir(context: Context, fixed: dict[str, Any] | None) -> Path | None:
    opts = _options(context, fixed)
    if not opts.get("client-state-dir"):
        return None
    return Path(str(opts["client-state-dir"])) / f"node-{int(context.node_config['partition-id'])}"


def _save_bytes(path: Path, raw: bytes) -> None:
    """Write atomically: a reader never sees half a file (a node or server killed mid-write)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw)
    tmp.replace(path)


def make_client(fixed: dict[str, Any] | None = None) -> ClientApp:
    app = ClientApp(mods=[secagg.client_mod])  # passes everything but SecAgg+ messages through

    def on_run_device(handler: Any) -> Any:
        """Handle with the run's device as PyTorch's default (`fedrec.core.device`): a node
        trains its clients on the GPU share its Ray actor or machine was given."""

        @functools.wraps(handler)
        def wrapped(msg: Message, context: Context) -> Message:
            run = run_from_json(str(_options(context, fixed)[RUN_KEY]))
            with on(run.federated.device if run.federated is not None else "cpu"):
                return handler(msg, context)

        return wrapped

    @app.query()
    @on_run_device
    def hello(msg: Message, context: Context) -> Message:
        node = _node(context, fixed)
        resume = int(from_record(msg.content).get("resume_round", 0))
        if resume:
            _restore(node, context, fixed, resume)
        return _reply(msg, node.hello(resume))

    @app.train()
    @on_run_device
    def train(msg: Message, context: Context) -> Message:
        node = _node(context, fixed)
        if secagg.is_request(msg):  # the masked-vector stage of SecAgg+ (the mod masks it)
            payload = secagg.unpack(msg)
            vectors, counts = node.train_secure(payload)
            _keep(node, context, fixed, int(payload["round"]))
            return secagg.reply(msg, vectors, counts, _secure_range(_options(context, fixed)))
        payload = from_record(msg.content)
        reply = node.train(payload)
        _keep(node, context, fixed, int(payload["round"]))
        return _reply(msg, reply)

    @app.evaluate()
    @on_run_device
    def evaluate(msg: Message, context: Context) -> Message:
        node = _node(context, fixed)
        reply = node.evaluate(from_record(msg.content))
        # an evaluation message can change a client's state (FedCA's clients take the models the
        # server mixed for them), so it is kept as a train message's is, under the round it follows
        _keep(node, context, fixed, int(msg.metadata.group_id or 0))
        return _reply(msg, reply)

    return app


def make_server(fixed: dict[str, Any] | None = None) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        drive(grid, _options(context, fixed), context)

    return app


def apps(options: dict[str, Any] | None = None) -> tuple[ServerApp, ClientApp]:
    """A ServerApp and ClientApp that read their options from ``options`` (simulation) or,
    when None, from Flower's run config (deployment)."""
    return make_server(options), make_client(options)


# module-level apps for `flwr run` (Flower finds them by name, statically)
server = make_server()
client = make_client()


# -- the server's loop -------------------------------------------------------------------------


def _secure_range(opts: dict[str, Any]) -> float:
    return float(opts.get("secagg-range", secagg.RANGE))


class GridTransport:
    """Flower's grid as the driver's transport (`fedrec.flower.server.Transport`)."""

    def __init__(self, grid: Grid, timeout: float) -> None:
        self.grid, self.timeout = grid, timeout

    def exchange(self, kind: str, payloads: dict[int, dict[str, Any]], r: int) -> dict[int, dict[str, Any]]:
        return _exchange(self.grid, kind, payloads, self.timeout, r)


def drive(grid: Grid, opts: dict[str, Any], context: Context) -> RunResult:
    """Run a whole federated run over ``grid`` with the one round driver; write its results."""
    start = time.perf_counter()
    if not log.handlers:  # the ServerApp's output is what `flwr run --stream` shows
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fedrec: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
    run = run_from_json(str(opts[RUN_KEY]))
    timeout = float(opts.get("round-timeout", 600))
    ckpt = Path(opts["checkpoint"]) if opts.get("checkpoint") else None
    resume = bool(opts.get("resume")) and ckpt is not None and ckpt.exists()
    replace = bool(opts.get("overwrite")) or resume
    if opts.get("out") and not replace and Path(opts["out"]).exists():  # now, not after every round has run
        raise FedrecError(f"{opts['out']} exists (an earlier run's); write the app again with "
                          "`fedrec flower ... --overwrite` to replace it, or give another --out")
    after = checkpoint.peek_round(ckpt) if resume else 0  # type: ignore[arg-type]
    nodes = _wait_for_nodes(grid, int(opts.get("nodes", 1)), timeout)
    # a node's first message starts its processes and loads its data: give it time
    failed: dict[int, str] = {}
    hellos = _exchange(grid, "query", {n: {"resume_round": after} for n in nodes},
                       max(timeout, 300.0), 0, failed=failed)
    if not hellos and failed:  # their reason, not only that they did not answer
        reasons = list(dict.fromkeys(failed[n] for n in sorted(failed)))
        raise FedrecError(f"no node answered the first message ({len(failed)} of {len(nodes)} failed): "
                          + "; ".join(reasons[:3]))
    secure = bool(opts.get("secagg", False))
    role = Server(run, dict(sorted(hellos.items())), secure=secure)
    if resume:
        log.info("resuming after round %d from %s", after, ckpt)

    def secure_sum(messages: dict[int, dict[str, Any]], r: int) -> Any:
        return secagg.secure_sum(grid, context, messages, r, clip=_secure_range(opts), timeout=timeout)

    def on_round(record: RoundRecord, best: int, valid_at_best: dict[str, float]) -> None:
        log.info("round %d: loss %.4f, valid %s, %.2f s", record.round, record.loss,
                 json.dumps({k: round(v, 4) for k, v in record.valid.items()}), record.seconds)

    server = FlowerServer(role, GridTransport(grid, timeout), role.protocol, len(hellos),
                          secure_sum if secure else None)
    cfg = run.federated
    options = get_algorithm(run.algorithm).parse(run.model).values()
    out = run_rounds(server, None, select=role.protocol.select, rounds=cfg.rounds,
                     eval_every=cfg.eval_every, patience=cfg.patience, on_round=on_round,
                     checkpoint=ckpt, checkpoint_every=1 if ckpt is not None else 0, resume=resume,
                     fingerprint=fingerprint(run, options))
    result = _result(run, options, role, out, time.perf_counter() - start)
    if opts.get("out"):
        result.write(opts["out"], exclusive=not replace)
    return result


def _wait_for_nodes(grid: Grid, want: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= want:
            return nodes
        if time.monotonic() > deadline:
            raise FedrecError(f"only {len(nodes)} of {want} SuperNodes connected in {timeout:g} s")
        time.sleep(0.5)


def _exchange(grid: Grid, kind: str, payloads: dict[int, dict[str, Any]], timeout: float,
              r: int, poll: float = 0.05, failed: dict[int, str] | None = None) -> dict[int, dict[str, Any]]:
    """Send each node its message; the replies of those that answered in time without error.
    A node that answered with an error is logged with the exception it raised, in one line
    (and put in ``failed``, when given, as node id: that line).

    Polls every ``poll`` seconds (`Grid.send_and_receive` sleeps 3 s between pulls in a
    deployment, Flower 1.41) and matches replies to nodes by the message they answer (an error
    reply for a node the SuperLink found dead does not carry that node's id).
    """
    messages = [Message(content=to_record(p), message_type=kind, dst_node_id=node, group_id=str(r))
                for node, p in payloads.items()]
    if not messages:
        return {}
    ids = list(grid.push_messages(messages))
    node_of = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages, strict=True)}
    waiting, out = set(ids), {}
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        for reply in grid.pull_messages(waiting):
            mid = reply.metadata.reply_to_message_id
            waiting.discard(mid)
            node = node_of.get(mid)
            if node is None:
                continue
            if reply.has_error():
                reason = reply_reason(reply.error.reason)
                log.warning("round %d: node %d failed (%s): %s", r, node, kind, reason)
                if failed is not None:
                    failed[node] = reason
            else:
                out[node] = from_record(reply.content)
        if waiting:
            time.sleep(poll)
    for mid in sorted(waiting):
        log.warning("round %d: node %d gave no %s reply in %g s", r, node_of[mid], kind, timeout)
    return out


def _result(run: RunConfig, options: dict[str, Any], role: Server, out: TrainOutcome,
            seconds: float) -> RunResult:
    config = recorded_config(run, options)
    return RunResult(
        algorithm=run.algorithm, dataset=run.dataset, protocol=run.protocol, seed=run.seed,
        config=config, select=role.protocol.select, history=out.history,
        best_round=out.best_round, valid_at_best=out.valid_at_best, test=out.test,
        extra=out.extra, data={"clients": role.n_clients, "items": role.n_items},
        wall_seconds=seconds + out.earlier_seconds, resumed_at=out.resumed_at,
        peak_memory_mb=peak_memory_mb(), git_revision=git_revision(),
    )
