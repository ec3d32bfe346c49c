r"""`search` environment (Search-R1): retrieval over a local corpus (BM25) or a remote retriever.

Two ways for the model to call it:

* `format="tags"` (Search-R1): `<search>query</search>` returns `<information>...</information>`
  appended verbatim; `<answer>...</answer>` ends the episode. Generation stops at `</search>` and
  `</answer>` (kept in the output).
* `format="qwen"`: a `search` tool through `<tool_call>` blocks and the chat template; a turn without
  a call is the final answer (`<answer>` inside it if present, else the whole turn).

The final answer is scored with exact match (or F1) against the label, with an optional format score
for a well-formed wrong answer (Search-R1 uses 0.2 in some recipes).

Corpus file: JSONL, one passage per line with `contents` (Search-R1's wiki dumps: `"Title"\ntext`)
or `text` and optional `title`. Remote retriever: Search-R1's retrieval server protocol,
`POST {url} {"queries": [q], "topk": k, "return_scores": true}` → `{"result": [[{"document":
{"contents": ...}, "score": s}, ...]]}`.

A retrieval that fails (server down, HTTP error, bad reply, past `tool_timeout_s`) is shown to the model as an
error in place of the passages, as the original's example shows it an empty `<information>` (its local backend
catches every error and returns no passages): the episode goes on. Each such search is logged and counted in the
step's `info["num_backend_errors"]`; the rollout metric `rollout/env_backend_error_samples` counts the samples
trained with one in their observations (`slime_core.protocols.EnvStep`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import pathlib
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from slime_core.jsonl import iter_jsonl
from slime_core.protocols import EnvStep
from slime_core.tag_blocks import thinking_end
from slime_envs.base import ToolEnv, _count_truncated
from slime_envs.parsing import ParsedTurn, parse_tag_action
from slime_envs.rewards import em_with_format, f1_score

__all__ = ["BM25Retriever", "Passage", "RemoteRetriever", "SearchEnv", "format_passages", "gold_answers"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True, slots=True)
class Passage:
    """One retrieved passage (`score`: retriever score, higher is better)."""

    title: str
    text: str
    score: float = 0.0


def _passage_from_row(row: Mapping[str, Any], where: str) -> Passage:
    if "contents" in row:
        # Search-R1 wiki format: first line is the quoted title, the rest is the text.
        title, _, text = str(row["contents"]).partition("\n")
        return Passage(title=title.strip().strip('"'), text=text.strip())
    if "text" in row:
        return Passage(title=str(row.get("title", "")), text=str(row["text"]))
    raise ValueError(f"{where}: passage needs a 'contents' or 'text' field, got keys {sorted(row)}")


class BM25Retriever:
    """BM25 (via `bm25s`) over a JSONL corpus.

    Args:
        corpus_path: JSONL passages (see module docstring).

    Raises:
        FileNotFoundError: no such corpus file.
        ValueError: a malformed line (named by file and line number) or an empty corpus.
    """

    def __init__(self, corpus_path: str | pathlib.Path) -> None:
        import bm25s

        path = pathlib.Path(corpus_path)
        self.passages: list[Passage] = []
        for lineno, row in iter_jsonl(path):
            self.passages.append(_passage_from_row(row, f"{path}:{lineno}"))
        if not self.passages:
            raise ValueError(f"{path}: corpus is empty")
        self._bm25s = bm25s
        self._index = bm25s.BM25()
        corpus = [f"{p.title} {p.text}" for p in self.passages]
        self._index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)
        self._lock = threading.Lock()

    def search(self, query: str, topk: int) -> list[Passage]:
        """The `topk` best passages for `query` (fewer if the corpus is smaller; none for an empty query)."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:
            return []
        k = min(topk, len(self.passages))
        with self._lock:
            ids, scores = self._index.retrieve(tokens, k=k, show_progress=False)
        out = []
        for idx, score in zip(ids[0].tolist(), scores[0].tolist(), strict=True):
            if score <= 0:
                continue
            p = self.passages[idx]
            out.append(Passage(title=p.title, text=p.text, score=float(score)))
        return out


@functools.lru_cache(maxsize=8)  # corpora kept indexed per process, the least recently used dropped first
def _build_bm25(corpus_path: str) -> BM25Retriever:
    return BM25Retriever(corpus_path)


_bm25_locks: collections.defaultdict[str, threading.Lock] = collections.defaultdict(threading.Lock)
_bm25_locks_guard = threading.Lock()  # defaultdict's insert is not atomic across threads


def _cached_bm25(corpus_path: str) -> BM25Retriever:
    """The process's BM25 index of `corpus_path`, built once however many episodes ask for it at the same time.

    `functools.lru_cache` does not hold back concurrent misses: the first searches of a rollout's concurrent
    episodes (in `asyncio.to_thread` workers) each indexed the whole corpus, as many copies as worker threads.
    One lock per path makes the others wait for the first build; other corpora are served meanwhile.
    """
    with _bm25_locks_guard:
        lock = _bm25_locks[corpus_path]
    with lock:
        return _build_bm25(corpus_path)


class RemoteRetriever:
    """Client of a Search-R1 style retrieval server.

    Args:
        url: the server's retrieve endpoint, e.g. `http://127.0.0.1:8000/retrieve`.
        timeout_s: per-request timeout.
    """

    def __init__(self, url: str, *, timeout_s: float = 30.0) -> None:
        self.url = url
        self.timeout_s = timeout_s

    async def search(self, query: str, topk: int) -> list[Passage]:
        """POSTs the query; raises `httpx.HTTPError` or `ValueError` (bad reply) on failure."""
        async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=False) as client:
            response = await client.post(self.url, json={"queries": [query], "topk": topk, "return_scores": True})
            response.raise_for_status()
            reply = response.json()
        try:
            hits = reply["result"][0]
            return [
                dataclasses.replace(_passage_from_row(h["document"], self.url), score=float(h.get("score", 0.0)))
                for h in hits
            ]
        except (KeyError, IndexError, TypeError) as e:
            raise ValueError(f"retrieval server {self.url}: unexpected reply ({e!r})") from None


def format_passages(passages: list[Passage]) -> str:
    """Search-R1's passage layout: `Doc i(Title: t) text` lines."""
    if not passages:
        return "No results found."
    return "\n".join(f"Doc {i}(Title: {p.title}) {p.text}" for i, p in enumerate(passages, start=1))


def gold_answers(label: Any) -> list[str]:
    """Gold answers from a label: a string, a list, or Search-R1's `{"target": [...]}`.

    Raises:
        ValueError: a label of another shape.
    """
    if isinstance(label, Mapping) and "target" in label:
        label = label["target"]
    if isinstance(label, str):
        return [label]
    if isinstance(label, list | tuple) and label:
        return [str(x) for x in label]
    raise ValueError(f"search env: label must be a string, a list or {{'target': [...]}}, got {label!r}")


_INVALID_ACTION = (
    "\nInvalid action: put a search query between <search> and </search>, "
    "or the final answer between <answer> and </answer>.\n"
)


class SearchEnv(ToolEnv):
    """Search-R1 environment.

    Args:
        corpus_path: JSONL corpus for local BM25 (indexed once per process and path).
        retrieval_url: remote retriever endpoint (used instead of the corpus when given).
        topk: passages per search.
        format: `"tags"` (Search-R1; no `tool_specs`: the prompt describes the tags) or `"qwen"` (`<tool_call>`
            search tool, offered to the chat template through `tool_specs`).
        reward: `"em"`, `"f1"` or `None` (no env reward).
        format_score: reward for a well-formed wrong answer (EM only).
        max_tool_calls: searches allowed per episode (`qwen` format).
        max_calls_per_turn: see `ToolEnv` (`qwen` format).
        max_response_chars, tool_timeout_s: see `ToolEnv`; in `tags` format they bound each `<search>`'s passages
            and retrieval.

    Raises:
        ValueError: neither or an unknown option given.
    """

    tool_specs = [
        {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the knowledge base; returns the most relevant passages.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string", "description": "The search query."}},
                    "required": ["query"],
                },
            },
        }
    ]

    def __init__(
        self,
        *,
        corpus_path: str | None = None,
        retrieval_url: str | None = None,
        topk: int = 3,
        format: str = "tags",  # noqa: A002 - the option's documented name
        reward: str | None = "em",
        format_score: float = 0.0,
        max_tool_calls: int = 16,
        max_calls_per_turn: int = 4,
        max_response_chars: int = 16_000,
        tool_timeout_s: float | None = 600.0,
    ) -> None:
        super().__init__(
            max_tool_calls=max_tool_calls,
            max_calls_per_turn=max_calls_per_turn,
            max_response_chars=max_response_chars,
            tool_timeout_s=tool_timeout_s,
        )
        if (corpus_path is None) == (retrieval_url is None):
            raise ValueError("search env: give exactly one of corpus_path and retrieval_url")
        if format not in ("tags", "qwen"):
            raise ValueError(f"search env: format must be 'tags' or 'qwen', got {format!r}")
        if reward not in ("em", "f1", None):
            raise ValueError(f"search env: reward must be 'em', 'f1' or None, got {reward!r}")
        if topk < 1:
            raise ValueError(f"search env: topk must be >= 1, got {topk}")
        self.corpus_path, self.retrieval_url = corpus_path, retrieval_url
        self.topk, self.format, self.reward, self.format_score = topk, format, reward, format_score
        self.stop = ["</search>", "</answer>"] if format == "tags" else []
        if format == "tags":
            # The `search` function is the qwen format's: offered in tags format, the chat template taught the model
            # a `<tool_call>` this env answers with "invalid action" (the prompt describes the tags instead).
            self.tool_specs = []
        self.num_invalid = 0
        self.num_backend_errors = 0  # searches of this env whose retrieval failed (the model saw an error)

    async def retrieve(self, query: str) -> list[Passage]:
        """Top-k passages for `query` from the configured retriever."""
        if self.retrieval_url is not None:
            return await RemoteRetriever(self.retrieval_url).search(query, self.topk)
        retriever = await asyncio.to_thread(_cached_bm25, str(self.corpus_path))
        return await asyncio.to_thread(retriever.search, query, self.topk)

    def tool_functions(self) -> dict[str, Callable[..., Awaitable[str]]]:
        """`search(query)`."""
        return {"search": self._search_tool}

    async def _search_tool(self, query: str) -> str:
        if not isinstance(query, str) or not query.strip():
            return "Error: 'query' must be a non-empty string."
        try:
            return format_passages(await self.retrieve(query))
        except (httpx.HTTPError, ValueError, TimeoutError, asyncio.CancelledError):
            # `ToolEnv.call_tool` shows the model the error (a CancelledError here is its tool_timeout_s deadline; a
            # cancelled rollout never reads the count).
            self.num_backend_errors += 1
            raise

    def _score_answer(self, answer: str | None) -> float | None:
        if self.reward is None or self.label is None:
            return None
        golds = gold_answers(self.label)
        if self.reward == "f1":
            return f1_score(answer, golds)
        return em_with_format(answer, golds, well_formed=answer is not None, format_score=self.format_score)

    def score(self, final_turn: str, parsed: ParsedTurn) -> float | None:
        """EM/F1 of the `<answer>` (or, in `qwen` format without one, of the turn after its leading thinking).

        The thinking was scored with the answer: "<think>...</think> Paris" did not match "Paris", so every
        answer of a thinking model (Qwen3) without `<answer>` tags scored 0.
        """
        answer = parsed.answer
        if answer is None and self.format == "qwen":
            answer = final_turn[thinking_end(final_turn) :].replace("<|im_end|>", "").strip()
        return self._score_answer(answer)

    async def _retrieved_text(self, query: str) -> str:
        """The passages for a `<search>` (tags format), or the error shown instead, under `tool_timeout_s`.

        The qwen format's calls get the same deadline and cut from `ToolEnv.call_tool`; the tags format ignored
        both: a retriever that trickled its reply held the episode until `--plugin-timeout-secs` failed the rollout,
        and a 10 MB passage became a 10 MB observation.
        """
        deadline = asyncio.timeout(self.tool_timeout_s)
        try:
            async with deadline:
                return format_passages(await self.retrieve(query))
        except TimeoutError as e:
            self.num_backend_errors += 1
            if not deadline.expired():  # the retriever's own TimeoutError: a failure like any other
                logger.warning("search env: retrieval failed for %r: %r", query, e)
                return "Error: retrieval failed (TimeoutError)."
            logger.warning(
                "search env: retrieval of %r did not answer within tool_timeout_s=%s s; cancelled",
                query,
                self.tool_timeout_s,
            )
            return f"Error: retrieval did not answer within {self.tool_timeout_s:g} s."
        except (httpx.HTTPError, ValueError) as e:
            self.num_backend_errors += 1
            logger.warning("search env: retrieval failed for %r: %s", query, e)
            return f"Error: retrieval failed ({type(e).__name__})."

    async def step(self, model_turn: str) -> EnvStep:
        """One Search-R1 action (tags format), or a `<tool_call>` turn (qwen format).

        A step that searched has `info["num_backend_errors"]`: its searches whose retrieval failed (shown as errors).
        """
        before = self.num_backend_errors
        if self.format == "qwen":
            step = await super().step(model_turn)
            if not step.done:
                step.info["num_backend_errors"] = self.num_backend_errors - before
            return step
        action, content = parse_tag_action(model_turn)
        if action == "answer":
            return EnvStep(observation="", done=True, reward=self._score_answer(content), info={"answer": content})
        if action == "search":
            if not content:
                return EnvStep(observation="\n\n<information>Error: empty query.</information>\n\n", done=False)
            text, cut = self._shown(await self._retrieved_text(content))
            if cut:
                _count_truncated(1, self.max_response_chars)
            self.num_tool_calls += 1
            observation = f"\n\n<information>{text}</information>\n\n"
            info = {"query": content, "num_truncated": int(cut), "num_backend_errors": self.num_backend_errors - before}
            return EnvStep(observation=observation, done=False, info=info)
        self.num_invalid += 1
        return EnvStep(observation=_INVALID_ACTION, done=False, info={"invalid": True})
