"""The documents workload: documents asked in turn, more of them than the KV cache holds, each
asked twice; what a server keeps of a document once its cells went to the others.

The edgeserves and llama-server (its defaults: idle slots' KV kept in host memory, `--cache-ram`
8 GiB) start together with `--parallel 2` (PARALLEL) and a context of CTX cells. COUNT
never-seen documents of ~DOC_TOKENS tokens (new random text, the same for every server, sized
from the tokens per word the first server counted on its warm-up) are asked one question each,
in turn (the first pass), then each again in the same order with another short question (the
second pass), GEN_TOKENS tokens generated; for each document the servers take turns, the order
rotating. COUNT x DOC_TOKENS exceeds CTX, so a document's cells have gone to later ones by the
time it comes back: the second pass measures the cache beyond the KV. Reported per server and
pass: the median TTFT over the documents.

Then each edgeserve whose `--help` lists `--prompt-cache-dir` runs alone with a fresh folder as
its disk tier: the first pass, a graceful stop (SIGTERM), a start on the same folder, the second
pass: its "after restart" TTFT against its warm second pass (the target: at most
RESTART_FACTOR x). An edgeserve without the flag skips that case and says why.

Last, the RSS a second after one chat at `--parallel 1` (IDLE_PARALLEL) with CTX cells, each
server against llama-server's (the target: at most IDLE_RSS_FACTOR x).
"""

from __future__ import annotations

import re
import statistics
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from bench import load, long_prompt
from bench.anchors import EDGESERVES, LLAMA_SERVER, Server, Servers, Setup, ctx_args
from bench.images import lacks_flag, start_failure
from bench.turns import rotated

# The servers this workload runs (in the bench's order).
KINDS = (*EDGESERVES, LLAMA_SERVER)
PARALLEL = 2
CTX = 4096
DOC_TOKENS = 1500
GEN_TOKENS = 4
IDLE_PARALLEL = 1
# The one chat before the idle RSS is read: a prompt of this many words.
CHAT_WORDS = 128
# Targets: after a restart at most this many times the warm second pass; idle RSS at most this
# many times llama-server's.
RESTART_FACTOR = 2.0
IDLE_RSS_FACTOR = 1.1
FIRST, SECOND = "first", "second"
QUESTIONS = {
    FIRST: "Which word comes first in this list?",
    SECOND: "Which word comes last in this list?",
}
# Prompt indices of this workload: apart from every other workload's (long prompts: 30M,
# several models: 40M-42M).
INDEX_BASE = 50_000_000

# Runs a request on a quiet machine (given the servers running and a label for the noisy runs).
Quiet = Callable[[list[Server], str, Awaitable[load.Stream]], Awaitable[load.Stream]]


def fewest_documents() -> int:
    """The fewest documents that overflow the KV cache: more than CTX tokens together."""
    return CTX // DOC_TOKENS + 1


def check_count(count: int) -> int:
    """`count` documents, when they are 0 (no workload) or enough to overflow the KV cache."""
    if count != 0 and count < fewest_documents():
        raise ValueError(
            f"--documents must be 0 or at least {fewest_documents()} (documents of "
            f"~{DOC_TOKENS} tokens that overflow {CTX} KV cells): {count}"
        )
    return count


def prompt(doc: int, words: int, which: str) -> str:
    """Document `doc` (`words` words of bench text) and then the question of pass `which`: the
    document is the prefix both passes share."""
    return f"{load.prompt_text(INDEX_BASE + doc, words)}\n\n{QUESTIONS[which]}"


def offers_prompt_cache_dir(help_text: str) -> bool:
    """Whether a server's `--help` lists the `--prompt-cache-dir` flag."""
    return re.search(r"--prompt-cache-dir(?![\w-])", help_text) is not None


def missing_disk_tier(kind: str, setup: Setup) -> str | None:
    """Why `kind` cannot keep its prompt cache on disk; None when its `--help` has
    `--prompt-cache-dir`."""
    reason = "no --prompt-cache-dir (a version without the disk tier)"
    return lacks_flag(kind, setup, offers_prompt_cache_dir, reason)


def server_args(kind: str, folder: Path | None = None) -> tuple[str, ...]:
    """The arguments beside the bench's: a context of CTX cells and, with `folder`, the disk
    tier there."""
    disk = ("--prompt-cache-dir", str(folder)) if folder is not None else ()
    return (*ctx_args(kind, CTX), *disk)


def _median(values: Sequence[float | int | None]) -> float | None:
    present = [float(v) for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def figures(name: str, streams: Sequence[load.Stream]) -> dict[str, Any]:
    """One pass of one server, its keys led by `name`: each document's TTFT (ms), their median,
    the median prompt and cached tokens, the streams cut short and the first errors."""
    ttfts = [s.ttft * 1000.0 for s in streams if s.ttft is not None]
    return {
        f"{name}_ttft_ms": ttfts,
        f"{name}_ttft_p50_ms": _median(ttfts),
        f"{name}_prompt_tokens": _median([s.prompt_tokens for s in streams]),
        f"{name}_cached_tokens": _median([s.cached_tokens for s in streams]),
        f"{name}_short": sum(s.short for s in streams),
        f"{name}_errors": [s.error for s in streams if s.error][:3],
    }


def with_totals(found: dict[str, Any]) -> dict[str, Any]:
    """A server's figures with the streams cut short over all its passes (`short`) and its
    after-restart TTFT over its warm second pass (`restart_over_warm`, None without both)."""
    short = sum(v for k, v in found.items() if k.endswith("_short"))
    after, warm = found.get("restart_ttft_p50_ms"), found.get("second_ttft_p50_ms")
    over = after / warm if after is not None and warm else None
    return found | {"short": short, "restart_over_warm": over}


def folder_bytes(folder: Path) -> int:
    """The bytes of the files in `folder` and below."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


class Workload:
    """One run of the workload on `servers` (the bench's `Servers`): `count` documents, the
    model's `eog_ids` banned, each request on a quiet machine (`quiet`)."""

    def __init__(self, servers: Servers, count: int, eog_ids: Sequence[int], quiet: Quiet) -> None:
        self.servers = servers
        self.count = count
        self.eog_ids = tuple(eog_ids)
        self.quiet = quiet
        # The servers that could not run the side-by-side passes, and why.
        self.unsupported: dict[str, str] = {}
        self.tokens_per_word: dict[str, float] = {}

    async def warm_up(self, server: Server) -> str | None:
        """A request of long_prompt.CALIBRATION_WORDS words, which warms `server` up and counts
        its prompt tokens per word (its first count kept); its error, None when it answered."""
        words = long_prompt.CALIBRATION_WORDS
        got = await load.warm_up(server.url, server.kind, words, self.eog_ids)
        if got.error or not got.prompt_tokens:
            return got.error or "no usage in the answer"
        self.tokens_per_word.setdefault(server.kind, got.prompt_tokens / words)
        return None

    @property
    def words(self) -> int:
        """A document's words: ~DOC_TOKENS tokens at the first server's tokens per word."""
        return long_prompt.words_for(DOC_TOKENS, next(iter(self.tokens_per_word.values())))

    async def one_pass(self, running: list[Server], which: str) -> dict[str, list[load.Stream]]:
        """Pass `which`: every document in order, the servers taking turns on each; each
        server's streams."""
        done: dict[str, list[load.Stream]] = {s.kind: [] for s in running}
        for doc in range(self.count):
            text = prompt(doc, self.words, which)
            for server in rotated(running, doc):
                body = load.chat_body(server.kind, [{"role": "user", "content": text}],
                                      GEN_TOKENS, self.eog_ids)  # fmt: skip
                label = f"documents {server.kind} {which} #{doc}"
                got = await self.quiet(running, label, ask(server.url, body))
                done[server.kind].append(got)
                print(f"  {server.kind:18} document {doc} {which} pass: TTFT "
                      f"{(got.ttft or 0) * 1000:6.0f} ms ({got.prompt_tokens} prompt tokens, "
                      f"{got.cached_tokens} cached)"
                      + (f", {got.error}" if got.error else ""), flush=True)  # fmt: skip
        return done

    async def run(self, running: list[Server]) -> dict[str, Any]:
        """The passes on `running` (started with `server_args` and warmed up by `warm_up`),
        which it stops; each edgeserve's restart case; the idle RSS. The results."""
        result: dict[str, Any] = {
            "count": self.count,
            "doc_tokens": DOC_TOKENS,
            "parallel": PARALLEL,
            "ctx": CTX,
            "max_tokens": GEN_TOKENS,
            "idle_parallel": IDLE_PARALLEL,
            "unsupported": self.unsupported,
            "restart_skipped": {},
        }
        if running:
            result["words"] = self.words
            result["tokens_per_word"] = next(iter(self.tokens_per_word.values()))
            first = await self.one_pass(running, FIRST)
            second = await self.one_pass(running, SECOND)
            for server in running:
                self.servers.stop(server)
                result[server.kind] = figures(FIRST, first[server.kind]) | figures(
                    SECOND, second[server.kind]
                )
        for kind in (s.kind for s in running if s.kind in EDGESERVES):
            reason = missing_disk_tier(kind, self.servers.setup)
            if reason is None:
                with tempfile.TemporaryDirectory(prefix="bench-prompt-cache-") as folder:
                    found = await self.restarted(kind, Path(folder))
                reason = found.pop("error", None)
                result[kind] |= found
            if reason is not None:
                print(f"  {kind} after a restart with the disk tier: skipped ({reason})")
                result["restart_skipped"][kind] = reason
        kinds = [s.kind for s in running]
        try:
            idle = await load.rss_after_one_chat(self.servers, kinds, IDLE_PARALLEL,
                                                 server_args, CHAT_WORDS, self.eog_ids)  # fmt: skip
        except RuntimeError as exc:  # a server that would not start or answer
            result["idle_rss_error"] = start_failure(str(exc))
            idle = {}
        for kind in kinds:
            rss = idle.get(kind, {}).get("VmRSS")
            result[kind] = with_totals(result[kind] | {"idle_rss": rss})
        return result

    async def restarted(self, kind: str, folder: Path) -> dict[str, Any]:
        """`kind` alone with its disk tier in `folder`: the first pass, a graceful stop, a start
        on the same folder, the second pass. Its figures ("disk_first", "restart"), the bytes
        the folder held after the stop and the stop's exit code; `error` when it failed."""
        found: dict[str, Any] = {}
        print(f"  {kind}: first pass with --prompt-cache-dir {folder}, stop, start, second "
              "pass ...", flush=True)  # fmt: skip
        for which, name, tag in ((FIRST, "disk_first", "disk"), (SECOND, "restart", "restarted")):
            server = self.servers.start(kind, PARALLEL, server_args(kind, folder), tag=tag)
            try:
                await self.servers.wait_ready(server)
            except RuntimeError as exc:
                self.servers.stop(server)
                return found | {"error": start_failure(str(exc))}
            error = await self.warm_up(server)
            if error:
                self.servers.stop(server)
                return found | {"error": f"warm-up: {error}"}
            found |= figures(name, (await self.one_pass([server], which))[kind])
            self.servers.stop(server)
            if which == FIRST:
                found["stop_exit_code"] = server.proc.returncode
                found["disk_bytes"] = folder_bytes(folder)
        return found


async def ask(url: str, body: dict[str, Any]) -> load.Stream:
    """One streamed request (`body`) to the server at `url`."""
    async with load.session() as http:
        return await load.stream_chat(http, url, body)
