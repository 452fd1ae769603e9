"""A client of containerd's own gRPC API (containers, namespaces, events), for
containers that containerd runs outside Kubernetes.  The bindings under
generated/ come from containerd's protos by scripts/gen-containerd.sh."""
