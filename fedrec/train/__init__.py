"""Training loops: centralised baselines here; the federated engine builds on the same pieces."""
