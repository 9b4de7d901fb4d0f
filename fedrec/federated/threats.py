"""The attacks and defences a run can name (`fedrec.federated.engine.FederatedConfig`'s
``attack`` and ``defence``): the vocabulary the engine's config checks. What they do is in the
security layer above the engine (`fedrec.security`), which plugs them into a round's upload
stage (`fedrec.security.adversary.attach`) and checks its names against these same tuples."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: poisoning attacks (`fedrec.security.attacks.Attack`)
ATTACKS = ("fedrecattack", "a-ra", "a-hum", "pipattack", "pieck-ipe", "pieck-uea", "poisonfrs", "boost", "random", "bandwagon",
           "popular", "fedattack", "clusterattack")
#: attacks that mine popular items from one table's movement over rounds
#: (`fedrec.security.attacks.Attack.mine`, `Attack.goal`)
MINING = ("pieck-ipe", "pieck-uea", "poisonfrs")
#: attacks with no target item (they degrade the model as a whole)
UNTARGETED = ("fedattack", "clusterattack")
#: robust aggregation rules (`fedrec.security.robust.RobustRule`)
DEFENCES = ("norm-bound", "median", "trimmed-mean", "krum", "multi-krum", "union", "mean")
#: where UNION judges a client's table (`FederatedConfig.union_step`, `fedrec.security.robust`)
UNION_STEPS = ("share", "server")

#: How a server moves its item table's rows, as UNION judges one client (`fedrec.security.robust`):
#: given the current ``rows`` (float64), their row ids ``at`` in the table, and one client's
#: ``change`` of them (None: no client's), the rows after the server's step from that client's
#: upload alone: an Adam server's step with the change as the round's
#: (`fedrec.federated.dae.state.TableView.adam_rows` of FedDAE,
#: `fedrec.federated.family.server_opt.Adam.row_step` of a server optimiser), an averaging
#: server's share of it (`fedrec.security.robust.share`). It changes no state of the server's.
RowStep = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None"], torch.Tensor]
