"""tensorfleet.federated (see its README section)."""
