import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from slime_envs.search import BM25Retriever, SearchEnv, format_passages, gold_answers

ROWS = [
    {"contents": '"Paris"\nParis is the capital and largest city of France.'},
    {"contents": '"Berlin"\nBerlin is the capital of Germany, on the Spree river.'},
    {"title": "Mount Everest", "text": "Everest is Earth's highest mountain above sea level."},
    {"contents": '"Nile"\nThe Nile is a major river in northeastern Africa.'},
]


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    return path


def test_bm25_ranks_relevant_passage(corpus):
    retriever = BM25Retriever(corpus)
    hits = retriever.search("highest mountain", topk=2)
    assert hits[0].title == "Mount Everest"
    assert retriever.search("river Germany", topk=1)[0].title == "Berlin"
    assert all(h.score > 0 for h in hits)
    assert retriever.search("the of", topk=3) == []  # only stopwords
    assert len(retriever.search("capital", topk=10)) == 2


def test_bad_corpus(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"contents": "a"}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: invalid JSON"):
        BM25Retriever(bad)
    bad.write_text('{"body": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: passage needs a 'contents' or 'text'"):
        BM25Retriever(bad)


def test_format_and_labels():
    assert format_passages([]) == "No results found."
    assert gold_answers({"target": ["a", "b"]}) == ["a", "b"]
    assert gold_answers("x") == ["x"]
    with pytest.raises(ValueError, match="label must be"):
        gold_answers(3)


async def test_tags_episode(corpus):
    env = SearchEnv(corpus_path=str(corpus), topk=1, format_score=0.2)
    assert env.stop == ["</search>", "</answer>"]
    env.reset(prompt="q", label={"target": ["Paris"]}, metadata={})
    step = await env.step("<think>hm</think><search>capital of France</search>")
    assert step.observation == (
        "\n\n<information>Doc 1(Title: Paris) Paris is the capital and largest city of France.</information>\n\n"
    )
    assert not step.done and step.tool_responses is None
    step = await env.step("I am not sure")
    assert step.observation.startswith("\nInvalid action") and not step.done
    step = await env.step("<search>  </search>")
    assert "empty query" in step.observation
    step = await env.step("<answer>Lyon</answer>")
    assert step.done and step.reward == 0.2  # well formed, wrong
    env.reset(prompt="q", label="Paris", metadata={})
    assert (await env.step("<answer> the paris </answer>")).reward == 1.0


async def test_qwen_format_and_f1(corpus):
    env = SearchEnv(corpus_path=str(corpus), format="qwen", reward="f1")
    env.reset(prompt="q", label="Nile river", metadata={})
    step = await env.step('<tool_call>{"name": "search", "arguments": {"query": "river Africa"}}</tool_call>')
    assert step.tool_responses[0].startswith("Doc 1(Title: Nile) The Nile is a major river")
    step = await env.step("The Nile<|im_end|>")
    # pred [nile], gold [nile, river]: P = 1, R = 1/2, F1 = 2/3
    assert step.done and step.reward == pytest.approx(2 / 3, abs=1e-12)


def test_only_the_qwen_format_offers_the_search_function(corpus):
    # Tags format: no function spec for the chat template (it advertised a <tool_call> search the env never reads).
    assert SearchEnv(corpus_path=str(corpus)).tool_specs == []
    qwen = SearchEnv(corpus_path=str(corpus), format="qwen")
    assert [spec["function"]["name"] for spec in qwen.tool_specs] == ["search"]


def test_bad_options(corpus):
    with pytest.raises(ValueError, match="exactly one of corpus_path and retrieval_url"):
        SearchEnv()
    with pytest.raises(ValueError, match="format must be"):
        SearchEnv(corpus_path=str(corpus), format="xml")
    with pytest.raises(ValueError, match="reward must be"):
        SearchEnv(corpus_path=str(corpus), reward="bleu")


class _Retrieval(BaseHTTPRequestHandler):
    requests = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Retrieval.requests.append(body)
        if body["queries"] == ["boom"]:
            self.send_response(500)
            self.end_headers()
            return
        hits = [{"document": {"contents": '"Doc"\nremote text'}, "score": 1.5}]
        data = json.dumps({"result": [hits]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


async def test_remote_retriever():
    server = HTTPServer(("127.0.0.1", 0), _Retrieval)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/retrieve"
        env = SearchEnv(retrieval_url=url, topk=2)
        env.reset(prompt="q", label="x", metadata={})
        step = await env.step("<search>who</search>")
        assert step.observation == "\n\n<information>Doc 1(Title: Doc) remote text</information>\n\n"
        assert _Retrieval.requests[-1] == {"queries": ["who"], "topk": 2, "return_scores": True}
        assert step.info["num_backend_errors"] == 0
        step = await env.step("<search>boom</search>")  # server error: an observation, not an exception
        assert "Error: retrieval failed (HTTPStatusError)" in step.observation and not step.done
        assert step.info["num_backend_errors"] == 1  # counted: rollout/env_backend_error_samples
    finally:
        server.shutdown()


async def test_a_failed_retrieval_is_counted_in_both_formats(caplog, monkeypatch):
    # The model is shown the error, as the original's example shows it an empty <information> on any retrieval error;
    # it was counted nowhere, so a run training on a dead retrieval server looked like one with a hard corpus.
    server = HTTPServer(("127.0.0.1", 0), _Retrieval)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/retrieve"
        env = SearchEnv(retrieval_url=url, format="qwen")
        env.reset(prompt="q", label="x", metadata={})
        calls = "".join(
            f'<tool_call>{{"name": "search", "arguments": {{"query": "{q}"}}}}</tool_call>' for q in ("boom", "who")
        )
        step = await env.step(calls)
        assert step.tool_responses[0].startswith("Error: tool 'search' failed: HTTPStatusError")
        assert step.tool_responses[1] == "Doc 1(Title: Doc) remote text"
        assert step.info["num_backend_errors"] == 1
        assert "tool search failed" in caplog.text
        with socket.socket() as probe:  # a port nothing listens on: the retrieval server is down
            probe.bind(("127.0.0.1", 0))
            down = f"http://127.0.0.1:{probe.getsockname()[1]}/retrieve"
        env = SearchEnv(retrieval_url=down, format="tags")
        env.reset(prompt="q", label="x", metadata={})
        step = await env.step("<search>who</search>")
        assert step.observation == "\n\n<information>Error: retrieval failed (ConnectError).</information>\n\n"
        assert step.info == {"query": "who", "num_truncated": 0, "num_backend_errors": 1}
        assert env.num_backend_errors == 1
        import asyncio

        async def hang(self, query):
            await asyncio.Event().wait()

        monkeypatch.setattr(SearchEnv, "retrieve", hang)  # past tool_timeout_s: ToolEnv's deadline cancels the search
        env = SearchEnv(retrieval_url=url, format="qwen", tool_timeout_s=0.2)
        env.reset(prompt="q", label="x", metadata={})
        step = await asyncio.wait_for(env.step(calls), 10)
        assert step.tool_responses == ["Error: tool 'search' did not answer within 0.2 s."] * 2
        assert step.info["num_backend_errors"] == 2
    finally:
        server.shutdown()


async def test_concurrent_episodes_index_the_corpus_once(tmp_path, monkeypatch):
    # functools.lru_cache let every concurrent miss build: the first searches of 8 episodes indexed the corpus 8
    # times (one copy per to_thread worker; a Wikipedia corpus is tens of GB each).
    import asyncio
    import time

    from slime_envs import search

    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    builds = []
    real_init = BM25Retriever.__init__

    def slow_init(self, corpus_path):
        builds.append(corpus_path)
        time.sleep(0.3)  # long enough that every episode's search arrives during the build
        real_init(self, corpus_path)

    monkeypatch.setattr(BM25Retriever, "__init__", slow_init)
    envs = [SearchEnv(corpus_path=str(path)) for _ in range(8)]
    results = await asyncio.gather(*(env.retrieve("highest mountain") for env in envs))
    assert len(builds) == 1
    assert all(r[0].title == "Mount Everest" for r in results)
    assert search._cached_bm25(str(path)) is search._cached_bm25(str(path))


@pytest.mark.parametrize(
    "turn",
    [
        "<think>\nThe capital is Paris.\n</think>\n\nParis<|im_end|>",
        "<think>\nmaybe <answer>Lyon</answer>\n</think>\n\nParis<|im_end|>",  # an answer only thought about
        "<think>\nhmm\n</think>\n\n<answer>Paris</answer><|im_end|>",
    ],
)
async def test_qwen_format_scores_the_answer_after_the_thinking(corpus, turn):
    # The thinking was scored with the answer: a Qwen3 thinking model's correct "Paris" without <answer> tags
    # scored 0, and an <answer> written while thinking was taken as the final one.
    env = SearchEnv(corpus_path=str(corpus), format="qwen")
    env.reset(prompt="q", label="Paris", metadata={})
    step = await env.step(turn)
    assert step.done and step.reward == 1.0


async def test_tags_format_bounds_each_search_by_the_envs_deadline_and_cut(corpus, monkeypatch, caplog):
    # tool_timeout_s and max_response_chars held for <tool_call> searches only: in the tags format (Search-R1's) a
    # retriever that never answered held the episode until --plugin-timeout-secs (4 h) failed the whole rollout, and
    # a 10 MB passage became a 10 MB observation, both accepted without a word.
    import asyncio

    from slime_envs import base, search
    from slime_envs.search import Passage

    monkeypatch.setattr(base, "_num_truncated", 0)  # the process's count (the log fires at its powers of two)

    async def retrieve(self, query):
        if query == "hang":
            await asyncio.Event().wait()
        if query == "own":
            raise TimeoutError("upstream")
        return [Passage(title="T", text="y" * 10_000_000)]

    monkeypatch.setattr(search.SearchEnv, "retrieve", retrieve)
    env = SearchEnv(corpus_path=str(corpus), tool_timeout_s=0.2, max_response_chars=50)
    env.reset(prompt="q", label="x", metadata={})
    step = await asyncio.wait_for(env.step("<search>hang</search>"), 10)
    assert step.observation == "\n\n<information>Error: retrieval did not answer within 0.2 s.</information>\n\n"
    assert not step.done and "did not answer within tool_timeout_s=0.2 s" in caplog.text
    step = await env.step("<search>own</search>")
    assert step.observation == "\n\n<information>Error: retrieval failed (TimeoutError).</information>\n\n"
    step = await env.step("<search>big</search>")
    shown = "Doc 1(Title: T) " + "y" * 34
    note = "\n... (tool response truncated: 50 of 10,000,016 characters shown)"
    assert step.observation == f"\n\n<information>{shown}{note}</information>\n\n"
    assert step.info == {"query": "big", "num_truncated": 1, "num_backend_errors": 0}
    assert env.num_backend_errors == 2  # the hang and the retriever's own timeout
    assert "longer than max_response_chars=50 and were cut" in caplog.text
    assert env.num_tool_calls == 3
