"""drain-router's development tools, a distribution of their own (``pip install ./devtools``): a
stand-in OpenAI-compatible model server, a stand-in Kubernetes API for the activator, load
generators, balancer configurations and the rolling-restart demo.

None of it runs in a cluster, so none of it is in the ``drain-router`` wheel or the image. The tools
use the router only as a user would: separate processes driven by flags and signals.
"""
