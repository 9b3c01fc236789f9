"""The ``drain-router`` entry point. Its first act records SIGTERM and SIGINT, before any other import.

It loads only :mod:`drain_router.early_signals` (which imports nothing but ``signal``) and installs
its recorder; only then does it load the command line and run it. The only window left is the
interpreter's own start, before this module runs.
"""

from drain_router import early_signals


def main() -> None:
    early_signals.install()
    from drain_router.cli import main as cli_main  # loaded only once the recorder is in place

    cli_main()
