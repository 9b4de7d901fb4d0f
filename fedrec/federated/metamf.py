"""MetaMF (Lin et al., SIGIR 2020): a score function generated per user by a shared hypernetwork.

MetaMF is a member of the item family (`fedrec.federated.family.spec`) whose score function is
*generated*: `MetaMFSpec` extends `FamilySpec` with the hypernetwork's sizes and its score, and
`FamilyState` trains it like any other member (autograd over per-client parameter copies, one
joint SGD step per batch, shared weights averaged by the server, item rows sent as deltas).

Client u holds a private user embedding u (``dim``). Everything else is shared:

* collaborative memory: c_u = u M, M ``(dim, memory)``. The paper describes the module as
  attention over memory slots; the official code (TempSDU/MetaMF) is this single product, and
  is followed here;
* meta recommender: three hidden layers h_k = relu(c_u H_k + a_k) ``(memory -> hidden)``, one
  for each generated block, and linear maps from h_k to the block:
  - the predictor's first layer, W1 ``(dim, dim/4)`` and b1, from h_1;
  - its second layer, w2 ``(dim/4,)`` and b2, from h_2;
  - the right factor R_u ``(factors, dim)`` of the user's item table E_u = V R_u, from h_3;
* rating predictor: logit(u, j) = relu(e W1 + b1) w2 + b2 with e = V[j] R_u. As in the official
  code, the user vector reaches the score only through the generated weights.

V ``(n_items, factors)`` is the family's item table: downloaded row by row, trained by the
clients that touch a row, averaged as row deltas. **Deviation from the official code:** there
the left factor is generated too, V_u[j] = A_j h_3 + a_j with an item-specific ``(factors,
hidden)`` matrix A_j; here V is the shared table of the a_j alone (A_j would make every item row
4,104 floats wide, against 64 for FedNCF, in every download and upload). Under ranking
protocols training is on implicit feedback: BCE on 1/0 labels with sampled negatives; under
rating protocols it fits the observed ratings by squared error, as the official code does
(``FamilySpec.loss``). Plain SGD like every federated algorithm here (the official code: Adam,
lr 1e-4, weight decay 1e-3, gradient clipping at 5).

**Initialisation.** The official code draws Xavier-normal weights, zero biases and N(0, 1) user
embeddings. Trained by BCE on implicit feedback, neither end of that works:

* with N(0, 1) users the predictor's 8 ReLU units all die within a few hundred steps and the
  prior is the only output left (ML-100K, centralised, Adam at the official 1e-4 and at 1e-3:
  validation HR@10 at chance, 0.10). Users are drawn as every user vector of the family,
  U(-1/sqrt(dim), 1/sqrt(dim));
* with small users and zero biases, every generated weight is a product of small factors, so
  the logit is nearly flat in all of them and plain SGD does not move (federated, 10 rounds,
  lr 0.03 to 0.3: validation HR@10 at chance whatever the item rate). So the hypernetwork's
  output biases for the three generated matrices (W1, w2, R_u) are drawn as those matrices
  would be (Xavier normal): every user starts from one ordinary, trainable predictor, and the
  hypernetwork learns each user's departure from it. Everything else is as the official code.

V is N(0, item_std²) like every item table here.

**Memory.** The shared weights (473,617 floats at the defaults: 1.9 MB) are copied per client for
its local steps, and each step's gradient is as large: about 3 copies per client, which dwarf the
per-sample activations. A chunk whose uploads the server only sums makes no copies
(`FamilyState.train_uncopied`: the products read the one shared weight, `_per_client`, corrected
by each client's earlier steps, `fedrec.rounds.uncopied`), and is charged
``bytes_per_uncopied_client`` a client and ``bytes_per_uncopied_step`` a step of its history; on
Ciao, where most clients have one batch, a round's training takes 1.1-1.8 s on one thread
without copies against 15-22 s with them (clients of up to 32 steps go without). The engine
charges a chunk of copies ``bytes_per_client`` a client and ``bytes_per_sample`` a sample, not
the copies spread over the samples of the smallest client: that charged a client with many
samples many times its copies, and on Lastfm-2K (smallest client one positive, median ten)
1.1 MB a sample left 868 chunks of a median of one client each a round, stepped one by one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from fedrec.core.device import here
from fedrec.federated.family.model import client_params
from fedrec.federated.family.spec import FamilySpec
from fedrec.options import internal
from fedrec.rounds import draws
from fedrec.rounds.uncopied import SharedTape

# generated blocks: each has its own hidden layer h_k = relu(c_u H_k + a_k)
BLOCKS = ("layer1", "layer2", "items")
FLOAT = 4


@dataclass(frozen=True)
class MetaMFSpec(FamilySpec):
    """MetaMF's sizes (official defaults) on top of the family switches (fixed: nothing private
    but the user embedding, no dual personalisation, no reconstruction)."""

    #: its score is generated per user from shared weights; no rating baseline beneath it
    takes_baseline: ClassVar[bool] = False

    shares_unbatched: ClassVar[bool] = True  # `_per_client` takes a shared weight as it is
    score: str = internal("metamf")
    private_score: bool = internal(False)
    dual: bool = internal(False)
    #: width of the shared item table V (its rows travel)
    factors: int = 8
    #: width of the collaborative memory read from the user embedding
    memory: int = 128
    #: width of the meta recommender's hidden layers that generate the user's weights
    hidden: int = 512

    @property
    def width(self) -> int:
        """Width of the predictor's hidden layer (the official ``item_emb_size / 4``)."""
        return max(1, self.dim // 4)

    @property
    def item_width(self) -> int:
        return self.factors

    def user_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"user": (self.dim,)}

    def generated_shapes(self) -> dict[str, tuple[int, ...]]:
        """What the hypernetwork generates for a user, by block (``block.name``)."""
        d, k, f = self.dim, self.width, self.factors
        return {"layer1.weight": (d, k), "layer1.bias": (k,), "layer2.weight": (k, 1),
                "layer2.bias": (1,), "items.right": (f, d)}

    def score_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shared weights; ``*_w`` are ``(in, out)`` matrices, ``*_b`` their biases."""
        m, h = self.memory, self.hidden
        shapes: dict[str, tuple[int, ...]] = {"memory": (self.dim, m)}
        for block in BLOCKS:
            shapes[f"{block}.hidden_w"], shapes[f"{block}.hidden_b"] = (m, h), (h,)
        for name, shape in self.generated_shapes().items():
            n = int(np.prod(shape))
            shapes[f"{name}_w"], shapes[f"{name}_b"] = (h, n), (n,)
        return shapes

    @property
    def bytes_per_sample(self) -> int:
        """Activations of one sample: its row, the predictor's layer and their gradients."""
        return (2 * self.factors + 4 * self.width + 4) * FLOAT

    @property
    def bytes_per_client(self) -> int:
        """A client's copies of the shared weights: its parameters, a step's gradient and the
        autograd graph's (see the module docstring)."""
        return 3 * sum(int(np.prod(s)) for s in self.score_shapes().values()) * FLOAT

    @property
    def bytes_per_uncopied_client(self) -> int:
        """A client trained without copies (`FamilyState.train_uncopied`): its memory read,
        hidden layers and generated weights, their gradients and autograd's saved inputs."""
        return 3 * (self.dim + self.memory + len(BLOCKS) * self.hidden + self._generated_floats) * FLOAT

    @property
    def bytes_per_uncopied_step(self) -> int:
        """A step of a client's history there: each product's input and output gradient (the
        memory read, three hidden layers, five generated blocks)."""
        ins = self.dim + len(BLOCKS) * self.memory + len(self.generated_shapes()) * self.hidden
        outs = self.memory + len(BLOCKS) * self.hidden + self._generated_floats
        return (ins + outs) * FLOAT

    @property
    def _generated_floats(self) -> int:
        """Floats the hypernetwork generates for one user (`generated_shapes`)."""
        return sum(int(np.prod(s)) for s in self.generated_shapes().values())

    def create_state(self, n_clients: int, n_items: int, *, lr: float, lr_item: float,
                     item_std: float, seed: int, train: Any = None,
                     client_ids: Any = None):  # type: ignore[no-untyped-def]
        """A `FamilyState` initialised as the official code (module docstring); user vectors
        are drawn by client id (`fedrec.rounds.draws`), ``client_ids`` as in `FamilySpec`."""
        from fedrec.federated.family.personal import PersonalRows
        from fedrec.federated.family.state import FamilyState

        gen = torch.Generator().manual_seed(seed)
        items = here(torch.randn((n_items, self.item_width), generator=gen, device="cpu")) * item_std
        shared = {}
        for name, shape in self.score_shapes().items():
            shared[name] = _xavier(shape, gen) if len(shape) == 2 else torch.zeros(shape)
        for name, shape in self.generated_shapes().items():
            if len(shape) == 2:  # the generated matrix starts as a Xavier-initialised layer
                shared[f"{name}_b"] = _xavier(shape, gen).flatten()
        ids = np.arange(n_clients) if client_ids is None else np.asarray(client_ids)
        private = client_params(self, ["user"], ids, (seed, draws.INIT))
        return FamilyState(self, items, shared, private, lr, lr_item,
                           PersonalRows(n_items, self.item_width))

    def logits(self, p: dict[str, torch.Tensor], v: torch.Tensor) -> torch.Tensor:
        """Logits ``(C, B)`` of item rows ``v`` ``(C, B, factors)``; ``p`` holds the user vectors
        with a leading client axis, and each shared weight either with one (a client's copy, or
        an expanded view) or without (one weight for every client: `_per_client`)."""
        return self.logits_taped(p, v, None)

    def logits_taped(self, p: dict[str, torch.Tensor], v: torch.Tensor, tape: SharedTape | None) -> torch.Tensor:
        """`logits`, passing every product of a shared weight through ``tape`` (all of them take
        a per-client input: the user vector, its memory read or a hidden layer)."""

        def product(x: torch.Tensor, weight: str, bias: str | None = None) -> torch.Tensor:
            out = _per_client(x, p[weight], None if bias is None else p[bias])
            return out if tape is None else tape.product(weight, bias, x, out)

        c = product(p["user"], "memory")
        h = {b: F.relu(product(c, f"{b}.hidden_w", f"{b}.hidden_b")) for b in BLOCKS}

        def generated(block: str, name: str) -> torch.Tensor:
            return product(h[block], f"{block}.{name}_w", f"{block}.{name}_b")

        n = v.shape[0]
        w1 = generated("layer1", "weight").view(n, self.dim, self.width)
        b1 = generated("layer1", "bias")
        w2 = generated("layer2", "weight")
        b2 = generated("layer2", "bias")
        right = generated("items", "right").view(n, self.factors, self.dim)
        # e W1 = (V[j] R_u) W1 = V[j] (R_u W1): no (C, B, dim) item vectors are formed
        z = F.relu(torch.baddbmm(b1[:, None, :], v, torch.bmm(right, w1)))
        return torch.einsum("cbk,ck->cb", z, w2) + b2


def _xavier(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Xavier-normal draw: std sqrt(2 / (fan_in + fan_out)) for an ``(in, out)`` matrix."""
    return here(torch.randn(shape, generator=gen, device="cpu")) * (2.0 / sum(shape)) ** 0.5


def _per_client(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """``x[c] @ w[c] (+ b[c])`` for every client c: ``x`` ``(C, in)``, ``w`` ``(C, in, out)``;
    or ``x @ w (+ b)`` where ``w`` is ``(in, out)``, one weight for every client: one matrix
    product that reads the weight once, where ``bmm`` over an expanded weight (stride 0) reads it
    once a client (on Ciao's rounds those products were half the CPU time)."""
    if w.dim() == 2:
        return x @ w if b is None else torch.addmm(b, x, w)
    if b is None:
        return torch.bmm(x[:, None, :], w)[:, 0]
    return torch.baddbmm(b[:, None, :], x[:, None, :], w)[:, 0]
