"""The remediation hook: drain the node of a confirmed host fault (off by default).

A sibling of the alert channels: the dispatcher (:mod:`.dispatcher`) hands it every
incident record it decided about, with whether the incident is open there
(:meth:`Remediator.observe`, never blocking: the sink's consumer thread calls it). Its
own thread does the rest:

1. an open incident that is a :func:`~.remediation.candidate` (root cause, names ranks)
   and passes :func:`~.remediation.refusal` (allowed cause, one plain host name) and
   :func:`~.remediation.stale` (fresh, not a replay) waits ``confirm_s``; one that
   does not pass is refused at once, recorded with why;
2. resolved before then (a RESOLVED record; the dispatcher no longer has it open), it is
   dropped: a fault that went away is not confirmed;
3. still open after ``confirm_s``, it is checked against the limits
   (:func:`~.remediation.limit`, with this process's actions and the store's: every sink's)
   and acted on: ``scontrol show node`` first (a node already drained or down is left as
   it is, so an administrator's Reason is never overwritten), then ``scontrol update
   NodeName=... State=DRAIN Reason="perftracker: <cause> <incident id>"``; in a dry run,
   or in Kubernetes mode, the command (and the Node patch) is recorded and nothing runs.

Each incident is decided once (also across restarts: an incident the store already has
an action for is not decided again). Every decision is logged and recorded in the store's
``remediations`` table (:func:`store_hooks`), which `perftracker diagnose` and the report
show with the incident. A command runs with a timeout, and nothing here raises into the
sink: a failure is an :class:`~.remediation.Action` with outcome ``failed``.
"""

from __future__ import annotations

import logging
import re
import subprocess
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...schemas.settings import RemediationSettings
from .base import Incident
from .remediation import (
    KUBERNETES,
    REMEDIATION_COLUMNS,
    Action,
    Outcome,
    Past,
    RemediationPolicy,
    action_row,
    candidate,
    hosts_of,
    kubernetes_cordon,
    limit,
    patch_json,
    refusal,
    shell_line,
    slurm_drain,
    stale,
)

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger(__name__)

MAX_DECIDED = 10_000  # incident ids remembered as decided (oldest forgotten first)
MAX_UNRECORDED = 1000  # actions kept for the store while it is away
# scontrol node states (a flag after '+', or a base state) that mean: leave the node alone
_LEFT_ALONE = ("DRAIN", "DOWN", "FAIL", "MAINT", "REBOOT", "POWER")

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass
class _Pending:
    incident: Incident
    due: float
    source: Hashable


class Remediator:
    """See the module docstring. ``job_hosts(job)``: the job's distinct hosts (None: unknown);
    ``history(since_s)``: every recorded action since then (the store's; may raise);
    ``record(action)``: store it (may raise: kept and retried); ``run``: ``subprocess.run``."""

    def __init__(self, policy: RemediationPolicy, scontrol: str = "scontrol", timeout_s: float = 10.0, *,
                 job_hosts: Callable[[str], int | None] = lambda job: None,
                 history: Callable[[float], list[Past]] | None = None,
                 record: Callable[[Action], None] | None = None,
                 run: Runner = subprocess.run, clock: Callable[[], float] = time.time):
        self.policy = policy
        self.scontrol = scontrol
        self.timeout_s = timeout_s
        self._job_hosts = job_hosts
        self._history = history
        self._record = record
        self._run = run
        self._clock = clock
        self._lock = threading.Lock()
        self._inbox: deque[tuple[Incident, bool, Hashable]] = deque()
        self._released: list[Hashable] = []
        self._pending: dict[str, _Pending] = {}
        self._decided: OrderedDict[str, None] = OrderedDict()
        self._mine: list[Past] = []  # this process's actions within the policy's horizon
        self._unrecorded: deque[Action] = deque(maxlen=MAX_UNRECORDED)
        self.actions: list[Action] = []  # the latest decisions, newest last (bounded)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the dispatcher's side (consumer thread): never blocks --------------------------------
    def observe(self, incident: Incident, is_open: bool, source: Hashable = None) -> None:
        with self._lock:
            self._inbox.append((incident, is_open, source))
        self._wake.set()

    def release(self, sources: Iterable[Hashable]) -> int:
        """Partitions revoked from this sink: their incidents waiting for confirmation are the new
        owner's to decide. Returns how many sources were handed over."""
        sources = list(sources)
        with self._lock:
            self._released += sources
        self._wake.set()
        return len(sources)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="pt-remediation", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s + self.timeout_s)

    def stats(self) -> dict[str, Any]:
        counts: dict[str, int] = {o.value: 0 for o in Outcome}
        for a in self.actions:
            counts[a.outcome.value] += 1
        return {**counts, "waiting": len(self._pending), "unrecorded": len(self._unrecorded)}

    # -- the hook's thread -----------------------------------------------------------------
    def _serve(self) -> None:
        while not self._stop.is_set():
            self.process()
            due = min((p.due for p in self._pending.values()), default=None)
            wait = 1.0 if due is None else min(1.0, max(0.0, due - self._clock()))
            self._wake.wait(wait)
            self._wake.clear()

    def process(self) -> list[Action]:
        """Take what was observed, decide the incidents that are due; return the actions decided.
        Never raises (an error is logged and the incident left undecided)."""
        done: list[Action] = []
        try:
            with self._lock:
                inbox, self._inbox = list(self._inbox), deque()
                released, self._released = self._released, []
            if released:
                for key in [k for k, p in self._pending.items() if p.source in released]:
                    del self._pending[key]
            for incident, is_open, source in inbox:
                action = self._observed(incident, is_open, source)
                if action is not None:
                    done.append(self._done(action))
            now = self._clock()
            for key in [k for k, p in self._pending.items() if p.due <= now]:
                pending = self._pending.pop(key)
                action = self._confirmed(pending.incident)
                if action is not None:
                    done.append(self._done(action))
            self._flush_records()
        except Exception:  # the hook must never take the sink down
            log.exception("remediation: unexpected error (the incidents involved are left undecided)")
        return done

    def _observed(self, i: Incident, is_open: bool, source: Hashable) -> Action | None:
        key = i.incident_id
        if not candidate(i, is_open):
            if key in self._pending:
                del self._pending[key]
                log.info("remediation: incident %s of job %s is no longer open; not acted on", key, i.job)
            return None
        if key in self._decided:
            return None
        if key in self._pending:
            self._pending[key].incident = i  # the newest record of it
            return None
        now = self._clock()
        if key in {p.incident_id for p in self._past(now)}:  # decided before (a restart, another sink)
            self._remember(key)
            return None
        why = refusal(i, self.policy) or stale(i.last_seen.timestamp(), now, self.policy)
        if why is not None:
            self._remember(key)
            return self._action(i, Outcome.REFUSED, why)
        self._pending[key] = _Pending(i, now + self.policy.confirm_s, source)
        log.info("remediation: incident %s of job %s (%s on %s) waits %.0f s to be confirmed", key, i.job,
                 i.cause, hosts_of(i)[0], self.policy.confirm_s)
        return None

    def _confirmed(self, i: Incident) -> Action | None:
        """``i`` stayed open ``confirm_s``: act on its node unless a limit says no."""
        self._remember(i.incident_id)
        now = self._clock()
        past = self._past(now)
        if i.incident_id in {p.incident_id for p in past}:
            return None
        node = hosts_of(i)[0]
        try:
            job_hosts = self._job_hosts(i.job)
        except Exception as exc:
            log.warning("remediation: the hosts of job %s could not be read: %s", i.job, exc)
            job_hosts = None
        why = limit(node, i.job, job_hosts, past, now, self.policy)
        if why is not None:
            return self._action(i, Outcome.REFUSED, why)
        if self.policy.mode == KUBERNETES:
            argv, patch = kubernetes_cordon(node)
            return self._action(i, Outcome.DRY_RUN, "kubernetes mode is dry-run only: run the command (or send "
                                "the patch) to cordon the node", argv, patch_json(patch))
        argv = slurm_drain(self.scontrol, node, i.cause, i.incident_id)
        if self.policy.dry_run:
            return self._action(i, Outcome.DRY_RUN, "remediation.dry_run: the command was not run", argv)
        return self._drain(i, node, argv)

    def _drain(self, i: Incident, node: str, argv: list[str]) -> Action:
        state = self._scontrol([self.scontrol, "show", "node", "-o", node])
        if isinstance(state, str):
            return self._action(i, Outcome.FAILED, f"scontrol show node: {state}", argv)
        current, reason = _field(state.stdout, "State"), _field(state.stdout, "Reason")
        if any(flag in current.upper() for flag in _LEFT_ALONE):
            return self._action(i, Outcome.REFUSED, f"node {node} is already {current}"
                                f"{f' (Reason={reason})' if reason else ''}: left as it is", argv)
        done = self._scontrol(argv)
        if isinstance(done, str):
            return self._action(i, Outcome.FAILED, done, argv)
        return self._action(i, Outcome.DONE, f"node {node} was {current or 'in service'}", argv)

    def _scontrol(self, argv: list[str]) -> subprocess.CompletedProcess[str] | str:
        """The finished command, or why it failed (never raises)."""
        try:
            done = self._run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return f"timed out after {self.timeout_s:g} s (remediation.timeout_s)"
        except Exception as exc:  # not found, not executable, ...
            return f"could not run {argv[0]}: {exc}"
        if done.returncode != 0:
            said = (done.stderr or done.stdout or "").strip().splitlines()
            return f"exit status {done.returncode}: {(said[-1] if said else '')[:300]}"
        return done

    # -- history and records -----------------------------------------------------------------
    def _past(self, now: float) -> list[Past]:
        """This process's actions and the store's (every sink's) within the policy's horizon."""
        since = now - self.policy.horizon_s
        self._mine = [p for p in self._mine if p.at >= since]
        past = list(self._mine)
        if self._history is not None:
            try:
                past += self._history(since)
            except Exception as exc:
                log.warning("remediation: recorded actions could not be read (%s); counting this sink's only", exc)
        return list({(round(p.at * 1000), p.incident_id, p.node, p.outcome): p for p in past}.values())

    def _remember(self, incident_id: str) -> None:
        self._decided[incident_id] = None
        while len(self._decided) > MAX_DECIDED:
            self._decided.popitem(last=False)

    def _action(self, i: Incident, outcome: Outcome, reason: str, argv: list[str] | None = None,
                patch: str = "") -> Action:
        hosts = hosts_of(i)
        return Action(round(self._clock(), 3), i.job, i.incident_id, i.cause, hosts[0] if len(hosts) == 1 else "",
                      self.policy.mode, self.policy.action, outcome, reason, shell_line(argv) if argv else "", patch)

    def _done(self, a: Action) -> Action:
        self._mine.append(a.past())
        self.actions = [*self.actions[-99:], a]
        level = logging.WARNING if a.outcome in (Outcome.DONE, Outcome.FAILED) else logging.INFO
        log.log(level, "%s%s", a.describe(), f" [{a.command}]" if a.command else "")
        self._unrecorded.append(a)
        return a

    def _flush_records(self) -> None:
        if self._record is None:
            self._unrecorded.clear()
            return
        while self._unrecorded:
            try:
                self._record(self._unrecorded[0])
            except Exception as exc:
                log.warning("remediation: %d action(s) not recorded yet (%s); retrying", len(self._unrecorded), exc)
                return
            self._unrecorded.popleft()


def _field(show_node: str, name: str) -> str:
    """One field of ``scontrol show node -o`` (a Reason holds spaces: up to the next ``Key=``)."""
    found = re.search(rf"(?:^|\s){name}=(.*?)(?=\s+[A-Za-z]+=|\s*$)", show_node.strip())
    return found.group(1) if found else ""


# -- the store (the sink's): the job's hosts, every sink's actions, recording -------------------
JOB_HOSTS_SQL = (
    "SELECT uniqExactIf(host, host != '') FROM rank_windows WHERE job = {job:String}"
    " AND window_start >= (SELECT max(window_start) FROM rank_windows WHERE job = {job:String})"
    " - toIntervalMinute(10)")
HISTORY_SQL = (
    "SELECT toUnixTimestamp64Milli(at), job, incident_id, node, outcome FROM remediations FINAL"
    " WHERE at >= fromUnixTimestamp64Milli({since_ms:Int64}, 'UTC')")


def store_hooks(store: Store) -> dict[str, Callable[..., Any]]:
    """``job_hosts``, ``history`` and ``record`` of a :class:`Remediator` on the sink's store.
    A job's hosts: the distinct hosts of its RankWindows in the 10 minutes up to its newest."""
    def job_hosts(job: str) -> int | None:
        rows = store.query(JOB_HOSTS_SQL, {"job": job}).rows
        return int(rows[0][0]) if rows and rows[0][0] else None

    def history(since_s: float) -> list[Past]:
        rows = store.query(HISTORY_SQL, {"since_ms": int(since_s * 1000)}).rows
        return [Past(int(at) / 1000.0, job, iid, node, outcome) for at, job, iid, node, outcome in rows]

    def record(a: Action) -> None:
        store.insert("remediations", REMEDIATION_COLUMNS, [[v] for v in action_row(a)])

    return {"job_hosts": job_hosts, "history": history, "record": record}


def build_remediator(s: RemediationSettings, store: Store | None = None) -> Remediator:
    """The hook the settings describe (``s.enabled`` is the caller's to check), recording in ``store``."""
    policy = RemediationPolicy.from_settings(s)
    hooks = store_hooks(store) if store is not None else {}
    log.warning("remediation on: %s %s the node of a %s incident open %.0f s (%s; at most %d per hour, "
                "a node once per %.0f s, %g of a job's hosts)", policy.mode,
                "would " + policy.action if policy.simulated else policy.action + "s",
                "/".join(sorted(policy.causes)), policy.confirm_s,
                "dry run" if policy.simulated else "live", policy.max_per_hour, policy.node_cooldown_s,
                policy.max_job_fraction)
    return Remediator(policy, s.scontrol, s.timeout_s, **hooks)
