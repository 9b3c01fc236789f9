"""``python -m bench``: run the bench, or redraw the report, or profile the router.

python -m bench                 full run (~10-15 min): results JSON, chart, docs table
python -m bench --quick         a few minutes, same shape, fewer/shorter rounds
python -m bench --smoke --results DIR --no-docs    seconds; what ``make test`` runs
python -m bench --workloads grpc    only some workloads (names or groups, as --help lists them)
python -m bench report [FILE]   redraw the table and chart from a results file (default: the latest full
                                run, with the latest full runs of the workloads it lacks)
python -m bench profile         py-spy on the router under load (needs py-spy)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import report, runner, targets

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "bench.md"
CHART = ROOT / "docs" / "img" / "bench.png"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def publish(results: dict, results_path: Path, *, docs: Path | None, chart_path: Path | None) -> None:
    """Print the table; write it between the bench markers of ``docs`` (docs/bench.md, the one page
    that carries it) and draw the chart, unless either is None."""
    derived = report.summarize(results)
    table = report.markdown(results, derived)
    print(table)
    if chart_path is not None:
        drawn = report.chart(results, derived, chart_path)
        _log(f"chart: {chart_path}" if drawn else "chart skipped: matplotlib not installed (the 'plot' extra)")
    if docs is not None and report.inject(docs, table):
        _log(f"table written into {docs}")
    _log(f"results: {results_path}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        return cmd_report(argv[1:])
    if argv[:1] == ["profile"]:
        from bench import profile

        return profile.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick", help="a few minutes")
    mode.add_argument("--smoke", action="store_const", dest="mode", const="smoke", help="seconds, no assertions")
    parser.add_argument(
        "--targets",
        default=",".join(targets.DEFAULT_TARGETS),
        help=f"comma-separated, from {','.join(targets.NAMES)} (default: %(default)s)",
    )
    parser.add_argument(
        "--workloads",
        help=f"comma-separated workloads or groups, from {','.join((*runner.WORKLOADS, *runner.WORKLOAD_GROUPS))} "
        "(default: all)",
    )
    parser.add_argument("--rounds", type=int, help="override the mode's number of rounds")
    parser.add_argument("--seconds", type=float, help="override the mode's measurement window")
    parser.add_argument("--results", type=Path, default=runner.RESULTS_DIR, help="where the JSON goes")
    parser.add_argument(
        "--no-docs",
        dest="docs",
        action="store_false",
        help="do not write the table into docs/bench.md, nor the chart into docs/img",
    )
    args = parser.parse_args(argv)
    plan = runner.plan_for(args.mode or "full", args.rounds, args.seconds)
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = set(names) - set(targets.NAMES)
    if unknown:
        parser.error(f"unknown target(s) {sorted(unknown)}; choose from {list(targets.NAMES)}")
    try:
        workloads = runner.select_workloads(args.workloads)
    except ValueError as exc:
        parser.error(str(exc))
    bench = runner.Bench(plan, names, _log, workloads)
    import uvloop

    results = uvloop.run(bench.run())
    results["derived"] = report.summarize(results)
    path = runner.write_results(results, args.results)
    chart_path = CHART if args.docs else args.results / (path.stem + ".png")
    # The docs table shows every workload: a run of some of them is shown beside the latest full
    # runs of the others.
    shown = report.with_missing(results, runner.RESULTS_DIR) if args.docs else results
    publish(shown, path, docs=DOCS if args.docs else None, chart_path=chart_path)
    return 0


def cmd_report(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench report")
    parser.add_argument("file", nargs="?", type=Path, help="results JSON (default: latest full run)")
    parser.add_argument("--no-docs", dest="docs", action="store_false")
    args = parser.parse_args(argv)
    paths = [args.file] if args.file else report.latest_set(runner.RESULTS_DIR)
    if not paths:
        _log("no results yet: run `make bench` first")
        return 1
    results = report.combine([json.loads(p.read_text()) for p in paths])
    publish(results, paths[0], docs=DOCS if args.docs else None, chart_path=CHART if args.docs else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
