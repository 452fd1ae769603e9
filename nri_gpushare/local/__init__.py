"""The daemon's local API: how containers that NRI never sees (ctr, nerdctl,
docker, podman) get a GPU share from the one daemon that owns every
allocation.

- `protocol`: the messages and their framing (sans-IO, JSON, bounded).
- `client`: the blocking stdlib client the CDI hook and gpushare-runc use
  (imports nothing heavy: they sit in every container start).
- `oci`: reading OCI state and bundles, and editing a bundle's config.json
  with an injection plan (pure).
- `server`: the asyncio unix-socket server in the daemon (root-only).
"""
