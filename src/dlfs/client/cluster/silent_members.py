"""Which members a striped ingest or replace goes to, when some of them are gone.

A daemon killed without a goodbye stays in the member list until its lease
in etcd expires (its --member-lease-ttl-s after its last keepalive).  A
change that opened a stream to it would fail on a member the cluster is
about to drop, so before a striped ingest or replace each member is asked
once for its status (no retry) and `members_for_change` decides:

- every member answers: all of them;
- some are silent and the others number at least the replicas asked for:
  the others (placement over them alone is what the cluster holds once the
  silent ones' leases expire) — *proceeded*;
- else: wait until each silent member answers again or leaves the member
  list (at most its lease's TTL and `limits.silent_member_wait_margin_s`),
  then all that are left — *waited*.

Either way a warning says which (the CLI prints it as `dlfs: warning:`).
"""

from __future__ import annotations

import logging

from dlfs import limits
from dlfs.errors import DlfsError, Unavailable

log = logging.getLogger(__name__)


def silent(router, members: list[str]) -> list[str]:
    """Of `members`, those that do not answer a status call now (one try each, in
    parallel): killed, or their host unreachable."""
    futures = {a: router.submit(lambda m: m.control.status(retry=False), router.member(a))
               for a in members}
    quiet = []
    for address, future in futures.items():
        try:
            future.result()
        except Unavailable:
            quiet.append(address)
        except DlfsError:
            pass  # it answered, with an error of its own
    return quiet


def members_for_change(router, replicas: int, what: str) -> list[str]:
    """The members a striped `what` ("ingest of NAME", "replace of NAME") goes to: the
    live ones, less those that are silent and about to leave (see the module's
    docstring).  Raises Unavailable when no member is left."""
    members = list(router.addresses)
    quiet = silent(router, members)
    if not quiet:
        return members
    answering = [a for a in members if a not in quiet]
    state = router.view.state
    ttl_s = max((state.members[a].lease_ttl_s or limits.member_lease_ttl_s_default)
                for a in quiet if a in state.members)
    if answering and len(answering) >= replicas:
        log.warning("the %s goes to the %d members that answer: %s does not (its lease in "
                    "etcd ends within %d s, and the cluster drops it then)", what,
                    len(answering), _names(quiet), ttl_s)
        return answering
    log.warning("%s does not answer; the %s waits up to %d s for %s to answer again or "
                "for its lease in etcd to end", _names(quiet), what,
                ttl_s + limits.silent_member_wait_margin_s,
                "it" if len(quiet) == 1 else "them")

    started = {a: state.members[a].started_unix_ns for a in quiet if a in state.members}

    def settled(cluster_state) -> bool:
        """Each silent member left the list, or registered again (it restarted)."""
        now = cluster_state.members
        return all(a not in now or now[a].started_unix_ns != started.get(a) for a in quiet)

    router.view.wait_for(settled, ttl_s + limits.silent_member_wait_margin_s)
    members = list(router.view.members())
    back = [a for a in quiet if a in members]
    still = silent(router, back) if back else []
    members = [a for a in members if a not in still]
    if not members:
        raise Unavailable(f"no member of {router.address} answers: start the daemons")
    log.warning("the %s goes to %d members (%s)%s", what, len(members), ", ".join(members),
                f"; {_names(still)} still does not answer" if still else "")
    return members


def _names(addresses: list[str]) -> str:
    return ", ".join(addresses) if len(addresses) < 4 else \
        f"{', '.join(addresses[:3])} and {len(addresses) - 3} more"
