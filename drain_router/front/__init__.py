"""``drain-router front``: one service's front, for the streams that outlive their pod. The user's
route points at it instead of the model's Service; it spreads requests over the service's ready pods
by requests in flight, leaves a pod at its router's first ``Connection: close``, retries on another
pod a request a pod's router refused before the model server saw it (never a 429), holds requests
while no pod is ready and asks for a wake, and continues a cut stream on another pod, spliced into
the same response.

Layered above :mod:`drain_router.http1`, whose traffic path it reuses: the router's listener, client
connections and exchanges, with one destination (:mod:`.site`) and an exchange of its own
(:mod:`.exchange`). What it decides is in :mod:`drain_router.decisions.front` and
:mod:`drain_router.decisions.continuation` (pure); here is the I/O: the pods (:mod:`.pods`), the
watcher of the pods and the API server (:mod:`.watch`), the process (:mod:`.process`) and its command
(:mod:`.command`).
"""
