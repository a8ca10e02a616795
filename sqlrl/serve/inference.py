"""The server's thin adapter over the model's answer format (sqlrl/formats/): a request is
prepared (off the event loop), asked through the format's inference loop, and its answers go
through the answer path evaluation and TextToSQL share (sqlrl.answer).

Each format's loop answers a request its own way (`ask_async`): a plain format's one
generation is one backend request, awaited on the event loop, where the backend batches it
with other requests; the agent's tool loop is synchronous and runs in a worker thread, where
`BackendGenerator` hands each turn's prompts to the event loop, so its turns are batched the
same way. Either way a generation has the server's --request-timeout-s and its error statuses
(Service.complete). The tool runs on the request's database (`db_id`); a `ddl` or
`schema_str` request has none, so an agent's probes answer `error: no database for this
question` and the model answers from the schema alone.

A constrained request (`constrained`, or the server's --constrained; the `sql` format only)
gets its schema's grammar while it is prepared, and every generation of it carries it (the
settings' `grammar`, Service.complete).
"""

from __future__ import annotations

import asyncio
import time


class BackendGenerator:
    """The Generator protocol (sqlrl/model/generate.py) over the server's async backend:
    `generate`/`sample` for a loop running in a worker thread (each prompt is one backend
    request, all of a call's sent at once so the backend can batch them, then waited for), and
    `acomplete` for a loop on the event loop."""

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

    async def acomplete(self, prompt: str, n: int, temperature: float, seed: int) -> list[str]:
        """One prompt's n completions at `temperature` (0: greedy), on the event loop."""
        settings = {**self.opts, "n": n, "temperature": temperature, "seed": seed}
        return await self.service.complete(prompt, settings)


def tool_db_path(service, req):
    """The database a tool loop runs on: the request's `db_id` file where it is present."""
    if req.db_id is None or req.db_id in service.prompts.live:  # a live one has no file
        return None
    path = service.prompts.check_db_id(req.db_id, need_file=False)
    return path if path.is_file() else None


def prepare_request(service, req, inference) -> tuple[dict, list[dict], str, object, object, int]:
    """(settings, messages in the model's format, the first prompt's text, the tool's
    database, the database an execute request runs the answer on, that prompt's tokens):
    the CPU work (DDL parsing, rendering, tokenization) kept off the event loop, the prompt's
    length checked as the format renders it (an agent's with the tool's schema)."""
    from sqlrl.request_input import InputError
    from sqlrl.serve.http_errors import HTTPError

    opts = service.settings_for(req)
    question = service.check_request_text(req)
    try:
        run_path = service.prompts.check_db_id(req.db_id, need_file=True) if req.execute else None
        messages = service.prompts.messages(
            question, schema_str=req.schema_str, db_id=req.db_id, ddl=req.ddl
        )
        tool_path = tool_db_path(service, req)
    except InputError as exc:
        raise HTTPError(exc.status, str(exc), param=exc.param) from None
    prompt = inference.first_prompt(messages)
    tokens = service.check_prompt_length(prompt, opts["max_new_tokens"])
    if opts["constrained"]:  # compiled here, off the loop (once per database and process)
        opts["grammar"], opts["unconstrained_reason"] = service.grammar_for_request(req)
    return opts, messages, prompt, tool_path, run_path, tokens


def live_info(service, req) -> dict | None:
    """A live database's dialect and the tables its prompt kept (and why); None otherwise."""
    import unicodedata

    question = unicodedata.normalize("NFC", req.question).strip()  # as check_request_text
    choice = service.prompts.table_choice(req.db_id, question)
    if choice is None:
        return None
    tables = {"kept": list(choice.kept), "dropped": list(choice.dropped)}
    if choice.why:
        tables["why"] = choice.why
    return {"dialect": service.prompts.live[req.db_id].dialect, "tables": tables}


async def answer_request(service, req):
    """A request -> (Answer, texts, prompt tokens, generation seconds, settings): the
    format's samples (n, greedy for one unless a temperature is asked), their SQL through
    the shared answer path (extraction, repair, execution, vote), and a tool loop's chosen
    episode's trace on the answer."""
    from sqlrl.answer import answer_from
    from sqlrl.data.prompts import render_prompt

    tokenizer = service.backend.tokenizer
    generator = BackendGenerator(service, asyncio.get_running_loop(), {})
    inference = service.format.inference_loop(
        generator,
        render=lambda messages: render_prompt(tokenizer, messages),
        tokenizer=tokenizer,
        answer_format=service.settings.answer_format,
    )
    opts, messages, prompt, tool_path, run_path, tokens = await service.off_loop(
        prepare_request, service, req, inference
    )
    generator.opts = opts
    t0 = time.perf_counter()
    asked = await inference.ask_async(
        messages,
        str(tool_path) if tool_path else None,
        prompt=prompt,
        n=opts["n"],
        temperature=opts["temperature"],
        seed=opts["seed"],
    )
    gen_s = time.perf_counter() - t0
    texts = asked.texts
    sqls, extracted = await service.off_loop(service.sqls_for, req, texts)
    verdicts = None
    if run_path is not None:
        verdicts = await asyncio.to_thread(service.execute_all, run_path, sqls, opts["max_rows"])
    answer = answer_from(texts, sqls, verdicts, extracted=extracted)
    answer.trace = asked.trace(answer.chosen, answer.sql)  # a tool loop's; else None
    live = await service.off_loop(live_info, service, req)
    return answer, texts, tokens, gen_s, opts, live
