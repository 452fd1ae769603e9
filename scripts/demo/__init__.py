"""The local demo (`make demo`, and `make demo-kernel` in the qemu guest):
GPU sharing on a private containerd, no GPU needed.

1. a private containerd 1.7.24 with CRI and NRI and `nri-gpushare run` on a
   simulated inventory of two 16 GiB GPUs (`bed.py`);
2. the control plane: pods that get shares, `status`, a refusal, the
   decision log, metrics (`control.py`);
3. isolation enforced and measured on the tests' fake CUDA driver, whose
   simulated GPU every process shares through FAKECUDA_GPU_STATE (`pods.py`):
   a pod held to `gpu-memory: 1Gi`, and pods at `gpu-core: 30` and `60` (and
   one with none) whose shares of the GPU's time are measured from the
   simulated GPU's own record (`measure.py`) and checked (`checks.py`);
4. `gpushare-smi` showing the memory used and the GPU time measured.

The demo is also a smoke test: it exits 1 with one line naming the check
when a quota does not hold or a share is off its target (`make test` runs
it).  `make demo` runs standalone (no kernel module); `make demo-kernel`
(`kernel.py`) runs the same inside the qemu guest with gpushare.ko loaded.
"""
