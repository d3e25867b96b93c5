"""Federated clients: partitioning a dataset, client data in memory or made lazily, named
datasets and Byzantine clients."""
