"""Host adapters: the machine's device nodes and NVML (`devices`), the
driver's own limits (`driver_limits`), files written atomically
(`statefile`), unix sockets (`sockets`) and containerd's own API
(`containerd`)."""
