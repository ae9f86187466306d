"""`pora node decommission ADDRESS --metadata URL`: the node marked draining, every
fragment it holds re-replicated elsewhere, and whether it may be stopped
(docs/rereplication.md, A14).

`--json` prints the re-replication's events as `pora rereplicate --json` does, then
`{"event": "decommission", "node": ADDRESS, "may_stop": bool,
"fragments_left": [{"ledger": int, "first_entry": int}, ...]}`.
"""

from __future__ import annotations

import argparse

from pora.cli._common import (
    EXIT_OK,
    EXIT_PROBLEMS,
    EXIT_REFUSED,
    CommandError,
    command,
    print_json_line,
)
from pora.cli._metadata import add_metadata_argument
from pora.cli.rereplicate import add_worker_arguments, event_printer, in_cluster, worker_options
from pora.cluster_ops.inventory import live_nodes
from pora.cluster_ops.session import (
    Cluster,
    DrainState,
    decommission,
    fragments_on,
    undo_decommission,
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "node",
        help="act on one node of the cluster (decommission)",
        description="Act on one node of the cluster through its metadata store.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    drain = actions.add_parser(
        "decommission",
        help="move every copy off a node so that it may be stopped",
        description="Mark the node draining (no new ledger, ensemble change or "
        "re-replication puts anything on it), re-replicate every fragment it holds to "
        "other nodes, and say whether it holds anything still needed. Run it again "
        "until it says the node may be stopped (an open ledger's last fragment moves "
        "when its writer changes ensembles or after --open-grace-s). Exit status 0 "
        "when the node may be stopped, 1 otherwise.",
    )
    drain.add_argument("address", metavar="ADDRESS", help="the node's address, host:port")
    add_metadata_argument(drain, required=True)
    drain.add_argument(
        "--undo", action="store_true", help="remove the draining mark (copies already moved stay)"
    )
    add_worker_arguments(drain)
    drain.set_defaults(run=run_decommission)


@command
def run_decommission(args: argparse.Namespace) -> int:
    address: str = args.address

    async def work(cluster: Cluster) -> DrainState | bool:
        if args.undo:
            return await undo_decommission(cluster, address)
        if address not in await live_nodes(cluster.store) and not await fragments_on(
            cluster.store, address
        ):
            raise CommandError(
                f"no node is registered at {address} and no ledger names it: check the "
                "address (`pora nodes --metadata URL` lists them)",
                EXIT_REFUSED,
            )
        return await decommission(cluster, address, worker_options(args), event_printer(args.json))

    state = in_cluster(args.metadata, work)
    if isinstance(state, bool):
        print(f"{address}: draining mark {'removed' if state else 'was not set'}")
        return EXIT_OK
    left = [{"ledger": ledger, "first_entry": first} for ledger, first in state.fragments_left]
    if args.json:
        print_json_line(
            {
                "event": "decommission",
                "node": address,
                "may_stop": state.done,
                "fragments_left": left,
            }
        )
    elif state.done:
        print(f"{address} holds nothing any ledger needs: it may be stopped")
    else:
        named = ", ".join(
            f"ledger {ledger} from entry {first}" for ledger, first in state.fragments_left[:10]
        )
        more = " ..." if len(left) > 10 else ""
        print(
            f"{address} is draining; {len(left)} fragments still name it "
            f"({named}{more}): run this again"
        )
    return EXIT_OK if state.done else EXIT_PROBLEMS
