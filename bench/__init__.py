"""bench: what the router costs, measured side by side with direct, nginx, HAProxy, Envoy and Traefik.

Run as ``python -m bench`` (``make bench``). Not part of the router package and never imported by
it: the harness starts the router as a separate process, like any other target, so it measures
exactly what a user would run. Modules:

- ``upstream``: the stand-in model server (raw asyncio protocol on uvloop).
- ``loadgen``: the aiohttp load generator that sees SSE like a client (TTFB, inter-chunk gaps), and
  the wrk wrapper for plain request/response workloads.
- ``targets``: how each target is configured, started, probed and stopped.
- ``procstat``: CPU and memory of a process tree, through psutil.
- ``harness``: the plan, the upstream and targets of a run, one measured cell, and what a workload
  declares (``Workload``: its name, group, steps and needs).
- ``workloads``: every workload in run order, from the ``WORKLOADS`` of the modules that measure
  them (``http_workloads``, ``ws_workloads``, ``grpc_workloads``, ``drain_workload``, ``overload``,
  ``tracing_overhead``, ``activator_cost``); ``--workloads`` and the report's groups come from it.
- ``runner``: the interleaved rounds (each selected workload's steps in turn) and the results file.
- ``report``: the ratios, the goals, the markdown table and the chart.
- ``profile``: py-spy on the router under load, summarised by frame.
- ``overload``: the fake engine past its capacity behind the router's admission control, Envoy's
  circuit breakers and nginx's ``limit_conn`` (``python -m bench.overload``), with
  ``overload_targets`` (the bounds),
  ``overload_stats`` (its arithmetic) and ``overload_report`` (its goals and table).
"""
