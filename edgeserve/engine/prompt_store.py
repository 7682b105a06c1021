"""The prompt cache's tiers below the KV cache: host memory, and optionally a folder on disk.

The KV cache keeps what free sequences hold (slots.py) only until their cells are given to
another request. Before a free sequence loses at least MIN_TOKENS of what it holds, the
scheduler copies its KV out (`SequenceState`: the sequence's cells and, on sliding-window
models, its window checkpoints) into this store, keyed by its tokens and adapter set. A
request whose prompt shares a longer prefix with a stored entry than with any sequence puts
the entry back into a sequence and decodes only the rest.

Entries live in host memory within `ram_bytes` and, with a disk tier (prompt_disk.py), are
also written to files that outlive the process; both tiers drop their least recently used
entries first. An entry that one tier dropped may still be in the other: one evicted from
memory is read back from its file when a prompt needs it. While a sequence still has its
cells, only the disk tier takes a copy (`wanted(..., durable=True)`: the idle engine's and a
stopping one's, so that a restart finds it); memory never holds a second copy of cells the
KV cache holds.

Pure bookkeeping, owned by the engine thread: states are opaque handles, and files are the
disk tier's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

from edgeserve.engine.slots import common_prefix
from edgeserve.engine.types import AdapterSet, CacheTierStats

# The fewest tokens an entry holds, and the fewest more than the KV cache's own match a
# restore must give: below that, decoding the tokens again costs about as much as a copy.
MIN_TOKENS = 64
# Tokens per block of the prefix index: entries are found by the whole blocks they share.
BLOCK = MIN_TOKENS

Tier = Literal["ram", "disk"]


@dataclass(frozen=True)
class SequenceState:
    """A sequence's KV copied out of the context (`kv`, `kv_bytes` long) and the window
    checkpoints it had, as (position, state) pairs, oldest first."""

    kv: object
    kv_bytes: int
    windows: tuple[tuple[int, object], ...] = ()
    window_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """The host memory it takes."""
        return self.kv_bytes + self.window_bytes


@dataclass(eq=False)
class Entry:
    """One stored prompt: in memory when `state` is set, on disk when `file` is."""

    tokens: list[int]
    adapters: AdapterSet
    nbytes: int
    state: SequenceState | None = None
    file: str | None = None
    last_used: int = 0
    chain: list[int] = field(default_factory=list)  # block_chain(tokens, adapters)

    def __post_init__(self) -> None:
        self.chain = block_chain(self.tokens, self.adapters)


def block_chain(tokens: list[int], adapters: AdapterSet) -> list[int]:
    """Hashes of the first 1, 2, … whole blocks of BLOCK tokens under `adapters`: two prompts
    share the k-th hash when (hash collisions aside) they share their first k blocks."""
    chain = []
    running = hash(adapters)
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        running = hash((running, tuple(tokens[start : start + BLOCK])))
        chain.append(running)
    return chain


class PrefixIndex:
    """The entries by the hashes of their block chains, so that a lookup costs a few
    dictionary probes and exact comparisons with the entries sharing the most blocks, however
    many entries there are."""

    def __init__(self) -> None:
        self._buckets: dict[int, list[Entry]] = {}

    def add(self, entry: Entry) -> None:
        """Index an entry."""
        for key in entry.chain:
            self._buckets.setdefault(key, []).append(entry)

    def remove(self, entry: Entry) -> None:
        """Forget an entry."""
        for key in entry.chain:
            bucket = self._buckets[key]
            bucket.remove(entry)
            if not bucket:
                del self._buckets[key]

    def deepest(self, chain: list[int]) -> list[Entry]:
        """The entries sharing the most whole blocks with a prompt of block chain `chain`
        (none when they share no whole block). An entry sharing k blocks shares every
        shorter run, so the deepest non-empty bucket is found by bisection."""
        low, high = 0, len(chain)  # chain[:low] all have entries; chain[high:] none
        while low < high:
            mid = (low + high) // 2
            if chain[mid] in self._buckets:
                low = mid + 1
            else:
                high = mid
        return list(self._buckets[chain[low - 1]]) if low else []

    def holding(self, chain: list[int]) -> list[Entry]:
        """The entries sharing every block of `chain` (none for an empty chain)."""
        return list(self._buckets.get(chain[-1], ())) if chain else []

    def along(self, chain: list[int]) -> list[Entry]:
        """Every entry sharing a whole block with a prompt of block chain `chain`."""
        seen: dict[int, Entry] = {}
        for key in chain:
            for entry in self._buckets.get(key, ()):
                seen[id(entry)] = entry
        return list(seen.values())


class DiskTier(Protocol):
    """Files of entries that outlive the process (prompt_disk.py)."""

    def scan(self) -> list[tuple[str, list[int], int]]:
        """(file, tokens, bytes) of every valid entry of this model, oldest first."""
        ...

    def write(self, tokens: list[int], state: SequenceState) -> str:
        """Start writing an entry; the file it will be."""
        ...

    def read(self, file: str, tokens: list[int]) -> SequenceState | None:
        """The entry in `file`, or None (logged) when it is gone, corrupt or another's."""
        ...

    def forget(self, file: str) -> None:
        """Delete an entry's file (superseded by a longer one)."""
        ...

    def files_held(self) -> tuple[int, int]:
        """How many entry files this model has on disk now, and their bytes."""
        ...

    def close(self) -> None:
        """Finish the writes under way."""
        ...


@dataclass
class TierCounts:
    """Restores served by a tier, and lookups it could not serve."""

    hits: int = 0
    misses: int = 0


@dataclass
class PromptStore:
    """Stored prompts of one model (see the module docstring)."""

    ram_bytes: int
    disk: DiskTier | None = None
    entries: list[Entry] = field(default_factory=list)
    counts: dict[Tier, TierCounts] = field(
        default_factory=lambda: {"ram": TierCounts(), "disk": TierCounts()}
    )
    _clock: int = 0
    _ram_stats: CacheTierStats | None = None
    _index: PrefixIndex = field(default_factory=PrefixIndex)

    def __post_init__(self) -> None:
        if self.disk is not None:
            for file, tokens, nbytes in self.disk.scan():
                self._add(Entry(tokens, (), nbytes, file=file, last_used=self._tick()))

    @property
    def enabled(self) -> bool:
        """Whether anything is stored at all."""
        return self.ram_bytes > 0 or self.disk is not None

    def ram_used(self) -> int:
        """Bytes of the entries held in memory."""
        return sum(e.nbytes for e in self.entries if e.state is not None)

    def in_tier(self, tier: Tier) -> list[Entry]:
        """The entries a tier holds."""
        if tier == "ram":
            return [e for e in self.entries if e.state is not None]
        return [e for e in self.entries if e.file is not None]

    def best(self, tokens: list[int], adapters: AdapterSet) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with `tokens` under `adapters` (the most
        recently used on ties), and the length of that prefix."""
        best: Entry | None = None
        shared = 0
        for entry in self._index.deepest(block_chain(tokens, adapters)):
            if entry.adapters != adapters:
                continue
            common = common_prefix(entry.tokens, tokens)
            if common > shared or (common == shared and best and entry.last_used > best.last_used):
                best, shared = entry, common
        return best, shared

    def covers(self, tokens: list[int], adapters: AdapterSet) -> bool:
        """Whether an entry holds `tokens` (or more after them) under `adapters`."""
        return bool(self._holding(tokens, adapters))

    def wanted(self, tokens: list[int], adapters: AdapterSet, durable: bool) -> list[Tier]:
        """The tiers that should take a copy of a sequence holding `tokens` under `adapters`:
        those where no entry holds them (or more) yet, of the disk tier alone when `durable`
        (the sequence keeps its cells: the copy is for a restart, not a second one in memory);
        none for fewer than MIN_TOKENS tokens."""
        if len(tokens) < MIN_TOKENS:
            return []
        held = self._holding(tokens, adapters)
        tiers: list[Tier] = []
        if not durable and self.ram_bytes > 0 and all(e.state is None for e in held):
            tiers.append("ram")
        if self.disk is not None and not adapters and all(e.file is None for e in held):
            tiers.append("disk")  # adapter ids are this process's own
        return tiers

    def put(
        self, tokens: list[int], adapters: AdapterSet, state: SequenceState, tiers: list[Tier]
    ) -> None:
        """Keep a sequence's KV that holds `tokens` (copied: the caller's list may change) in
        `tiers` (what `wanted` gave; a state larger than the memory budget stays out of
        memory). In each tier, the entries it makes redundant there (their tokens a prefix of
        these) go."""
        exact = next((e for e in self._holding(tokens, adapters) if e.tokens == tokens), None)
        entry = exact or Entry(list(tokens), adapters, state.nbytes)
        entry.last_used = self._tick()
        if "ram" in tiers and state.nbytes <= self.ram_bytes:
            entry.state = state
        if "disk" in tiers and self.disk is not None:
            entry.file = self.disk.write(entry.tokens, state)
        if entry.state is None and entry.file is None:
            return
        if exact is None:
            self._supersede(entry)
            self._add(entry)
        self._fit_ram(keep=entry)

    def load(self, entry: Entry) -> SequenceState | None:
        """The state of `entry` to restore, read from its file when it is no longer in
        memory (and kept in memory again); None when the file is unusable (the entry goes).
        Counts the hit, and the misses of the tiers above the one that served it."""
        entry.last_used = self._tick()
        if entry.state is not None:
            self.counts["ram"].hits += 1
            return entry.state
        self.counts["ram"].misses += 1
        assert self.disk is not None and entry.file is not None
        state = self.disk.read(entry.file, entry.tokens)
        if state is None:
            self.counts["disk"].misses += 1
            self._forget(entry)
            return None
        self.counts["disk"].hits += 1
        if state.nbytes <= self.ram_bytes:
            entry.state = state
            self._fit_ram(keep=entry)
        return state

    def missed(self) -> None:
        """A lookup no tier could serve."""
        self._ram_stats = None
        self.counts["ram"].misses += 1
        if self.disk is not None:
            self.counts["disk"].misses += 1

    def tier_stats(self) -> tuple[CacheTierStats, ...]:
        """Each enabled tier's entries, bytes, hits and misses (the memory tier's worked out
        again only after a change: the engine publishes them every step)."""
        tiers = []
        if self.ram_bytes > 0:
            if self._ram_stats is None:
                entries, held = len(self.in_tier("ram")), self.ram_used()
                counts = self.counts["ram"]
                self._ram_stats = CacheTierStats("ram", entries, held, counts.hits, counts.misses)
            tiers.append(self._ram_stats)
        if self.disk is not None:
            files, held = self.disk.files_held()
            counts = self.counts["disk"]
            tiers.append(CacheTierStats("disk", files, held, counts.hits, counts.misses))
        return tuple(tiers)

    def close(self) -> None:
        """Finish the disk tier's writes."""
        if self.disk is not None:
            self.disk.close()

    def _fit_ram(self, keep: Entry | None = None) -> None:
        """Drop the least recently used states from memory until the rest fit `ram_bytes`
        (an entry whose file is written stays, on disk only)."""
        held = sorted(self.in_tier("ram"), key=lambda e: e.last_used)
        used = sum(e.nbytes for e in held)
        for entry in held:
            if used <= self.ram_bytes:
                break
            if entry is keep:
                continue
            used -= entry.nbytes
            entry.state = None
            if entry.file is None:
                self._forget(entry)

    def _supersede(self, entry: Entry) -> None:
        """Drop, from each tier `entry` is in, the entries there whose tokens it starts with
        (an entry left in no tier goes)."""
        n_new = len(entry.tokens)
        for older in self._index.along(entry.chain):
            n = len(older.tokens)
            if older.adapters != entry.adapters or n > n_new or older.tokens != entry.tokens[:n]:
                continue
            if entry.state is not None:
                older.state = None
            if entry.file is not None and older.file is not None and self.disk is not None:
                self.disk.forget(older.file)
                older.file = None
            if older.state is None and older.file is None:
                self._forget(older)

    def _holding(self, tokens: list[int], adapters: AdapterSet) -> list[Entry]:
        """The entries holding `tokens` (or more after them) under `adapters`."""
        if len(tokens) < BLOCK:
            return [e for e in self.entries if e.adapters == adapters and _starts(e, tokens)]
        holding = self._index.holding(block_chain(tokens, adapters))
        return [e for e in holding if e.adapters == adapters and _starts(e, tokens)]

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)
        self._index.add(entry)

    def _forget(self, entry: Entry) -> None:
        self.entries.remove(entry)
        self._index.remove(entry)

    def _tick(self) -> int:
        self._clock += 1
        self._ram_stats = None
        return self._clock


def _starts(entry: Entry, tokens: list[int]) -> bool:
    """Whether `entry`'s tokens start with `tokens`."""
    return len(entry.tokens) >= len(tokens) and entry.tokens[: len(tokens)] == tokens
