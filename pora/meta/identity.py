"""What both backends share about the cluster's identity and the nodes' marks: how a
cluster id is made and which marks a store accepts (docs/metadata.md, "Cluster
identity and node marks")."""

from __future__ import annotations

import uuid

from pora.meta.errors import InvalidMetadata

#: an instance id is a data dir's uuid4 hex; a store keeps marks for ids of at most this
INSTANCE_ID_CHARS_MAX = 64


def new_cluster_id() -> str:
    """A random id: two stores set up apart never share one."""
    return uuid.uuid4().hex


def check_node_mark(instance_id: str, mark: int) -> None:
    """Raise InvalidMetadata for a mark no backend may store."""
    if (
        not instance_id
        or len(instance_id) > INSTANCE_ID_CHARS_MAX
        or not instance_id.isascii()
        or not instance_id.isalnum()
    ):
        raise InvalidMetadata(
            f"a node mark needs an instance id of 1 to {INSTANCE_ID_CHARS_MAX} letters and "
            f"digits, not {instance_id!r}"
        )
    if type(mark) is not int or mark < 0:
        raise InvalidMetadata(f"node {instance_id}: a mark is an int >= 0, not {mark!r}")
