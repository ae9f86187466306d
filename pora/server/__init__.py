"""The node daemon: the network server that puts the wire protocol (`netio`) in front
of a node, and what `pora serve` runs around it: settings, metrics, the disk
watcher, logs."""
