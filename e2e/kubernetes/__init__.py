"""The proof on a real Kubernetes control plane: the charts installed with the real helm into a real
API server, the real controllers and scheduler, pods run by the stand-in node agent."""
