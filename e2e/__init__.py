"""End-to-end tests: real processes on this machine (fake model, router replicas, HAProxy and Envoy).

They prove the product's claim, "no request lost across rolling restarts", and that the harness can
see a loss when the drain is off. Auto-marked ``e2e`` and run after everything else.
"""
