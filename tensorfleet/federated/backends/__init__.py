"""Where a simulation's rounds run: ``tff`` (TFF's runtime on a worker tensorfleet owns),
``remote`` (rounds split across TFF workers), ``worker`` (one such worker), ``compiled`` (a
whole round as one TensorFlow function) and ``k8s`` (workers on Kubernetes)."""
