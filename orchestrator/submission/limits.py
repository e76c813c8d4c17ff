"""Every limit SLURM puts on how many jobs may be queued at once, read from accounting and the partitions.

sbatch refuses a job past any of them, each array task counted as a job:

- a QOS's ``MaxSubmitJobsPerUser`` (the user's jobs of the QOS), ``MaxSubmitJobsPerAccount`` (the account's) and
  ``GrpSubmitJobs`` (everyone's), for the job's own QOS and for its partition's QOS (``QOS=`` of the partition in
  ``scontrol show partition``), a job counting against both. Where both set the same limit, the partition's wins,
  unless the job's QOS has the ``OverPartQOS`` flag (SLURM's order);
- an association's ``MaxSubmitJobs`` (the user's own, else the nearest account above that sets one) and the
  ``GrpSubmitJobs`` of the user's association and of every account above it (the jobs of every user under it).

Each is a :class:`Limit`: its size, what it counts, and its name in words; :func:`read` gathers those a cell of the
given account, QOS and partition is held to (:meth:`Site.limits`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.slurm import site as slurm_site

DEFAULT_QOS = "normal"
"""The QOS of a job that names none where the association names no default (SLURM's own default)."""


@dataclass(frozen=True)
class Queued:
    """A job in the queue, as the limits count it (``squeue -r``: each array task one)."""

    user: str
    account: str
    qos: str
    partition: str
    """One partition, or a comma list for a pending job that may start in any of them."""


@dataclass(frozen=True)
class Limit:
    """At most ``size`` jobs queued of those it counts: of QOS ``qos`` (the job's own or its partition's), of
    user ``user``, of the accounts ``accounts``; None counts every job."""

    size: int
    name: str
    """In words, with the setting and where to read it: ``QOS 'short' allows 3 queued jobs per user
    (MaxSubmitJobsPerUser, `sacctmgr show qos`)``."""
    qos: str | None = None
    user: str | None = None
    accounts: frozenset[str] | None = None

    def counts(self, job: Queued, partition_qos: Mapping[str, str]) -> bool:
        """Whether ``job`` counts against this limit."""
        if self.user is not None and job.user != self.user:
            return False
        if self.accounts is not None and job.account not in self.accounts:
            return False
        if self.qos is None:
            return True
        return job.qos == self.qos or any(partition_qos.get(p) == self.qos for p in job.partition.split(","))


@dataclass(frozen=True)
class QosLimits:
    """A QOS's submit limits as ``sacctmgr show qos`` lists them (None: not set)."""

    per_user: int | None = None
    per_account: int | None = None
    group: int | None = None
    over_partition_qos: bool = False


@dataclass(frozen=True)
class Association:
    """One row of ``sacctmgr show assoc``: an account's own (``user`` empty) or a user's in an account."""

    account: str
    user: str = ""
    partition: str = ""
    parent: str = ""
    """The account above an account's association; empty for a user's (its account is above it)."""
    max_submit: int | None = None
    group_submit: int | None = None
    default_qos: str = ""


@dataclass(frozen=True)
class Site:
    """What the limits are read from: accounting's QOSes and associations, and the partitions' QOS."""

    user: str
    qos: Mapping[str, QosLimits]
    associations: Sequence[Association] = ()
    partition_qos: Mapping[str, str] = field(default_factory=dict)
    """Partition -> its QOS, for the partitions that have one."""
    default_partition: str | None = None
    default_account: str | None = None

    def _mine(self, account: str | None, partition: str | None) -> list[Association]:
        rows = [a for a in self.associations if a.user == self.user and a.account == (account or a.account)]
        if account is None and self.default_account is not None:
            rows = [a for a in rows if a.account == self.default_account] or rows
        parts = set((partition or self.default_partition or "").split(","))
        return [a for a in rows if not a.partition or a.partition in parts]

    def default_qos(self, account: str | None = None, partition: str | None = None) -> str:
        """The QOS of a job that names none: its association's DefaultQOS, else ``normal``."""
        return next((a.default_qos for a in self._mine(account, partition) if a.default_qos), DEFAULT_QOS)

    def account_of(self, account: str | None) -> str | None:
        """The account a job is charged to: the one named, else the user's default (or only) account."""
        if account is not None:
            return account
        if self.default_account is not None:
            return self.default_account
        mine = {a.account for a in self.associations if a.user == self.user}
        return next(iter(mine)) if len(mine) == 1 else None

    def _accounts(self) -> dict[str, Association]:
        return {a.account: a for a in self.associations if not a.user and not a.partition}

    def _under(self, account: str) -> frozenset[str]:
        """``account`` and every account below it."""
        children: dict[str, list[str]] = {}
        for a in self._accounts().values():
            children.setdefault(a.parent, []).append(a.account)
        out, todo = {account}, [account]
        while todo:
            for child in children.get(todo.pop(), []):
                if child not in out:
                    out.add(child)
                    todo.append(child)
        return frozenset(out)

    def _above(self, account: str) -> Iterable[Association]:
        accounts, seen = self._accounts(), set()
        while account in accounts and account not in seen:
            seen.add(account)
            yield accounts[account]
            account = accounts[account].parent

    def limits(self, account: str | None, qos: str | None, partition: str | None) -> list[Limit]:
        """The limits a job of this account, QOS and partition (None: the user's defaults) counts against."""
        out = self._qos_limits(self.account_of(account), qos or self.default_qos(account, partition), partition)
        acct = self.account_of(account)
        if acct is None:
            return out
        sacct = "`sacctmgr show assoc`"
        for a in self._mine(acct, partition):
            for most, name in ((a.max_submit, "MaxSubmitJobs"), (a.group_submit, "GrpSubmitJobs")):
                if most is not None:
                    said = f"your association in account {acct!r} allows {most} queued jobs ({name}, {sacct})"
                    out.append(Limit(most, said, user=self.user, accounts=frozenset({acct})))
        if not any(a.max_submit is not None for a in self._mine(acct, partition)):
            inherited = next((a for a in self._above(acct) if a.max_submit is not None), None)
            if inherited is not None and inherited.max_submit is not None:
                out.append(
                    Limit(
                        inherited.max_submit,
                        f"account {inherited.account!r} allows each user "
                        f"{inherited.max_submit} queued jobs (MaxSubmitJobs, {sacct})",
                        user=self.user,
                        accounts=frozenset({acct}),
                    )
                )
        for a in self._above(acct):
            if a.group_submit is not None:
                out.append(
                    Limit(
                        a.group_submit,
                        f"account {a.account!r} allows {a.group_submit} queued jobs of all "
                        f"its users (GrpSubmitJobs, {sacct})",
                        accounts=self._under(a.account),
                    )
                )
        return out

    def _qos_limits(self, account: str | None, qos: str, partition: str | None) -> list[Limit]:
        parts = [p for p in (partition or self.default_partition or "").split(",") if p]
        part_qos = [q for q in dict.fromkeys(self.partition_qos.get(p, "") for p in parts) if q and q != qos]
        job = self.qos.get(qos, QosLimits())
        by_partition = [self.qos.get(q, QosLimits()) for q in part_qos]

        def kept(limits: QosLimits, is_job: bool) -> dict[str, int | None]:
            """The limits that apply of one QOS: where both set one, the partition's, unless OverPartQOS."""
            out = {}
            for kind in _KINDS:
                other_sets = (
                    any(getattr(p, kind) is not None for p in by_partition) and not job.over_partition_qos
                    if is_job
                    else job.over_partition_qos and getattr(job, kind) is not None
                )
                out[kind] = None if other_sets else getattr(limits, kind)
            return out

        entries = [(q, "partition's ", kept(lim, False)) for q, lim in zip(part_qos, by_partition, strict=True)]
        entries.append((qos, "", kept(job, True)))
        out: list[Limit] = []
        for name, whose, lim in entries:
            said, per_user, per_account, group = f"{whose}QOS {name!r}", *(lim[k] for k in _KINDS)
            if per_user is not None:
                out.append(
                    Limit(
                        per_user,
                        f"{said} allows {per_user} queued jobs per user (MaxSubmitJobsPerUser, `sacctmgr show qos`)",
                        qos=name,
                        user=self.user,
                    )
                )
            if per_account is not None and account is not None:
                out.append(
                    Limit(
                        per_account,
                        f"{said} allows {per_account} queued jobs per account "
                        f"(MaxSubmitJobsPerAccount, `sacctmgr show qos`; account {account!r})",
                        qos=name,
                        accounts=frozenset({account}),
                    )
                )
            if group is not None:
                out.append(
                    Limit(
                        group,
                        f"{said} allows {group} queued jobs of all users (GrpSubmitJobs, `sacctmgr show qos`)",
                        qos=name,
                    )
                )
        return out


_KINDS = ("per_user", "per_account", "group")


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _cols(row: Sequence[str], n: int) -> list[str]:
    return (list(row) + [""] * n)[:n]


def parse_qos(rows: Sequence[Sequence[str]]) -> dict[str, QosLimits]:
    """``sacctmgr show qos format=name,maxsubmitjobsperuser,maxsubmitjobsperaccount,grpsubmitjobs,flags`` rows."""
    out = {}
    for row in rows:
        name, pu, pa, grp, flags = _cols(row, 5)
        out[name] = QosLimits(_int(pu), _int(pa), _int(grp), "overpartqos" in flags.lower())
    return out


def parse_associations(rows: Sequence[Sequence[str]]) -> list[Association]:
    """``sacctmgr show assoc format=account,user,partition,parentname,maxsubmitjobs,grpsubmitjobs,defaultqos``."""
    out = []
    for row in rows:
        account, user, partition, parent, max_submit, group, default_qos = _cols(row, 7)
        out.append(Association(account, user, partition, parent, _int(max_submit), _int(group), default_qos.strip()))
    return out


QOS_FORMAT = "format=name,maxsubmitjobsperuser,maxsubmitjobsperaccount,grpsubmitjobs,flags"
ASSOC_FORMAT = "format=account,user,partition,parentname,maxsubmitjobs,grpsubmitjobs,defaultqos"


def read(user: str) -> Site | None:
    """The site's limits from ``sacctmgr`` and ``scontrol show partition``; None where accounting cannot be asked
    (nothing is then held back)."""
    qos_rows = slurm_site.sacctmgr_rows(["show", "qos", QOS_FORMAT])
    if qos_rows is None:
        return None
    qos = parse_qos(qos_rows)
    associations = parse_associations(slurm_site.sacctmgr_rows(["show", "assoc", ASSOC_FORMAT]) or [])
    # A partition's QOS matters only where some QOS limits queued jobs: else one scheduler call fewer.
    limited = any(q != QosLimits(over_partition_qos=q.over_partition_qos) for q in qos.values())
    partition_qos, default_partition = slurm_site.partition_qos() if limited else ({}, None)
    default_account = None
    if len({a.account for a in associations if a.user == user}) > 1:
        names = slurm_site.sacctmgr_names(["show", "user", user, "format=defaultaccount"])
        default_account = names[0] if names else None
    return Site(user, qos, associations, partition_qos, default_partition, default_account)
