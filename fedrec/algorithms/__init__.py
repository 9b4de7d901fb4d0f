"""The one place algorithms register by name; every module of this package is discovered.

An `AlgorithmSpec` says what kind of run an algorithm is, which typed options it takes
(`fedrec.options.Options`), the engine options it runs with unless told otherwise, and how to
build it for a split. Adding an algorithm means adding one module here that calls `register`,
and one test: modules are imported by `discover` (no central list to edit).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedrec.errors import FedrecError, UnknownNameError
from fedrec.options import Options
from fedrec.protocols.protocol import Split


@dataclass(frozen=True)
class AlgorithmSpec:
    """A named algorithm: ``builder(split, options)`` returns its model description, or the
    options are the description (``builder`` None: `fedrec.options.Options.for_split`).

    ``kind`` picks the trainer: ``centralised`` builds an ``nn.Module`` trained one epoch a
    round; ``federated`` builds a frozen spec whose ``algorithm(split, cfg, seed)`` is a
    `fedrec.core.FederatedAlgorithm`. ``options`` is its typed options class; ``fixed`` the
    options a variant sets for itself (``fedrap-no``: ``reg=none``). ``engine`` holds the
    engine options (learning rate included) it runs with unless the user says otherwise
    (`fedrec.experiment.federated_config`); ``paper`` those its paper used, over ``engine``,
    which `fedrec reproduce` runs with (`engine_for`). ``rankings`` are the protocol rankings
    its scores can be evaluated under; ``flower``: the Flower app runs it (`fedrec.flower`).
    """

    name: str
    kind: str
    description: str
    #: the model description from the split and the parsed options; None: the options are
    #: the description (`Options.for_split`)
    builder: Callable[[Split, Any], Any] | None
    options: type[Options] = Options
    engine: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    #: scores that rank items by default; "rating" only where the model is trained on ratings
    rankings: tuple[str, ...] = ("sampled", "full")
    flower: bool = False
    #: engine options (`FederatedConfig` fields) the algorithm does not read: given, they are an
    #: error rather than silently dropped
    ignores: tuple[str, ...] = ()
    #: engine options only the algorithms naming them here read: ``attacker_norm`` (FedCA's,
    #: FedDAE's and FedCIA's attackers; every other method's make their own estimate), refused
    #: elsewhere as ``ignores`` are
    reads: tuple[str, ...] = ()
    #: engine options of its paper's setting, over ``engine`` (the papers' item-row rule where
    #: fedrec's default is another, `FederatedConfig.aggregation`); with ``per_dataset`` they
    #: are what `fedrec reproduce` and ``--paper`` run with, for a fixed budget of rounds
    paper: dict[str, Any] = field(default_factory=dict)
    #: engine options a paper gives for a data set (registry name), over ``paper``: PFedRec's
    #: Table 4 learning rates (fedrec's own defaults take one setting for every data set)
    per_dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: engine options under rating protocols, over ``engine`` and instead of ``per_dataset``
    #: (the papers' rates are for ranking): a squared error on 1-5 stars diverges at rates set
    #: for BCE; set on ML-100K's ``ratio-rating`` (docs/learning-rates.md)
    rating_engine: dict[str, Any] = field(default_factory=dict)
    #: its paper's setting under rating protocols, where it differs from ``rating_engine``
    #: (the family: the papers' item-row rule, without the rating baseline)
    rating_paper: dict[str, Any] = field(default_factory=dict)
    #: options `fedrec tune` searches, each log-uniform in (low, high): model options besides
    #: the engine's rates and epochs (FedRAP's regularisers), or an engine rate (``lr``,
    #: ``item_lr_scale``) whose range replaces the decade around its default
    search: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: its ranking defaults were measured to carry over to data they were not set on
    #: (docs/defaults.md), so no run is told they are untuned there
    transfers: bool = False

    def engine_for(self, dataset: str | None, ranking: str | None = None, paper: bool = False) -> dict[str, Any]:
        """The engine options it runs with on ``dataset`` under a protocol that ranks by
        ``ranking`` (None: a ranking protocol) unless the user says otherwise: fedrec's
        defaults, or with ``paper`` its paper's item-row rule and the rates it gives for
        ``dataset``. fedrec's defaults of a federated algorithm stop on validation
        and back off where they diverge (`FEDREC_ENGINE`); a paper's setting runs its fixed budget."""
        federated = self.kind == "federated"
        if paper:
            base = {**self.engine, **self.paper}
        else:
            base = {**(FEDREC_ENGINE if federated else {}), **self.engine}
        if ranking == "rating":
            if paper:
                return {**base, **(self.rating_paper or self.rating_engine)}
            return {**base, **(FEDREC_RATINGS if federated else {}), **self.rating_engine}
        return {**base, **self.per_dataset.get(dataset or "", {})} if paper else dict(base)

    def untuned_note(self, dataset: str, ranking: str | None = None) -> str | None:
        """A note where its defaults were not set for ``dataset`` (they were chosen on ML-100K
        and not measured to carry over, `transfers`); None where they were, and for synthetic
        data."""
        if dataset == "ml-100k" or dataset.startswith("synthetic"):
            return None
        if self.transfers and ranking != "rating":
            return None
        if ranking == "rating" and self.rating_engine:
            return (f"{self.name}'s settings for ratings were chosen on ml-100k: they are untuned "
                    f"on {dataset} ({self._tune_hint(dataset)})")
        return (f"{self.name}'s settings were chosen on ml-100k and not measured on other data: "
                f"they are untuned on {dataset} ({self._tune_hint(dataset)})")

    def _tune_hint(self, dataset: str) -> str:
        """The command that tunes this algorithm on ``dataset``'s validation split."""
        from fedrec.data.user_sets import looks_like_a_file

        own = " --columns ..." if looks_like_a_file(dataset) else ""
        return (f"tune them on its validation split: fedrec tune {self.name} -d {dataset}{own} --trials 20, "
                f"or compare methods tuned alike: fedrec compare {self.name} ... -d {dataset}{own}")

    def parse(self, values: Mapping[str, Any] | None = None) -> Options:
        """Typed options from ``values`` (unknown keys, wrong types and contradicted fixed
        options are one clear error each)."""
        return self.options.parse(values or {}, algorithm=self.name, fixed=self.fixed)

    def changed_options(self, values: Mapping[str, Any] | None, recorded: Mapping[str, Any] | None) -> dict[str, tuple[Any, Any]]:
        """The model options a run that recorded ``recorded`` (a results file's ``config.model``,
        every option as parsed then) ran with that ``values`` now resolve otherwise, as ``{name:
        (then, now)}``: a default changed since, which a cache keyed on the options a user sets
        cannot see. An option the file lacks (added since, its default the old behaviour) or the
        algorithm lacks (removed since) is not compared."""
        now = json.loads(json.dumps(self.parse(values).values(), default=str))
        then = recorded or {}
        return {k: (then[k], now[k]) for k in sorted(then) if k in now and then[k] != now[k]}

    def build(self, split: Split | None, values: Mapping[str, Any] | Options | None = None,
              engine: Any = None) -> Any:
        """The algorithm's model description for ``split`` under ``values`` (typed or not), and
        under the federated ``engine``'s options where the description depends on them (the
        family's rating baseline: `fedrec.federated.family.spec.FamilySpec.configured`)."""
        opts = values if isinstance(values, Options) else self.parse(values)
        model = opts.for_split(split) if self.builder is None else self.builder(split, opts)
        self.check_engine(model, engine)
        configured = getattr(model, "configured", None)
        return configured(engine) if engine is not None and configured is not None else model

    def check_engine(self, model: Any, engine: Any) -> None:
        """Refuse engine options ``model`` (what `build` made) would ignore: a server optimiser
        where the server aggregates its own way, a client objective where the clients train
        their own way."""
        named = getattr(engine, "server_opt", None)
        if named is not None and not getattr(model, "takes_server_opt", False):
            raise FedrecError(f"--server-opt {named}: {self.name} aggregates its own way; a server optimiser "
                              "is a part of the item-embedding family and MetaMF")
        named = getattr(engine, "client_objective", None)
        if named is not None and not getattr(model, "takes_client_objective", False):
            raise FedrecError(f"--client-objective {named}: {self.name}'s clients train their own way; a "
                              "client objective is a part of the item-embedding family and MetaMF")

    @property
    def defaults(self) -> dict[str, Any]:
        """The options it runs with when none are given."""
        return self.parse().values()

    @property
    def lr(self) -> float | None:
        """Its default learning rate (an engine option), if it has one."""
        return self.engine.get("lr")


#: what fedrec's defaults add to every federated algorithm's: a stop after 30 evaluations
#: without a better validation figure, under the round cap, and up to three back-offs (the best
#: round's state, halved rates) where a run diverges (docs/defaults.md). A paper's setting keeps
#: `FederatedConfig`'s fixed budget and first divergence stop unless its own options say else
#: (FedCIA's stop).
FEDREC_ENGINE: dict[str, Any] = {"patience": 30, "backoffs": 3}
#: and under rating protocols: the user's training mean for an item no training rating names
#: (its row is still at its initial value; `fedrec.protocols.protocol.ColdFallback`), and the
#: item-embedding family's score fitted beneath a baseline of the user's training mean and a
#: learned item bias (`fedrec.federated.family.spec.FamilySpec.baseline`)
FEDREC_RATINGS: dict[str, Any] = {"cold_items": "user-mean", "rating_baseline": "user-item"}

ALGORITHMS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    if spec.name in ALGORITHMS:
        raise ValueError(f"algorithm '{spec.name}' registered twice")
    ALGORITHMS[spec.name] = spec
    return spec


def get_algorithm(name: str) -> AlgorithmSpec:
    if name not in ALGORITHMS:
        raise UnknownNameError("algorithm", name, list(ALGORITHMS))
    return ALGORITHMS[name]


def discover() -> None:
    """Import every module of this package (each registers its algorithms)."""
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        importlib.import_module(f"{__name__}.{info.name}")


discover()
