"""The ``tensorfleet`` command: one module per command group (see :mod:`tensorfleet.cli.main`)."""

__all__: list[str] = []
