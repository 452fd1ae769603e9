"""The share domain: requests, placement, allocations, injection plans.

Plain values in, plain values out: nothing here knows NRI, protobuf, sockets,
YAML, Kubernetes or the host.  The daemon builds `model.ContainerInfo`,
`model.Gpu` and `model.NodePolicy` values, wires in the host's device nodes
(`nri_gpushare.host.devices`) and the kernel module (through the port in
`kernel`), and turns a `model.InjectionPlan` into a ContainerAdjustment.
"""
