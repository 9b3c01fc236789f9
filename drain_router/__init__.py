"""drain-router: lossless pod termination for LLM model servers on Kubernetes.

Public facade: ``__version__`` and ``Config``. Layers, top to bottom (checked by import-linter,
see ``.importlinter``): ``drain_router.cli`` > ``drain_router.proxy`` | ``drain_router.controller``
> ``drain_router.config``, ``drain_router.metrics``, ``drain_router.logs`` > ``drain_router.decisions`` (pure, no I/O).

Nothing is imported eagerly: the entry point (:mod:`drain_router.entry`) must be able to install its
signal recorder before anything slow is loaded.
"""

from typing import Any

__all__ = ["Config", "ConfigError", "__version__", "build_config"]


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("drain-router")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
            return "0.0.0"
    if name in ("Config", "ConfigError", "build_config"):
        from drain_router import config

        return getattr(config, name)
    raise AttributeError(f"module 'drain_router' has no attribute {name!r}")
