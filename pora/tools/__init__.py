"""Offline tools on a stopped node's data dir: inspection, verification, index
rebuild and journal replay, and their progress display."""
