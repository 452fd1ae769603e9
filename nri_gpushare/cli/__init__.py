"""Commands: `nri-gpushare` (`main`), `gpushare-smi` (`smi`) and the
Kubernetes device plugin's entry (`device_plugin`)."""
