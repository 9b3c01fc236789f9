"""drain-router: lossless pod termination for LLM model servers on Kubernetes.

Public facade: ``__version__`` and ``Config``. Layers, top to bottom (checked by import-linter,
see ``.importlinter``): ``router.cli`` > ``router.proxy`` | ``router.controller`` | ``router.tools``
> ``router.config``, ``router.metrics``, ``router.logs`` > ``router.decisions`` (pure, no I/O).

Nothing is imported eagerly: the entry point (:mod:`router.entry`) must be able to install its
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
        from router import config

        return getattr(config, name)
    raise AttributeError(f"module 'router' has no attribute {name!r}")
