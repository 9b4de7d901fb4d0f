"""Security of federated recommendation: poisoning attacks by malicious clients
(`attacks`), per-row robust aggregation (`robust`), the exposure of target items
(`exposure`), and their place in a round (`adversary`). docs/security.md has the figures."""
