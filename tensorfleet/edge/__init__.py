"""tensorfleet.edge (see its README section)."""
