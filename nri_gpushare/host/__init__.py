"""Host adapters: the machine's device nodes and NVML (`devices`), the
driver's own limits (`driver_limits`), files written atomically
(`statefile`), unix sockets (`sockets`), containerd's own API
(`containerd`), blocking calls off the event loop (`worker`) and the kernel
module and its meminfo read through it (`kmod_worker`, `meminfo`)."""
