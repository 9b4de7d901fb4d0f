"""PyTorch scoring models shared by centralised baselines and federated algorithms."""
