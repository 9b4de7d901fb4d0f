"""The item-embedding family: FedMF, FedNCF, FedRecon and PFedRec as switches on one model.

Each client scores an item from its item-table row through a score function. What differs
between the methods is which parameters are private, which are averaged, and in what order
they are updated:

* ``score``: ``dot`` (a private user vector, FedMF/FedRecon), ``linear`` (a private
  Linear(d, 1), PFedRec), ``ncf`` (private user vectors for GMF and the MLP tower, an MLP
  64-32-16-8 and a head, FedNCF), ``mlp`` (the user vector concatenated with the item row
  through the MLP 64-32-16-8 and a head, no GMF: GPFedRec's and GFed-PP's score function),
  ``metamf`` (a score function generated from the user vector by a shared hypernetwork,
  `fedrec.federated.metamf.MetaMFSpec`).
* ``private_score``: the score function's own weights (NCF's MLP and head, PFedRec's linear
  layer) stay on the client; otherwise they are averaged by the server like the item table.
* ``dual``: PFedRec's dual personalisation. Each batch first updates the score function with
  the item rows fixed, then post-tunes the item rows with the updated score function; the
  client keeps its post-tuned rows and is evaluated with them.
* ``reconstruct_epochs``: FedRecon. The user vector is re-initialised every round and trained alone
  for that many local epochs before the item update, which then leaves it fixed.
* ``loss``: ``bce`` on 1/0 labels (training positives and sampled negatives: ranking
  protocols) or ``mse``, the squared error of the score against the observed rating (rating
  protocols: no negatives; the score is the predicted rating, as in FedMF's and MetaMF's papers).
* ``baseline``: under ``mse``, a rating baseline beneath the score: the client's training mean
  (computed on the client, never sent) plus a learned bias per item (the item row's last
  column, `fedrec.federated.family.scores.ItemBias`), so the score fits what they leave. With 1-5
  stars and few ratings a user, a score that must produce the rating itself fits a private
  vector to each user's few ratings (FedMF on Ciao: test RMSE 3.1 against 1.035 for the
  users' means); fedrec's defaults for ratings take it (``--rating-baseline``).
* ``clip``: each client's gradient of a step (its parameters and its batch's item slots) is
  clipped to this L2 norm, as ``clip_grad_norm_`` on one client's model (0: off; MetaMF's
  official code clips at 5).

Every parameter is held with a leading client axis (``(C, ...)``), so one autograd pass over the
sum of per-client losses gives each client exactly its own gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from fedrec.core.device import here
from fedrec.errors import FedrecError
from fedrec.federated.family.model import ITEMS
from fedrec.federated.family.objective import ClientObjective, parse_objective
from fedrec.federated.family.scores import ItemBias, ScoreFunction, get_score
from fedrec.federated.family.server_opt import ServerOpt, ServerOptimizer
from fedrec.options import check, internal
from fedrec.protocols.protocol import user_means

if TYPE_CHECKING:
    from fedrec.rounds.uncopied import SharedTape

#: the losses a member fits: ranking (1/0 labels) or explicit ratings (`loss_for`)
LOSSES = ("bce", "mse")


@dataclass(frozen=True)
class FamilySpec:
    """Which member of the family a run is (see the module docstring)."""

    # Fields a member sets are `internal`; the rest are a member's options
    # (`fedrec.algorithms.federated.FamilyOptions`: the options are the spec).
    score: str = internal("dot")
    private_score: bool = internal(False)
    #: PFedRec's dual personalisation: private score function, item rows post-tuned per client
    dual: bool = False
    reconstruct_epochs: int = internal(0)
    #: embedding size of the user vector and the item rows
    dim: int = 32
    layers: tuple[int, ...] = internal((32, 16, 8))
    loss: str = internal("bce")
    #: L2 bound on each client's gradient of a local step (0: no clipping)
    clip: float = 0.0
    baseline: bool = internal(False)
    # the server optimiser on the round's mean (`fedrec.federated.family.server_opt`; None: FedAvg)
    server: ServerOpt | None = internal(None)
    # a term added to each client's local loss (`fedrec.federated.family.objective`; None: none)
    objective: ClientObjective | None = internal(None)
    #: the score function also takes shared weights without a client axis (one copy read by
    #: every client, not one a client) and records their products (`logits_taped`), which
    #: `FamilyState.train_uncopied` needs
    shares_unbatched: ClassVar[bool] = False
    #: it can take the rating baseline (``baseline``); MetaMF's generated score cannot
    takes_baseline: ClassVar[bool] = True
    #: its server averages through `FamilyState.aggregate`, so it takes a server optimiser
    #: (``--server-opt``); a model without this attribute aggregates its own way and refuses one
    takes_server_opt: ClassVar[bool] = True
    #: its clients step through `FamilyState.local_update`, which honours a client objective
    #: (``--client-objective``); a model without this attribute refuses one
    takes_client_objective: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.loss not in LOSSES:  # a typo would otherwise train under the ranking loss
            raise ValueError(f"FamilySpec.loss must be one of {', '.join(LOSSES)}, not {self.loss!r}")
        check((self.clip < 0, f"clip must be >= 0 (0: off; got {self.clip})"))  # an option: one clear line
        if self.baseline and (self.loss != "mse" or not self.takes_baseline):
            raise ValueError("FamilySpec.baseline is a rating baseline: it needs loss 'mse' and a "
                             "member that takes one")

    def configured(self, engine: Any) -> FamilySpec:
        """This spec under the engine's options (`fedrec.federated.engine.FederatedConfig`):
        with the rating baseline where the engine asks for one and the spec fits ratings, and
        with the engine's server optimiser where it names one (``--server-opt``; an algorithm
        that is defined by its own, FedAvgM, FedAdam, FedYogi, refuses another), and with its
        client objective (``--client-objective``; likewise FedProx's)."""
        spec = self
        wanted = getattr(engine, "rating_baseline", "none") != "none" and self.loss == "mse"
        if wanted and not self.takes_baseline:
            raise FedrecError(f"--rating-baseline {engine.rating_baseline}: this algorithm's score takes "
                              "no rating baseline (give --rating-baseline none)")
        if wanted and not self.baseline:
            spec = replace(spec, baseline=True)
        spec = spec._with_part("server", getattr(engine, "server_opt", None), ServerOpt.parse, "--server-opt")
        spec = spec._with_part("objective", getattr(engine, "client_objective", None), parse_objective,
                               "--client-objective")
        refusal = spec.objective.refusal(spec) if spec.objective is not None else None
        if refusal is not None:
            raise FedrecError(refusal)
        return spec

    def for_clients(self, n_clients: int, per_round: float) -> FamilySpec:
        """This spec in a federation of ``n_clients``, ``per_round`` of them a round: its client
        objective's settings that follow the participation resolved (`ClientObjective.for_clients`;
        the simulator and a Flower server resolve them alike)."""
        if self.objective is None:
            return self
        term = self.objective.for_clients(n_clients, per_round)
        return self if term == self.objective else replace(self, objective=term)

    def _with_part(self, field: str, named: str | None, parse: Callable[[str], Any], flag: str) -> FamilySpec:
        """This spec with the part ``field`` the engine names (``named``, parsed by ``parse``); a
        spec defined by another one of its own refuses it."""
        if named is None:
            return self
        part, own = parse(named), getattr(self, field)
        if own is not None and own != part:
            raise FedrecError(f"{flag} {named}: this algorithm is FedMF with {own.text()} (its --set options); "
                              f"for another, run fedmf {flag} {named}")
        return self if part == own else replace(self, **{field: part})

    def algorithm(self, split: Any, cfg: Any, seed: int):  # type: ignore[no-untyped-def]
        """The federated algorithm the round driver trains (`fedrec.federated.family.algorithm`), under
        the engine options ``cfg`` (`configured`)."""
        from fedrec.federated.family.algorithm import CohortAlgorithm

        return CohortAlgorithm(self.configured(cfg).for_clients(split.n_users, cfg.clients_per_round), split, cfg, seed)

    def create_state(self, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                     item_std: float, seed: int, train: Any = None,
                     client_ids: Any = None):  # type: ignore[no-untyped-def]
        """The engine's state for this algorithm (`fedrec.federated.family.state.FamilyState`).

        ``train`` (the training matrix, a row per client of the state) is what a server that
        receives interactions would see; this family's server never does: under the rating
        baseline each client takes its own row's mean from it, and otherwise it is ignored.
        ``client_ids``: the ids of the state's clients when it holds only some (a Flower node's).
        """
        state = self.state_type().create(self, n_clients, n_items, lr=lr, lr_item=lr_item,
                                         item_std=item_std, seed=seed, client_ids=client_ids)
        if self.baseline and n_clients:  # (a Flower server holds no client)
            if train is None:
                raise ValueError("the rating baseline needs the clients' training ratings")
            state.offsets = here(torch.as_tensor(user_means(train)))
        return state

    def state_type(self) -> type:
        """The state class `create_state` builds: `FamilyState`, or a subclass whose kernel
        changes a step (CoLR's subspace, `fedrec.federated.colr`)."""
        from fedrec.federated.family.state import FamilyState

        return FamilyState

    def sides(self) -> tuple[type, type]:
        """The client and server sides of this method's round in a deployment
        (`fedrec.rounds.sides`)."""
        from fedrec.federated.family.sides import FamilyClient, FamilyServer

        return FamilyClient, FamilyServer

    def flower_refusal(self, secure: bool) -> str | None:
        """Why the Flower app cannot run this configuration, or None."""
        if secure and self.shared_names():
            return "secure aggregation sums item tables only; this algorithm also averages shared weights"
        return None

    def server_optimizer(self) -> ServerOptimizer:
        """How the server applies a round's mean: ``server``'s optimiser, else FedAvg."""
        return (self.server or ServerOpt()).make()

    def logits_taped(self, p: dict[str, torch.Tensor], v: torch.Tensor, tape: SharedTape | None) -> torch.Tensor:
        """Logits ``(C, B)`` of item rows ``v`` with the shared weights in ``p`` unbatched, each
        product of one passed through ``tape`` (`fedrec.rounds.uncopied.SharedTape.product`);
        a spec that ``shares_unbatched`` provides it."""
        raise NotImplementedError(f"{type(self).__name__} does not share unbatched weights")

    @property
    def scorer(self) -> ScoreFunction:
        """The score function named by ``score`` (`fedrec.federated.family.scores`), with the item
        bias of the rating baseline when ``baseline``."""
        return _with_item_bias(get_score(self.score)) if self.baseline else get_score(self.score)

    @property
    def bytes_per_sample(self) -> int:
        """Estimated working set of one training sample, for sizing cohort chunks."""
        return self.item_width * 4 * self.scorer.cost

    @property
    def bytes_per_client(self) -> int:
        """Working set a client holds whatever its samples (its copies of shared weights), for
        sizing cohort chunks; 0 in this family, whose shared score weights are small."""
        return 0

    @property
    def bytes_per_uncopied_client(self) -> int:
        """`bytes_per_client` for a client trained by `FamilyState.train_uncopied` (no copies),
        less its history (`bytes_per_uncopied_step`)."""
        return self.bytes_per_client

    @property
    def bytes_per_uncopied_step(self) -> int:
        """What each local step adds to a client's working set in `FamilyState.train_uncopied`:
        its products' inputs and output gradients (`fedrec.rounds.uncopied.SharedHistory`)."""
        return 0

    @property
    def item_width(self) -> int:
        """Columns of an item row (NCF keeps a GMF and an MLP embedding side by side)."""
        return self.scorer.item_width(self)

    def user_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-user parameters (always private)."""
        return self.scorer.user_shapes(self)

    def score_shapes(self) -> dict[str, tuple[int, ...]]:
        """The score function's own weights (private when ``private_score``, else averaged)."""
        return self.scorer.score_shapes(self)

    def private_names(self) -> list[str]:
        names = list(self.user_shapes())
        return names + list(self.score_shapes()) if self.private_score else names

    def shared_names(self) -> list[str]:
        """Dense parameters the server averages (besides the item table)."""
        return [] if self.private_score else list(self.score_shapes())

    def phases(self) -> list[list[str]]:
        """Parameter groups stepped in sequence on every batch of the main local pass."""
        user = [] if self.reconstruct_epochs else list(self.user_shapes())
        score = user + list(self.score_shapes())
        if self.dual:
            return [score, [ITEMS]] if score else [[ITEMS]]
        return [score + [ITEMS]]


@functools.cache
def _with_item_bias(score: ScoreFunction) -> ScoreFunction:
    return ItemBias(score)


def loss_for(split: Any) -> str:
    """The family's loss under ``split``'s protocol: squared error where it scores ratings."""
    return "mse" if split is not None and split.protocol.ranking == "rating" else "bce"
