"""Serving an agent-format model (its sqlrl_prompt.json says `rollout: agent`): the request's
episodes run the inference tool loop (sqlrl/agent.py) the evaluation runs, each turn's
generation going through the server's own backend (its batching, timeout and error statuses).

The loop is synchronous and runs in a worker thread; `BackendGenerator` hands each turn's
prompts to the event loop, where the backend batches them with other requests. The tool runs
on the request's database (`db_id`); a `ddl` or `schema_str` request has none, so its probes
answer `error: no database for this question` and the model answers from the schema alone.
Each turn has the server's --request-timeout-s.
"""

from __future__ import annotations

import asyncio
import time


class BackendGenerator:
    """The Generator protocol (sqlrl/model/generate.py) over the server's async backend, for
    a loop running in a worker thread: each prompt is one backend request, all of a call's
    sent at once (so the backend can batch them), then waited for."""

    def __init__(self, service, loop: asyncio.AbstractEventLoop, opts: dict):
        self.service = service
        self.loop = loop
        self.opts = opts  # the request's settings (max_new_tokens, ...), settings_for's

    def _complete(self, prompts: list[str], **settings) -> list[list[str]]:
        futures = [
            asyncio.run_coroutine_threadsafe(
                self.service.complete(p, {**self.opts, **settings}), self.loop
            )
            for p in prompts
        ]
        return [future.result() for future in futures]

    def generate(self, prompts: list[str]) -> list[str]:
        return [texts[0] for texts in self._complete(prompts, n=1, temperature=0.0)]

    def sample(self, prompts: list[str], n: int, temperature: float, seed: int) -> list[list[str]]:
        return self._complete(prompts, n=n, temperature=temperature, seed=seed)


def agent_db_path(service, req):
    """The database the tool runs on: the request's `db_id` file where it is present."""
    if req.db_id is None:
        return None
    path = service.prompts.check_db_id(req.db_id, need_file=False)
    return path if path.is_file() else None


def prepare_agent(service, req) -> tuple[dict, list[dict], object, object, int]:
    """(settings, messages in the agent format, the tool's database, the database an execute
    request runs the answer on, prompt tokens of the first turn), checked as a plain
    request's prompt is (the tool's schema included in its length)."""
    from sqlrl.agent import render_agent_prompt, tool_schemas
    from sqlrl.prompt_builder import InputError
    from sqlrl.serve.http_errors import HTTPError

    opts = service.settings_for(req)
    question = service.check_request_text(req)
    try:
        run_path = service.prompts.check_db_id(req.db_id, need_file=True) if req.execute else None
        messages = service.prompts.messages(
            question, schema_str=req.schema_str, db_id=req.db_id, ddl=req.ddl
        )
        tool_path = agent_db_path(service, req)
    except InputError as exc:
        raise HTTPError(exc.status, str(exc), param=exc.param) from None
    first = render_agent_prompt(service.backend.tokenizer, messages, tool_schemas())
    tokens = service.check_prompt_length(first, opts["max_new_tokens"])
    return opts, messages, tool_path, run_path, tokens


async def answer_agent(service, req):
    """A request to an agent model -> Served (sqlrl.serve.service): the episodes (n samples,
    greedy for one), their final answers through the shared answer path (extraction, repair,
    execution, vote), and the chosen episode's trace on the answer."""
    from sqlrl.agent import AgentLoop
    from sqlrl.answer import answer_from
    from sqlrl.serve.service import Served

    opts, messages, tool_path, run_path, tokens = await service.off_loop(
        prepare_agent, service, req
    )
    generator = BackendGenerator(service, asyncio.get_running_loop(), opts)
    loop = AgentLoop(generator, service.backend.tokenizer, service.settings.answer_format)
    t0 = time.perf_counter()
    [episodes] = await asyncio.to_thread(
        loop.run,
        [messages],
        [str(tool_path) if tool_path else None],
        n=opts["n"],
        temperature=opts["temperature"],
        seed=opts["seed"],
    )
    gen_s = time.perf_counter() - t0
    texts = [episode.answer or "" for episode in episodes]
    sqls, extracted = await service.off_loop(service.sqls_for, req, texts)
    verdicts = None
    if run_path is not None:
        verdicts = await asyncio.to_thread(service.execute_all, run_path, sqls, opts["max_rows"])
    answer = answer_from(texts, sqls, verdicts, extracted=extracted)
    answer.trace = episodes[answer.chosen].trace(answer.sql)
    return Served(answer, texts, tokens, gen_s, opts)
