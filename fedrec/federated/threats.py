"""The attacks and defences a run can name (`fedrec.federated.engine.FederatedConfig`'s
``attack`` and ``defence``): the vocabulary the engine's config checks. What they do is in the
security layer above the engine (`fedrec.security`), which plugs them into a round's upload
stage (`fedrec.security.adversary.attach`) and checks its names against these same tuples."""

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
