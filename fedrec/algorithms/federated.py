"""FedMF, FedNCF, FedRecon and PFedRec: members of the item-embedding family.

Each is a `FamilySpec` (see `fedrec.federated.family.spec`); ``dual=True`` adds PFedRec's dual
personalisation (private score function, post-tuned item table kept by the client) to any of
them, as in PFedRec's Table 2. FedMF also fits explicit ratings (squared error, no negatives)
under rating protocols, as in its paper (Chai et al., 2020).

They default to fedrec's item-row rule (`samples`): the server averages each item row over the
clients that sent it and a client steps its rows on its batch's summed loss, at item rate 30 on
every data set (measured against the papers' rule in docs/learning-rates.md, and across data
sets in docs/defaults.md). Their papers' setting (`PAPERS_RULE`: item rows at the official ``lr
x n_items x 80``, except FedNCF's ``item_lr_scale`` 20,000, with PFedRec's Table 4 learning
rates per data set) is what `fedrec reproduce` and ``--paper`` run. FedRecon re-trains the user
vector for 20 epochs a round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedrec.algorithms import AlgorithmSpec, register
from fedrec.federated.family.spec import FamilySpec, loss_for
from fedrec.options import Options, check, internal
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class FamilyOptions(FamilySpec, Options):
    """A member's options, which are its spec (`FamilySpec`'s fields other than the `internal`
    ones its class sets): ``dim``, ``dual`` (PFedRec's dual personalisation), ``clip`` (each
    client's gradient norm per local step, its whole model's as ``clip_grad_norm_`` takes it;
    0: off, the papers' setting), which bounds the step a client with few samples takes at a
    large item rate. The split decides the loss (`for_split`)."""

    def validate(self) -> None:
        check((self.dim < 1, f"dim must be >= 1 (got {self.dim})"))  # clip: `FamilySpec`'s own check

    def for_split(self, split: Split | None) -> FamilySpec:
        """The spec for ``split``: its loss (`loss_for`), and a private score function wherever
        the member is dual."""
        loss = "bce" if split is None else loss_for(split)
        return replace(self, loss=loss, private_score=self.private_score or self.dual)


@dataclass(frozen=True)
class FedNCFOptions(FamilyOptions):
    """FedNCF: NeuMF's GMF and MLP halves."""

    score: str = internal("ncf")


@dataclass(frozen=True)
class ReconOptions(FamilyOptions):
    """FedRecon: ``reconstruct_epochs`` re-training the user vector each round."""

    #: local epochs re-training the freshly drawn user vector each round, before the item update
    reconstruct_epochs: int = 20

    def validate(self) -> None:
        super().validate()
        check((self.reconstruct_epochs < 1, "reconstruct_epochs must be >= 1"))


@dataclass(frozen=True)
class PFedRecOptions(FamilyOptions):
    """PFedRec: a private Linear(d, 1) score function (and, fixed by its registration, dual)."""

    score: str = internal("linear")
    private_score: bool = internal(True)


#: under rating protocols (squared error on the observed ratings, no negatives) at fedrec's
#: defaults: the rating baseline beneath the score (`fedrec.algorithms.FEDREC_RATINGS`) and
#: fedrec's item-row rule, user vectors and item rows both at 0.03 a sample; chosen on ML-100K's
#: ratio-rating validation RMSE (docs/learning-rates.md, "Ratings")
RATING_ENGINE = {"lr": 0.03, "item_lr_scale": 1.0, "item_std": 0.1, "negatives": 0, "aggregation": "samples"}
#: the papers' setting under rating protocols: their item-row rule, the rates chosen for it on
#: ML-100K's ratio-rating, no baseline (the score is the rating)
RATING_PAPER = {"lr": 0.03, "item_lr_scale": 1000.0, "item_std": 0.1, "negatives": 0, "aggregation": "clients"}
#: the item rows' rate under fedrec's rule, whatever the data's size and density
ITEM_RATE = 30.0
#: the papers' item-row rule: each row's summed deltas over all the round's clients, item rows
#: at the official lr x n_items x 80
PAPERS_RULE: dict[str, Any] = {"aggregation": "clients", "item_lr_scale": None}


def samples(lr: float) -> dict[str, Any]:
    """fedrec's item-row rule at learning rate ``lr``: each row averaged over its contributors,
    stepped per sample, item rows at `ITEM_RATE` (``item_lr_scale`` is relative to ``lr``, so
    that `fedrec tune` searches both as it does under the papers' rule)."""
    return {"lr": lr, "aggregation": "samples", "item_lr_scale": ITEM_RATE / lr}


def _table4(ml100k: float, ml1m: float, lastfm: float, amazon: float) -> dict[str, dict[str, float]]:
    """A row of PFedRec's Table 4 (learning rate per data set, as its official code uses it:
    the item rows' rate follows, lr x item_lr_scale)."""
    return {"ml-100k": {"lr": ml100k}, "ml-1m": {"lr": ml1m}, "lastfm-2k": {"lr": lastfm},
            "amazon-video": {"lr": amazon}}


register(AlgorithmSpec(
    "fedmf", "federated",
    "FedMF: private user vector, item table averaged (no encryption); --dual for DualPer",
    None, FamilyOptions, samples(0.1), flower=True, paper=PAPERS_RULE,
    per_dataset=_table4(0.1, 0.1, 0.05, 0.05), rankings=("sampled", "full", "rating"),
    rating_engine=RATING_ENGINE, rating_paper=RATING_PAPER, transfers=True,
))
register(AlgorithmSpec(
    "fedncf", "federated",
    "FedNCF: private user vectors; item table, MLP and head averaged; --dual keeps the MLP private",
    None, FedNCFOptions, samples(0.5), flower=True,
    paper={"aggregation": "clients", "item_lr_scale": 20000.0}, per_dataset=_table4(0.5, 0.5, 0.5, 0.5),
    transfers=True,
))
register(AlgorithmSpec(
    "fedrecon", "federated",
    "FedRecon: user vector re-trained from scratch each round before the item update; --dual for DualPer",
    None, ReconOptions, samples(0.1), flower=True, paper=PAPERS_RULE,
    per_dataset=_table4(0.1, 0.1, 0.1, 0.05), transfers=True,
))
register(AlgorithmSpec(
    "pfedrec", "federated",
    "PFedRec: private Linear(d,1) score function, item table post-tuned on the client, averaged",
    None, PFedRecOptions, samples(0.1), fixed={"dual": True},
    flower=True, paper=PAPERS_RULE, per_dataset=_table4(0.1, 0.1, 0.05, 0.01), transfers=True,
))
