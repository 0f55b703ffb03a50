"""Slots, and every transition of theirs: a fixed member's slots are created when it registers,
a dynamic member's on demand; the scheduler takes and assigns them, a task group that ends frees
its own. The slots of a member that is no longer ALIVE, or that is being drained (a planned
leave, engine.jobs.drain), are never taken again. ``tags`` (a job's ``tag_filter``) narrows
every question to the members whose tags hold each of its pairs.
"""

from __future__ import annotations

import psycopg
from django.db import connection, models, transaction
from django.db.models import Count, Exists, Max, OuterRef
from psycopg.types.json import Jsonb

from engine.models import Member, MemberDrain, Slot
from engine.states import DrainState, MemberState, SlotMode, SlotState


def _draining(member_ref: str = "pk") -> Exists:
    return Exists(
        MemberDrain.objects.filter(member_id=OuterRef(member_ref), state=DrainState.DRAINING)
    )


Tags = dict[str, str] | None


def matching(queryset: models.QuerySet, tags: Tags, field: str = "tags") -> models.QuerySet:
    """Members (or rows related to one through ``field``) whose tags hold every pair of
    ``tags``; all of them when there are none."""
    return queryset.filter(**{f"{field}__contains": tags}) if tags else queryset


def takers(tags: Tags = None) -> models.QuerySet:
    """Members that may be given new task groups: ALIVE, not being drained, and tagged as
    ``tags`` asks."""
    return matching(Member.objects.alive().exclude(_draining()), tags)


def create_fixed_slots(conn: psycopg.Connection, member_id: int, count: int) -> None:
    """A fixed member's ``count`` slots, created FREE in its registration transaction (on the
    member's own membership session, so no one sees the member without them)."""
    if count <= 0:
        return
    conn.execute(
        """
        INSERT INTO engine_slot (member_id, sequence, state)
        SELECT %s, s, %s FROM generate_series(1, %s) AS s
        """,
        (member_id, SlotState.FREE, count),
    )


def _lock_free(count: int, tags: Tags = None) -> list[tuple[int, int]]:
    """Lock up to ``count`` free slots of ALIVE members not being drained (and tagged as
    ``tags`` asks): [(slot id, member id)]."""
    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT s.id, s.member_id
              FROM engine_slot s JOIN engine_member m ON m.id = s.member_id
             WHERE m.state = %s AND s.state = %s
               AND NOT EXISTS (SELECT 1 FROM engine_memberdrain d
                                WHERE d.member_id = m.id AND d.state = %s)
               AND m.tags @> %s
             ORDER BY s.sequence, s.member_id
             LIMIT %s
               FOR NO KEY UPDATE OF s SKIP LOCKED
            """,
            [MemberState.ALIVE, SlotState.FREE, DrainState.DRAINING, Jsonb(tags or {}), count],
        )
        return [(row[0], row[1]) for row in cur.fetchall()]


def _create_dynamic(count: int, tags: Tags = None) -> list[tuple[int, int]]:
    """Create up to ``count`` new slots on dynamic-slot members, round-robin.

    A dynamic member with ``slot_count`` > 0 never has more than that many slot rows, so never
    more assigned; 0 means unbounded. Every row counts, FREE ones too: this is called only
    once ``_lock_free`` found too few, so each FREE row is locked already, by this take or by
    a concurrent one about to assign it. Members are locked (in id order) so concurrent calls
    cannot overshoot.
    """
    members = list(
        takers(tags)
        .select_for_update(no_key=True)
        .filter(slot_mode=SlotMode.DYNAMIC)
        .order_by("id")
    )
    if not members or count <= 0:
        return []
    top, rows = {}, {}
    for member_id, highest, n in (
        Slot.objects.filter(member__in=members)
        .values("member_id")
        .annotate(highest=Max("sequence"), n=Count("id"))
        .values_list("member_id", "highest", "n")
    ):
        top[member_id], rows[member_id] = highest, n
    room = {
        m.id: (m.slot_count - rows.get(m.id, 0)) if m.slot_count > 0 else count for m in members
    }
    created: list[Slot] = []
    while len(created) < count and any(r > 0 for r in room.values()):
        for member in members:
            if len(created) == count:
                break
            if room[member.id] <= 0:
                continue
            room[member.id] -= 1
            top[member.id] = top.get(member.id, 0) + 1
            created.append(Slot(member=member, sequence=top[member.id], state=SlotState.FREE))
    Slot.objects.bulk_create(created)
    return [(slot.id, slot.member_id) for slot in created]


class _TooFew(Exception):
    """Fewer slots than asked for: the take's savepoint is rolled back."""


def take(count: int, tags: Tags = None) -> list[tuple[int, int]] | None:
    """Lock ``count`` free slots (creating dynamic ones if needed), or None if there are not
    enough: then nothing is taken. The take runs in a savepoint of the caller's transaction,
    rolled back when it falls short, so neither the rows it created nor its locks outlive it
    (the caller commits its own writes, a pending reason say, all the same)."""
    if not connection.in_atomic_block:
        raise RuntimeError("take() needs the caller's transaction: its locks end with it")
    try:
        with transaction.atomic():
            slots = _lock_free(count, tags)
            if len(slots) < count:
                slots += _create_dynamic(count - len(slots), tags)
            if len(slots) < count:
                raise _TooFew
            return slots
    except _TooFew:
        return None


def assign(slot_ids: list[int]) -> None:
    """The taken slots now hold task groups (in the caller's transaction, which locked them)."""
    Slot.objects.filter(id__in=slot_ids).update(state=SlotState.ASSIGNED)


def free(slot_id: int) -> None:
    """The task group that held the slot ended."""
    Slot.objects.filter(id=slot_id).update(state=SlotState.FREE)


def capacity(tags: Tags = None) -> int | None:
    """How many slots the ALIVE members could ever give at once (None: unbounded, a dynamic
    member without a limit). A job needing more can never be scheduled as the cluster is."""
    total = 0
    for mode, count in takers(tags).values_list("slot_mode", "slot_count"):
        if mode == SlotMode.DYNAMIC and count <= 0:
            return None
        total += count
    return total


def free_count(tags: Tags = None) -> int:
    """FREE slots of ALIVE members not being drained, now (dynamic members' room not counted)."""
    free = Slot.objects.filter(state=SlotState.FREE, member__state=MemberState.ALIVE)
    return matching(free.exclude(_draining("member_id")), tags, "member__tags").count()
