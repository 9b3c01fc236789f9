"""``drain-router activator``: holds the requests of ModelServices scaled to zero, asks for a wake,
and forwards them in arrival order once a pod's router answers ready ("Waking on a request").

Layered above :mod:`drain_router.proxy`, whose traffic path it reuses: the router's listener, client
connections and exchanges, with one destination per service (:mod:`.sites`: a held queue, a
:class:`~drain_router.admission.gate.Gate` of 0 slots until a pod is ready, and an upstream pool to
that pod). What it decides is in :mod:`drain_router.decisions.activator` (pure); here is the I/O:
the Kubernetes API and the pods' routers (:mod:`.kube`, :mod:`.waking`), the process (:mod:`.process`)
and its command (:mod:`.command`). It never imports kopf.
"""
