"""The ``drain-router`` entry point. Its first act records SIGTERM and SIGINT, before any import
(:mod:`drain_router.early_signals`), then it runs the command line. The only window left is the
interpreter's own start, before this module runs."""

from drain_router import early_signals


def main() -> None:
    early_signals.install()
    from drain_router.cli import main as cli_main  # everything else is imported after the recorder

    cli_main()
