"""Demo and test tools shipped with the package: a stand-in streaming model server and the demo.

They use the router only as a user would: as separate processes driven by flags and signals.
"""
