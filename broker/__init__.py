"""hybrid-broker: the broker service and the unified model it shares with every other package.

This package stays light: importing ``broker`` (as the edge agent does, for ``broker.model`` and
``broker.errors``) pulls no third-party module. The service lives in submodules (``broker.app``,
``broker.scheduler``, ``broker.store``...).
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
