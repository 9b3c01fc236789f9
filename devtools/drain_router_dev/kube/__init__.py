"""A real Kubernetes control plane on this machine, for the end-to-end proof and ``make cluster``.

``control_plane``: etcd, the API server, the controller manager, the scheduler and kube-proxy of one
release, built from Go modules (``cluster/``) and run as processes. ``node``: the stand-in for the
kubelet, pods as processes in network namespaces of their own. ``images``: what each image runs
here. ``network``: the node's bridge and the pods' namespaces. ``pki``: the certificates.
"""
