"""The two steps that end offsets on purpose: a topic delete (then re-create) and an
archive retention cut. Each is a function of the running :class:`Scenario`, called by its
``step_delete_recreate`` / ``step_archive_retention``.

**Delete and re-create** (``tiered/lifecycle/delete.py``, docs/LIFECYCLE.md "Delete,
re-create", docs/SAFETY.md "Deleting a topic"). Variants (``how``): ``clean`` (the
owner's host deletes: it seals first), ``paused`` (another broker deletes while the owner
still runs, a zombie that has not noticed: it may write a few messages meanwhile and must
acknowledge nothing once a write of it was refused), ``crashed`` (the owner died unsealed,
keeping its disk; another broker deletes). Optionally a reader is open across it (on the
owner, or an archive-only reader), the deleting broker dies after a step of the delete
(``crash_at``; the delete must then stay refused and a re-run finish it), and the name is
re-created on any broker (the old owner, the deleter or another). Invariants:

* ``delete-complete``: the tombstone ends in phase ``deleted``; no descriptor and no object
  of the topic is left; a re-run after a crash mid-delete reports ``resumed``;
* ``delete-refuses``: while deleting or deleted, a load (even with ``create``), a create
  (while ``deleting``) and a new reader are refused with ``TopicDeleted``;
* ``recreate-continues``: the re-created topic takes ownership at an epoch above the
  tombstone's and starts at the tombstone's ``next_offset``, which is never below what
  metadata knew of the deleted incarnation (its archive end, its published durable tip,
  its lost ranges; after a clean delete, the sealed tip itself) and, after a clean
  delete, not above the sealed tip or a lost range's end; offsets below it are
  ``OffsetBelowArchiveStart``;
* ``incarnation-isolation``: no message of the deleted incarnation is ever served under
  the name again (by the new incarnation's readers, final read included), a reader opened
  before the delete never serves a message of the new incarnation, and a returning dead
  owner's WAL of the deleted incarnation is never recorded as a loss of the new one
  (``lost-range-exact`` at the end);
* ``fenced-refuses``: the paused old owner, once a write of it was refused, acknowledges
  nothing more.

The model then starts over (:meth:`TopicModel.next_incarnation`): facts, subscriptions
(their cursors were deleted) and takeovers belong to the deleted incarnation.

**Archive retention** (``uploader/archive_retention.py``, ``tiered/archive/start.py``). The
owner's uploader runs one cut under a policy the step sets for that pass (``bytes``: keep
a fraction of the retained bytes; ``age``: age 0, so everything but the tip is due), maybe
dying after raising the start or after deleting the descriptors (the same broker reloads,
and its first pass must finish the cut). Invariants:

* ``retention-bounded``: the new start is exactly the one the policy asks for, computed
  here from the retained descriptors (oldest first, while the retained bytes exceed the
  limit or the descriptor is too old, never the tip): never past it (no acknowledged
  message the policy did not ask for is cut), never short of it, never back; offsets
  below it are ``OffsetBelowArchiveStart`` naming it, a subscription whose cursor it
  passed resumes there, and nothing below it is ever served;
* ``retention-resumes``: no descriptor wholly below the start is left after the owner's
  next pass (the same broker's, or after a crash mid-cut the reloaded one's);
* ``contiguous-offsets`` / ``unique-offsets``: everything at or above the start is read
  once, in order, each offset holding the message the model knows.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tiered.archive import last_committed_offset, list_descriptors
from tiered.archive.naming import topic_objects_prefix
from tiered.archive.start import OffsetBelowArchiveStart, archive_start
from tiered.errors import TopicDeleted
from tiered.lifecycle.ownership import OwnershipLostError
from tiered.lifecycle.restore import read_progress
from tiered.metadata import keys
from tiered.metadata.keys import ObjectDescriptor
from tiered.read.reader import create_reader, read_messages
from tiered.tools.harness.cluster import WAIT_BOUND_S, HarnessCrash
from tiered.tools.harness.model import TopicModel, Violation, check
from tiered.tools.harness.schedule import Step
from uploader.config import ArchiveRetentionConfig

#: Exceptions a reader opened before a delete may end with (anything typed, not a violation).
READ_ENDS = (Exception,)


# -- delete and re-create -------------------------------------------------------------

def delete_recreate(sc: Any, step: Step, index: int) -> None:
    args = step.args
    cluster, md = sc.cluster, sc.cluster.inner_metadata
    topic = sc.cluster.topic
    how = args["how"]
    old_owner, old_hosted, old = sc.owner, sc.hosted(), sc.model
    deleter = old_owner if how == "clean" else sc.other_broker(args["deleter"])
    reader = _open_reader(sc, args["reader"], old_hosted, index)

    # What metadata knows of the deleted incarnation, read before the delete: the
    # tombstone's next offset may only be higher (a zombie may publish more meanwhile).
    archive_end = last_committed_offset(md, topic)
    progress = read_progress(md, topic)
    lost_ranges = keys.read_lost_ranges(md, topic)
    lower = max([old.incarnation_first, 0 if archive_end is None else archive_end + 1,
                 max(old.archived_acked, default=-1) + 1]
                + ([progress.durable_offset + 1] if progress is not None and progress.durable_offset is not None
                   else [])
                + [r.start_offset if r.end_offset is None else r.end_offset + 1 for r in lost_ranges])
    old_next = old_hosted.next_offset
    upper: int | None = None
    if how == "clean":
        # A seal names the WAL tip: everything appended is the deleted incarnation's.
        lower = max(lower, old_next)
        upper = max([old_next] + [t.dead_tip + 1 for t in sc.takeovers if t.dead_tip is not None]
                    + [r.end_offset + 1 for r in lost_ranges if r.end_offset is not None])
    elif how == "crashed":
        cluster.crash(old_owner)  # dies unsealed; its disk stays (the broker comes back later)
        sc.returning.append(old_owner)

    report = _delete(sc, deleter, args["crash_at"], args["recreate_on"], index)
    tomb, _raw = keys.read_tombstone(md, topic)
    check(tomb is not None and tomb.phase == "deleted", "delete-complete",
          f"after the delete by b{deleter} ({report.outcome}) the tombstone is {tomb}")
    assert tomb is not None
    first = tomb.next_offset
    check(report.next_offset == first, "delete-complete",
          f"the delete reported next offset {report.next_offset}, its tombstone says {first}")
    check(first >= lower, "recreate-continues",
          f"the tombstone's next offset {first} is below {lower}, what metadata knew of the deleted "
          f"incarnation (archive end {archive_end}, published {progress}, lost ranges {lost_ranges}"
          + (f", sealed tip {old_next - 1})" if how == "clean" else ")"))
    check(upper is None or first <= upper, "recreate-continues",
          f"after a clean delete the tombstone's next offset {first} is past the sealed tip {old_next - 1} "
          f"and every lost range (bound {upper})")
    check(not list_descriptors(md, topic), "delete-complete", "descriptors are left after the delete")
    left = [o.key for o in cluster.inner_objects.list(topic_objects_prefix(topic))]
    check(not left, "delete-complete", f"objects are left after the delete: {left[:3]}")
    _refused(lambda: create_reader(topic, None, md, cluster.inner_objects, "earliest", live=False),
             "a new reader of the deleted topic")
    target = args["recreate_on"]
    if not (how == "paused" and target == old_owner):
        # (Not on the paused owner's own host: a load there re-reads the owner record and
        # fences the copy it still runs, which the zombie steps below need unfenced.)
        _refused(lambda: cluster.host(target).load(topic, create=True), f"a load with create on b{target}")

    if how == "paused":
        _zombie_writes(sc, old_hosted, old, args["zombie_writes"], index)

    hosted, created = cluster.host(target).create(topic)
    check(created, "recreate-continues", f"create on b{target} of the deleted name reports it existed")
    check(hosted is not old_hosted, "incarnation-isolation",
          f"create on b{target} returned the deleted incarnation's copy still hosted there")
    check(hosted.token.epoch > tomb.epoch, "recreate-continues",
          f"the re-created topic is owned at epoch {hosted.token.epoch}, not above the deleted one's {tomb.epoch}")
    check(hosted.next_offset == first, "recreate-continues",
          f"the re-created topic starts at {hosted.next_offset}, the tombstone says {first}")
    after, _ = keys.read_tombstone(md, topic)
    check(after is not None and after.phase == "recreated" and after.next_offset == first, "recreate-continues",
          f"after the create the tombstone is {after}")
    sc.owner = target
    sc.model = old.next_incarnation(first)
    # The deleted incarnation's takeovers (and their lost ranges) are gone with it; their
    # dead brokers still come back (at the latest in the final checks), and what their
    # stale WALs held must then be recorded as nothing of the new incarnation.
    sc.returning.extend(t.dead for t in sc.takeovers)
    sc.takeovers = []
    sc.note(f"step {index}: {how} delete by b{deleter} ({report.outcome}, epoch {tomb.epoch}, next offset "
            f"{first}); re-created on b{target} at epoch {hosted.token.epoch}")

    if how == "paused":
        _zombie_learns(sc, old_hosted, old_owner, args["learns_by"], index)
    # The new incarnation gets messages (archived too) before the old reader goes on.
    sc.step_produce(Step("produce", {"count": 2, "ack": "archived"}), index)
    if reader is not None:
        _drain_old_reader(sc, reader, old, index)
    sc.check_descriptors()
    sc.check_below_start_refused(sc.hosted(), "after the re-create")
    got = read_messages(sc.hosted().create_reader("earliest", live=False), None)
    offsets = [m.offset for m in got]
    check(offsets == list(range(first, sc.hosted().next_offset)), "contiguous-offsets",
          f"the re-created topic reads {offsets}, expected from {first}")
    for m in got:
        sc.model.observed(m.offset, m.payload, "a read of the re-created topic")


def _open_reader(sc: Any, kind: str | None, hosted: Any, index: int) -> Any:
    """A reader opened before the delete that read a message or two of the old incarnation."""
    if kind is None:
        return None
    cluster = sc.cluster
    if kind == "owner":
        reader = hosted.create_reader(sc.model.start, live=False)
    else:  # an archive-only reader (a broker that does not host the topic)
        reader = create_reader(cluster.topic, None, cluster.inner_metadata, cluster.inner_objects,
                               sc.model.start, live=False)
    for _ in range(2):
        try:
            m = next(reader)
        except StopIteration:
            break
        sc.model.observed(m.offset, m.payload, f"a {kind} reader before the delete")
    return reader


def _delete(sc: Any, deleter: int, crash_at: str | None, target: int, index: int) -> Any:
    """Delete through ``deleter``'s host; with ``crash_at`` it dies after that step, the
    delete must stay refused, and the rebuilt host's re-run must finish it (``resumed``)."""
    cluster, topic = sc.cluster, sc.cluster.topic

    def hook(step_name: str) -> None:
        if step_name == crash_at:
            raise HarnessCrash(f"injected broker crash after delete step {step_name!r}")

    try:
        return cluster.host(deleter).delete(topic, fault_hook=hook if crash_at else None)
    except HarnessCrash:
        pass
    tomb, _raw = keys.read_tombstone(cluster.inner_metadata, topic)
    check(tomb is not None and tomb.phase == "deleting", "delete-refuses",
          f"b{deleter} died after delete step {crash_at!r}; the tombstone is {tomb}")
    cluster.crash(deleter)
    _refused(lambda: cluster.host(target).create(topic), f"a create on b{target} while the delete is unfinished")
    _refused(lambda: create_reader(topic, None, cluster.inner_metadata, cluster.inner_objects, "earliest",
                                   live=False), "a new reader while the delete is unfinished")
    report = cluster.host(deleter).delete(topic)
    check(report.outcome == "resumed", "delete-complete",
          f"the re-run after a crash at {crash_at!r} reports {report.outcome}, not resumed")
    sc.note(f"step {index}: b{deleter} died after delete step {crash_at!r}; its re-run resumed")
    return report


def _refused(attempt: Any, what: str) -> None:
    try:
        attempt()
    except TopicDeleted:
        return
    raise Violation("delete-refuses", f"{what} was not refused with TopicDeleted")


def _zombie_writes(sc: Any, zombie: Any, old: TopicModel, count: int, index: int) -> None:
    """The paused old owner, not knowing yet, writes: within the documented bound (a
    zombie's durable acks past its last published tip), and all of the deleted incarnation."""
    for _ in range(count):
        payload = old.next_payload(sc.seed)
        try:
            offset = zombie.append(payload)
        except Exception as e:  # noqa: BLE001 - refusing is what it should do once it knows
            sc.note(f"step {index}: the paused old owner's append was refused: {type(e).__name__}")
            old.retired[payload] = -1
            return
        old.appended(offset, payload)


def try_a_write(stale: Any, how: str) -> BaseException | None:
    """One write of a stale owner's copy, of the kind ``how`` ("progress", "upload", or
    else a cursor write): what it raised (its refusal is how the copy learns it lost the
    topic), or None when it went through or had nothing to write."""
    try:
        if how == "progress":
            stale.publish_progress()
        elif how == "upload":
            stale.uploader.upload_once()
        else:
            stale.subscriptions.subscribe("stale-probe", "earliest")
    except Exception as e:  # noqa: BLE001 - the refusal is how it learns
        return e
    return None


def stale_owner_learns(stale: Any, how: str, note: Callable[[str], None], who: str, why: str) -> None:
    """The stale owner ``who`` learns it lost the topic: one write of the kind ``how``
    (``try_a_write``), noted when refused; when nothing was there to write (no new tip,
    nothing to upload) the copy asks directly, as an embedding broker would. Either way
    it must end fenced (``why``: what made it stale, for the violation)."""
    refusal = try_a_write(stale, how)
    if refusal is not None:
        note(f"{who} learned by {how}: {type(refusal).__name__}")
    if not stale.fenced:
        check(not stale.check_ownership(), "fenced-refuses", f"{who} still believes it owns the topic after {why}")


def _zombie_learns(sc: Any, zombie: Any, broker: int, learns_by: str, index: int) -> None:
    """A write of the paused old owner is refused (the re-created topic's owner record and
    tombstone fence it); from then on it must acknowledge nothing."""
    stale_owner_learns(zombie, learns_by, lambda text: sc.note(f"step {index}: {text}"), f"the old owner b{broker}",
                       "it was deleted and re-created")
    try:
        offset = zombie.produce(b"zombie", ack="durable")
    except (OwnershipLostError, TopicDeleted):
        pass
    except Exception as e:  # noqa: BLE001 - any refusal will do, but it must be one
        sc.note(f"step {index}: the old owner's produce failed: {type(e).__name__}")
    else:
        raise Violation("fenced-refuses", f"the deleted incarnation's old owner b{broker} acknowledged offset {offset}")
    if broker != sc.owner:  # (re-created on its own host: the create abandoned that copy)
        sc.cluster.crash(broker)
        sc.returning.append(broker)


def _drain_old_reader(sc: Any, reader: Any, old: TopicModel, index: int) -> None:
    """A reader opened before the delete: whatever it still serves must be the deleted
    incarnation's message at its offset, never one of the new incarnation."""
    new_payloads = {p: o for o, p in sc.model.facts.items()}
    served = 0
    try:
        with reader:
            for m in reader:
                check(m.payload not in new_payloads, "incarnation-isolation",
                      f"a reader opened before the delete served offset {m.offset}: {m.payload!r}, a message "
                      f"of the re-created topic")
                check(old.facts.get(m.offset, old.pending.get(m.offset)) == m.payload, "incarnation-isolation",
                      f"a reader opened before the delete served offset {m.offset}: {m.payload!r}, which the "
                      f"deleted incarnation never held there")
                served += 1
    except Violation:
        raise
    except READ_ENDS as e:
        sc.note(f"step {index}: the reader opened before the delete ended with {type(e).__name__} "
                f"after {served} more")
        return
    sc.note(f"step {index}: the reader opened before the delete ended after {served} more")


# -- archive retention ----------------------------------------------------------------

def archive_retention(sc: Any, step: Step, index: int) -> None:
    args = step.args
    cluster, md, topic = sc.cluster, sc.cluster.inner_metadata, sc.cluster.topic
    for _ in range(args["rounds"]):  # a few descriptors, so there is something to cut
        sc.step_produce(Step("produce", {"count": args["per_round"], "ack": "durable"}), index)
        sc.hosted().uploader.upload_once()
    hosted = sc.hosted()
    # Everything appended is made durable and archived first: the cut's own pass then
    # uploads nothing, and the chain read here is the one the policy is applied to.
    hosted.wal.flush(WAIT_BOUND_S)
    hosted.uploader.upload_once()
    sc.check_descriptors()
    before = archive_start(md, topic)
    check(before == sc.model.start, "retention-bounded",
          f"the archive start is {before} before the cut, the model's is {sc.model.start}")
    retained = [d for d in list_descriptors(md, topic) if d.end_offset >= before]
    policy, expected = _policy(args, retained, before)

    uploader = hosted.uploader
    retention = uploader.archive_retention
    original = retention.policy
    retention.policy = policy
    uploader._archive_retention_due_s = 0.0  # due at this pass
    crash_at = args["crash_at"]
    cluster.crash_hook.fired = False  # (an earlier uploader crash step leaves it set)
    if crash_at is not None:
        cluster.crash_hook.arm(crash_at)
    try:
        uploader.upload_once()
    except HarnessCrash:
        pass
    except Exception as e:  # noqa: BLE001 - the hook may surface wrapped; the crash follows anyway
        if not cluster.crash_hook.fired:
            raise
        sc.note(f"step {index}: retention crash surfaced as {type(e).__name__}")
    finally:
        retention.policy = original
    fired = cluster.crash_hook.fired
    cluster.crash_hook.armed, cluster.crash_hook.fired = None, False
    if fired:
        sc.note(f"step {index}: the owner died at {crash_at} of a cut {before} -> {expected}")
        cluster.crash(sc.owner)
        sc.reload_same_broker(f"crash at archive retention step {crash_at}")
        sc.hosted().uploader.upload_once()  # the new uploader's first pass finishes the cut
    hosted = sc.hosted()
    hosted.uploader.wait_object_deletes(WAIT_BOUND_S)
    now = archive_start(md, topic)
    check(now == expected, "retention-bounded",
          f"a {args['policy']} cut ({policy}) of descriptors {[(d.start_offset, d.end_offset, d.size) for d in retained]} "
          f"moved the start {before} -> {now}; the policy asks for {expected}")
    sc.model.cut(now)
    below = [(d.start_offset, d.end_offset) for d in list_descriptors(md, topic) if d.end_offset < now]
    check(not below, "retention-resumes", f"descriptors {below} wholly below the start {now} are left")
    if now != before:
        sc.note(f"step {index}: archive retention ({args['policy']}) cut {before} -> {now}")
    sc.check_descriptors()
    sc.check_below_start_refused(hosted, "after a retention cut")
    tip = hosted.next_offset
    got = read_messages(hosted.create_reader("earliest", live=False), None)
    offsets = [m.offset for m in got]
    check(offsets == list(range(now, tip)), "contiguous-offsets",
          f"after a cut to {now} a full read yields {offsets[:3]}..{offsets[-3:]}, expected {now}-{tip - 1}")
    for m in got:
        sc.model.observed(m.offset, m.payload, "a read after a retention cut")


def _policy(args: dict[str, Any], retained: list[ObjectDescriptor], start: int
            ) -> tuple[ArchiveRetentionConfig, int]:
    """The policy of this step and the start it asks for, computed here (not by the
    code under test): oldest first, a descriptor goes while the retained objects total
    more than ``bytes_max`` (or, by age 0, always), never the last one."""
    total = sum(d.size for d in retained)
    if args["policy"] == "age":
        policy = ArchiveRetentionConfig(age_max_s=0.0)
    else:
        policy = ArchiveRetentionConfig(bytes_max=int(total * args["keep"]))
    removed = 0
    for d in retained[:-1]:
        if not (args["policy"] == "age" or total > (policy.bytes_max or 0)):
            break
        total -= d.size
        removed += 1
    return policy, (retained[removed].start_offset if removed else start)


def check_below_start_refused(sc: Any, hosted: Any, where: str) -> None:
    """Below the model's start, readers (the owner's and an archive-only one) are refused
    with OffsetBelowArchiveStart naming exactly that start."""
    start = sc.model.start
    if start == 0:
        return
    cluster = sc.cluster
    for kind, make in (("the owner's reader", lambda: hosted.create_reader(start - 1, live=False)),
                       ("an archive reader", lambda: create_reader(cluster.topic, None, cluster.inner_metadata,
                                                                    cluster.inner_objects, start - 1, live=False))):
        try:
            reader = make()
        except OffsetBelowArchiveStart as e:
            check(e.first_offset == start, "retention-bounded",
                  f"{where}: {kind} at {start - 1} names the first retained offset {e.first_offset}, "
                  f"the model's start is {start}")
            continue
        reader.close()
        raise Violation("retention-bounded", f"{where}: {kind} at {start - 1} (below the start {start}) was created")
