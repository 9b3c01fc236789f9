"""drain-router: lossless pod termination for LLM model servers on Kubernetes.

Public facade: ``__version__`` and ``Config``. Layers, top to bottom (checked by import-linter,
see ``.importlinter``): ``router.cli`` > ``router.proxy`` | ``router.controller`` | ``router.tools``
> ``router.config``, ``router.metrics``, ``router.logs`` > ``router.decisions`` (pure, no I/O).
"""

from importlib.metadata import PackageNotFoundError, version

from router.config import Config, ConfigError, build_config

try:
    __version__ = version("drain-router")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"

__all__ = ["Config", "ConfigError", "__version__", "build_config"]
