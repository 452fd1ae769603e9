"""The node daemon's composition: `main` (start, wiring, shutdown), the NRI
handler, the local API (`local_api`, `local_server`), the status socket
(`status`) and the metrics endpoint (`metrics`)."""
