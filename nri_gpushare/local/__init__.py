"""The daemon's local API: how containers that NRI never sees (ctr, nerdctl,
docker, podman) get a GPU share from the one daemon that owns every
allocation.

- `protocol`: the messages and their framing (sans-IO, JSON, bounded).
- `client`: the blocking stdlib client the CDI hook and gpushare-runc use
  (imports nothing heavy: they sit in every container start).
- `oci`: reading OCI state and bundles, and editing a bundle's config.json
  with an injection plan (pure); `oci_json` and `oci_plan` check the JSON
  it reads and the plan it puts in.
- `runc_wrapper` and `hook`: gpushare-runc and the CDI hooks, which run in
  every container start (the standard library only, so they start fast);
  `runc_args` reads runc's command line, `real_runc` runs the real one.

The asyncio server in the daemon is `nri_gpushare.daemon.local_server`.
"""
