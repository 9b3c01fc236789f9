"""The controller's Kubernetes I/O: the client's reads and writes (each write with the ownership
rule's consent), observations built from reads, workloads, and where a kind lives."""
